"""The checks every transformers task gets (tests/test_hf_*.py, test_llm.py, test_sft.py): an in-process
run; 4 accumulated micro-batches equal one big batch, with the control that per-micro-batch means would not;
2 gloo ranks equal 1 rank; a SIGKILL mid-run then --resume gives the same weights and log, bit for bit. And those
of the tasks that own their step and sample their own completions (test_grpo.py, test_distill.py): 3 steps
accumulated equal 3 of one batch, and 2 ranks of half the batch 1 rank; the start-up check's step counts for
nothing."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import kill_and_resume, launch, max_abs_diff, read_metrics, read_summary

from anytrain import load_model
from anytrain.config import parse_config
from anytrain.trainer import train

TOL = 2e-5  # weights after 8 AdamW steps: float32 sums in another order (tests/test_hf.py says why)
STEPS = ("--max-steps", "8", "--log-every-steps", "1")


def in_process(run_dir, *flags: str) -> dict:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    try:
        return train(parse_config([*flags, "--no-progress", "--no-plot", "--output-dir", str(run_dir)]))
    finally:
        AcceleratorState._reset_state(True)


def big_batch(args: list[str], run_dir) -> tuple[dict, object]:
    """1 process x batch 16, 8 steps: the reference for 4 accumulated x 4 and for 2 ranks x 8."""
    return in_process(run_dir, *args, "--batch-size", "16", *STEPS), run_dir


def check_accumulation(args: list[str], reference, tmp_path, monkeypatch, task_class=None) -> tuple[float, float]:
    """4 x 4 accumulated equals 1 x 16 (weights, every logged loss); for a token-weighted task (task_class),
    without its step shares (each micro-batch a mean over its own tokens) it does not. Returns (difference,
    the control's difference, or None)."""
    one, one_dir = reference
    flags = ("--batch-size", "4", "--grad-accum-steps", "4", *STEPS)
    accum = in_process(tmp_path / "accum", *args, *flags)
    assert accum["optimizer_steps"] == one["optimizer_steps"] == 8
    diff = max_abs_diff(load_model(tmp_path / "accum").state_dict(), load_model(one_dir).state_dict())
    assert diff < TOL, diff
    losses = [[m["loss"] for m in read_metrics(d) if m["kind"] == "train"] for d in (tmp_path / "accum", one_dir)]
    assert losses[0] == pytest.approx(losses[1], rel=2e-6)  # float32 sums in another order
    if task_class is None:  # a mean per sample: equal micro-batches already make the big batch's mean
        print(f"weights vs one batch of 16: 4 x 4 {diff:.2e}")
        return diff, None
    monkeypatch.setattr(task_class, "step_shares", False)  # no share: each micro-batch its own mean
    in_process(tmp_path / "plain", *args, *flags)
    plain = max_abs_diff(load_model(tmp_path / "plain").state_dict(), load_model(one_dir).state_dict())
    assert plain > 20 * TOL and plain > 100 * diff, (plain, diff)
    print(f"weights vs one batch of 16: token-weighted 4 x 4 {diff:.2e}, per-micro-batch means {plain:.2e}")
    return diff, plain


def check_two_ranks(args: list[str], reference, tmp_path) -> dict:
    one, one_dir = reference
    result = launch("multi_cpu.yaml", *args, "--batch-size", "8", *STEPS, "--output-dir", str(tmp_path / "two"))
    assert result.returncode == 0, result.stderr[-3000:]
    two = read_summary(tmp_path / "two")
    assert two["scenario"]["num_processes"] == 2 and len(set(two["weights_sha256_per_rank"])) == 1
    diff = max_abs_diff(load_model(tmp_path / "two").state_dict(), load_model(one_dir).state_dict())
    assert diff < TOL, diff
    assert two["val_loss"] == pytest.approx(one["val_loss"], abs=TOL)
    print(f"weights, 2 ranks x 8 vs 1 x 16: {diff:.2e}")
    return two


def check_kill_and_resume(args: list[str], tmp_path, name: str) -> None:
    """80 steps of batch 8 x 2 with a checkpoint every 4: the SIGKILL lands mid-run, between checkpoints."""
    kill_step = random.Random(name).randint(8, 25)
    flags = (
        "--batch-size 8 --grad-accum-steps 2 --max-steps 80 --epochs 20 --checkpoint-every-steps 4 --log-every-steps 1"
    )
    kill_and_resume(tmp_path, [*args, *flags.split(), "--no-progress"], kill_step, env={"OMP_NUM_THREADS": "1"})
    ref, res = load_model(tmp_path / "reference").state_dict(), load_model(tmp_path / "victim").state_dict()
    assert all(torch.equal(ref[k], res[k]) for k in ref), "weights differ"
    assert [(m["step"], m["loss"]) for m in read_metrics(tmp_path / "reference")] == [
        (m["step"], m["loss"]) for m in read_metrics(tmp_path / "victim")
    ]
    assert read_summary(tmp_path / "victim")["resumed_from"] is not None
    assert (tmp_path / "victim" / "hf" / "model.safetensors").is_file()


def check_accumulated_steps(args: list[str], accumulated: list[str], tmp_path, **tolerance) -> None:
    """3 steps of one batch and the same 3 steps in the micro-batches `accumulated` gives: the same weights (1e-6) and
    logged losses (pytest.approx's `tolerance`)."""
    one = in_process(tmp_path / "one", *args, "--max-steps", "3")
    accum = in_process(tmp_path / "accum", *args, "--max-steps", "3", *accumulated)
    assert one["optimizer_steps"] == accum["optimizer_steps"] == 3
    diff = max_abs_diff(load_model(tmp_path / "one").state_dict(), load_model(tmp_path / "accum").state_dict())
    assert diff < 1e-6, diff
    losses = [[m["loss"] for m in read_metrics(tmp_path / d) if m["kind"] == "train"] for d in ("one", "accum")]
    assert losses[0] == pytest.approx(losses[1], **tolerance)


def check_two_ranks_of_half_the_batch(args: list[str], half: list[str], tmp_path, figures, **tolerance) -> None:
    """3 steps on 1 process (`args`), and launched on 2 gloo ranks each of half its batch (`half`'s flags added): the
    same weights (1e-6) and training `figures` (pytest.approx's `tolerance`)."""
    one = in_process(tmp_path / "one", *args, "--max-steps", "3")
    done = launch("multi_cpu.yaml", *args, "--max-steps", "3", *half, "--output-dir", str(tmp_path / "two"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert read_summary(tmp_path / "two")["scenario"]["num_processes"] == 2 and one["optimizer_steps"] == 3
    diff = max_abs_diff(load_model(tmp_path / "one").state_dict(), load_model(tmp_path / "two").state_dict())
    assert diff < 1e-6, diff
    lines = [[m for m in read_metrics(tmp_path / d) if m["kind"] == "train"] for d in ("one", "two")]
    for name in figures:
        assert [m[name] for m in lines[0]] == pytest.approx([m[name] for m in lines[1]], **tolerance), name


def check_start_up_check_forgotten(args: list[str], tmp_path, monkeypatch, name: str) -> None:
    """A task that owns its step: the start-up check runs it once (on the first training rows) and the task forgets
    it (after_check): the weights, every logged figure but the times and the completions table equal those of the
    same run without the check."""
    from anytrain import trainer

    called = []
    original = trainer.check_step
    monkeypatch.setattr(trainer, "check_step", lambda task, ctx: called.append(task.name) or original(task, ctx))
    in_process(tmp_path / "checked", *args)
    monkeypatch.setattr(trainer, "check_step", lambda task, ctx: None)
    in_process(tmp_path / "unchecked", *args)
    assert called == [name]
    runs = [tmp_path / "checked", tmp_path / "unchecked"]
    assert max_abs_diff(*(load_model(run).state_dict() for run in runs)) == 0.0
    drop = ("seconds", "samples_per_s", "tokens_per_s", "generating", "mfu", "achieved_tflops", "elapsed")
    rows = [[{k: v for k, v in m.items() if k not in drop and not k.startswith("time_")} for m in read_metrics(run)]
            for run in runs]  # fmt: skip
    assert rows[0] == rows[1] and len(rows[0]) >= 2
    assert (runs[0] / "completions.jsonl").read_text() == (runs[1] / "completions.jsonl").read_text()


def loss_and_grads(model, inputs: dict, targets: torch.Tensor) -> tuple[float, int, dict]:
    """The summed next-token cross-entropy over the targets, their count, and the gradients of their mean."""
    model.zero_grad()
    logits, labels = model(**inputs).logits[:, :-1].float(), targets[:, 1:]
    total = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="sum")
    count = int((labels != -100).sum())
    (total / count).backward()
    return total.item(), count, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def target_runs(tokenizer, ids: list[int], labels: list[int]) -> list[str]:
    """The decoded runs of a row's target tokens (each label is its token or IGNORE)."""
    from anytrain.shape import IGNORE

    runs, current = [], []
    for token, label in zip(ids, labels):
        assert label in (token, IGNORE)
        if label != IGNORE:
            current.append(token)
        elif current:
            runs, current = [*runs, current], []
    return [tokenizer.decode(run) for run in [*runs, current] if run]
