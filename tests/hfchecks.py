"""The checks every transformers task gets (tests/test_hf_*.py, test_llm.py, test_sft.py): an in-process
run; 4 accumulated micro-batches equal one big batch, with the control that per-micro-batch means would not;
2 gloo ranks equal 1 rank; a SIGKILL mid-run then --resume gives the same weights and log, bit for bit."""

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
