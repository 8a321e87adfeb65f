"""--task distill (TRL 1.16's DistillationTrainer, issue: on-policy distillation) on the tests' tiny chat Llama, taught
by a wider one (96 wide, seed 1; the same tokenizer and vocabulary).

The chunked divergence (tasks/causal_lm/divergence.py), with chunks of 5 tokens forced: its values, the student's
entropy and every gradient equal those of the formula on the full logits (beta 0, 0.5, 1, temperature 0.7), also
under bf16 autocast to its rounding; no tensor holds either model's logits of the batch, only a chunk's; a model whose
logits the model itself rescales (Gemma 2's soft-capping) takes both models' own full logits, and the result is the
formula on them (the chunked projection, the control, is not). Bad input is one line each (no teacher, one that is
not a causal LM, another tokenizer, another vocabulary, --beta outside [0, 1], no prompt column), and --task auto on
prompts stays grpo. A run learns (its divergence falls), says its figures and its completions table, evaluates by
its divergence, samples, trains LoRA adapters; its start-up check counts for nothing; 4 accumulated micro-batches
equal one batch; 2 ranks equal 1 and a SIGKILLed run resumes bit for bit (launched). The formula itself, step by
step: tests/conformance/test_conformance_distill.py."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import random

import pytest
import torch
from conftest import kill_and_resume, read_metrics, read_summary, run_cli_error
from hfchecks import (
    check_accumulated_steps,
    check_start_up_check_forgotten,
    check_two_ranks_of_half_the_batch,
    in_process,
)
from hfmodels import tiny_bert_mlm, tiny_gpt2, tiny_llama
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from zoo import tiny_causal_lm

from anytrain.tasks.causal_lm import head as lmhead
from anytrain.tasks.causal_lm.divergence import DivergenceRequest, full_logits, teacher_at
from anytrain.tasks.causal_lm.generation import Completions, positions_of

transformers = pytest.importorskip("transformers")
CHUNK, NEW = 5, 7  # tokens a chunk (forced), completion tokens a row


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    rng = random.Random(0)
    rows = [{"prompt": [{"role": "user", "content": f"{rng.randint(0, 99)} + {rng.randint(0, 9)} ="}]}
            for _ in range(40)]  # fmt: skip
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"root": root, "student": tiny_llama(root / "student"), "data": root / "prompts.jsonl",
            "teacher": tiny_llama(root / "teacher", seed=1, width=96)}  # fmt: skip


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def models(request, folders, tmp_path_factory):
    """The student as anytrain trains it (its fused head) and the teacher, in float32: the Llamas (the teacher 96
    wide), or two GPT-2s (the output layer tied to the embedding)."""
    load = transformers.AutoModelForCausalLM.from_pretrained
    if request.param == "llama":
        student, teacher = load(folders["student"]), load(folders["teacher"])
    else:
        root = tmp_path_factory.mktemp("distill_gpt2")
        student, teacher = load(tiny_gpt2(root / "student")), load(tiny_gpt2(root / "teacher", seed=1))
        assert student.lm_head.weight is student.transformer.wte.weight
    student.config.use_cache = teacher.config.use_cache = False
    return lmhead.head_of(student)[0], teacher.eval()


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(lmhead, "CHUNK_ELEMENTS", 0)
    monkeypatch.setattr(lmhead, "MIN_CHUNK", CHUNK)


def rows_of(vocabulary: int, seed: int = 0) -> Completions:
    """4 prompts of 6, 4, 6 and 3 random tokens padded on the left; completions of 7, 3 (then padding), 7 and 5."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocabulary, (4, 6 + NEW), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2], mask[3, :3] = 0, 0
    completion = torch.ones(4, NEW, dtype=torch.bool)
    completion[1, 3:], completion[3, 5:] = False, False
    mask[:, 6:] = completion.long()
    return Completions(ids.masked_fill(mask == 0, 0), mask, positions_of(mask), completion, ~completion.all(1), 6)


def trl_divergence(student_logits, teacher_logits, beta: float, temperature: float) -> torch.Tensor:
    """TRL's generalized_jsd_loss (trl/experimental/gkd/gkd_trainer.py) per token, reduction "none" summed over the
    vocabulary, with F.kl_div as TRL writes it."""
    s = F.log_softmax(student_logits / temperature, -1)
    t = F.log_softmax(teacher_logits / temperature, -1)
    if beta == 0:
        return F.kl_div(s, t, reduction="none", log_target=True).sum(-1)
    if beta == 1:
        return F.kl_div(t, s, reduction="none", log_target=True).sum(-1)
    b = torch.tensor(beta, dtype=s.dtype)
    m = torch.logsumexp(torch.stack([s + torch.log1p(-b), t + torch.log(b)]), 0)
    kl_t = F.kl_div(m, t, reduction="none", log_target=True).sum(-1)
    kl_s = F.kl_div(m, s, reduction="none", log_target=True).sum(-1)
    return beta * kl_t + (1 - beta) * kl_s


def inputs_of(rows: Completions) -> dict:
    return {"input_ids": rows.ids, "attention_mask": rows.mask, "position_ids": rows.positions}


def by_formula(student, teacher, rows: Completions, beta: float, temperature: float):
    """(per-token divergence, entropy) from both models' full logits at the completion tokens (in float32, as TRL
    takes them: its chunked kernel projects in float32)."""
    at = slice(rows.width - 1, rows.width - 1 + NEW)
    s = student(**inputs_of(rows)).logits[:, at][rows.completion].float()
    with torch.no_grad():
        t = teacher(**inputs_of(rows)).logits[:, at][rows.completion].float()
    p = (s / temperature).log_softmax(-1)
    return trl_divergence(s, t, beta, temperature), -(p.exp() * p).sum(-1)


def chunked(head, teacher, rows: Completions, beta: float, temperature: float, full: bool = False):
    """The student's pass as distill runs it (a DivergenceRequest to its head) against the teacher's side."""
    side = teacher_at(teacher, inputs_of(rows), rows.width - 1, rows.completion, full)
    return head(DivergenceRequest(inputs_of(rows), rows.width - 1, rows.completion, side, beta, temperature))


def grads_of(model, loss: torch.Tensor) -> dict:
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# --------------------------------------------------------------------------- the chunked divergence


@pytest.mark.parametrize(("beta", "temperature"), [(0.0, 1.0), (0.5, 0.7), (1.0, 0.7)])
def test_the_chunked_divergence_and_its_gradients_are_the_full_logits_ones(models, small_chunks, beta, temperature):
    head, teacher = models
    rows = rows_of(head.config.vocab_size)
    found = chunked(head, teacher, rows, beta, temperature)
    ours = grads_of(head, found.divergence.sum() / len(found.divergence))
    expected, entropy = by_formula(head.wrapped, teacher, rows, beta, temperature)
    theirs = grads_of(head.wrapped, expected.sum() / len(expected))
    diff = max((ours[n] - theirs[n]).abs().max().item() / theirs[n].abs().max().item() for n in theirs)
    print(f"beta {beta}, T {temperature}: divergence {expected.mean():.6f}, gradients within {diff:.1e} (relative)")
    assert len(found.divergence) == int(rows.completion.sum()) == 22  # 22 tokens: 5 chunks, the last of 2
    assert all(g.abs().sum() > 0 for n, g in ours.items() if "lm_head" in n or "wte" in n)
    assert torch.allclose(found.divergence, expected, rtol=1e-5, atol=1e-7)
    assert torch.allclose(found.entropy, entropy.detach(), rtol=1e-5) and not found.entropy.requires_grad
    assert ours.keys() == theirs.keys() and diff < 1e-4


def test_the_divergence_and_its_gradients_are_trls_own_function_on_the_same_hidden_states(models, small_chunks):
    """TRL 1.16's own _chunked_divergence_loss (trl/trainer/distillation_trainer.py, its ChunkedDivergenceFunction's
    torch path on a CPU) given the same hidden states: the same mean divergence, entropy and gradients."""
    trl = pytest.importorskip("trl.trainer.distillation_trainer")
    head, teacher = models
    lm, rows = head.wrapped, rows_of(head.config.vocab_size, seed=4)
    at = slice(rows.width - 1, rows.width - 1 + NEW)

    def hidden(model):
        return getattr(model, model.base_model_prefix)(**inputs_of(rows)).last_hidden_state[:, at]

    for beta in (0.0, 0.5, 1.0):
        found = chunked(head, teacher, rows, beta, 0.7)
        ours = grads_of(head, found.divergence.sum() / len(found.divergence))
        with torch.no_grad():
            taught = hidden(teacher)
        loss, entropy, count = trl._chunked_divergence_loss(
            hidden(lm), taught, lm.get_output_embeddings().weight, teacher.get_output_embeddings().weight,
            rows.completion.long(), beta, temperature=0.7,
        )  # fmt: skip
        theirs = grads_of(lm, loss)
        diff = max((ours[n] - theirs[n]).abs().max().item() / theirs[n].abs().max().item() for n in theirs)
        mean = found.divergence.mean().item()
        print(f"beta {beta}: TRL's loss {loss.item():.7f}, ours {mean:.7f}; gradients within {diff:.1e}")
        assert int(count) == len(found.divergence) and loss.item() == pytest.approx(mean, rel=1e-5)
        assert entropy.item() == pytest.approx(found.entropy.sum().item(), rel=1e-5) and diff < 1e-4


def test_under_bf16_autocast_it_is_the_full_logits_one_to_its_rounding(models, small_chunks):
    head, teacher = models
    rows = rows_of(head.config.vocab_size, seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        found = chunked(head, teacher, rows, 0.5, 1.0)
        ours = grads_of(head, found.divergence.sum())
        expected, _ = by_formula(head.wrapped, teacher, rows, 0.5, 1.0)
        theirs = grads_of(head.wrapped, expected.sum())
    scale = max(g.abs().max().item() for g in theirs.values())
    diff = max((ours[n] - theirs[n]).abs().max().item() for n in theirs)
    print(f"bf16: divergence {found.divergence.sum():.4f} vs {expected.sum():.4f}; gradients within {diff:.1e}")
    assert found.divergence.sum().item() == pytest.approx(expected.sum().item(), rel=5e-2) and diff < 0.1 * scale


def test_no_tensor_holds_either_models_logits_of_the_batch(models, small_chunks):
    head, teacher = models
    vocabulary, rows = head.config.vocab_size, rows_of(head.config.vocab_size, seed=2)
    weights = {m.config.hidden_size * vocabulary for m in (head, teacher)}  # the output layers' (transposed) weights

    class Largest(TorchDispatchMode):
        most = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == vocabulary and t.numel() not in weights:
                    Largest.most = max(Largest.most, t.numel())
            return out

    with Largest():
        chunked(head, teacher, rows, 0.5, 1.0).divergence.sum().backward()
    assert Largest.most == CHUNK * vocabulary  # one chunk's, of 22 tokens' (and 52 positions')
    Largest.most = 0
    with Largest():
        by_formula(head.wrapped, teacher, rows, 0.5, 1.0)[0].sum().backward()
    assert Largest.most >= 4 * (6 + NEW) * vocabulary  # the control: the full logits


def test_rescaled_logits_take_both_models_own_full_logits(small_chunks):
    student, teacher = tiny_causal_lm("gemma2", seed=0), tiny_causal_lm("gemma2", seed=1)
    for model in (student, teacher):  # a cap its small random logits feel (Gemma 2's own is 30)
        model.config.final_logit_softcapping = 0.05
    head = lmhead.head_of(copy.deepcopy(student))[0]
    assert full_logits(head.causal_lm, teacher) == "the student: its logits are rescaled (final_logit_softcapping)"
    rows = rows_of(student.config.vocab_size, seed=3)
    found = chunked(head, teacher, rows, 0.5, 0.7, full=True)
    ours = grads_of(head, found.divergence.sum())
    expected, _ = by_formula(student, teacher, rows, 0.5, 0.7)  # the models' own, soft-capped logits
    theirs = grads_of(student, expected.sum())
    assert torch.allclose(found.divergence, expected, rtol=1e-5, atol=1e-7)
    assert max((ours[n] - theirs[n]).abs().max().item() for n in theirs) < 1e-6
    with torch.no_grad():
        projected = chunked(head, teacher, rows, 0.5, 0.7).divergence  # the control: no soft-capping
    assert (projected - expected).abs().max() > 0.1 * expected.abs().max()


# --------------------------------------------------------------------------- what a run is refused


def args(folders, *flags: str) -> list[str]:
    return [
        "--task", "distill", "--model", f"hf:{folders['student']}", "--teacher", f"hf:{folders['teacher']}",
        "--dataset", str(folders["data"]), "--max-new-tokens", "6", "--batch-size", "4", "--lr", "3e-3",
        "--log-every-steps", "1", "--eval-every-steps", "0", "--seed", "3", *flags,
    ]  # fmt: skip


def test_bad_input_is_one_line_each(folders, capsys, tmp_path):
    root, out = folders["root"], ["--output-dir", str(tmp_path / "r")]
    plain = args(folders)[:2] + args(folders)[2:4] + args(folders)[6:8] + out  # no --teacher
    bert, gpt2 = tiny_bert_mlm(tmp_path / "bert"), tiny_gpt2(tmp_path / "gpt2")
    wide = tiny_llama(tmp_path / "wide", seed=2)
    config = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 8}))
    teacher = args(folders).index("--teacher") + 1
    capsys.readouterr()  # the models' saving bars
    cases = [
        (plain, "--teacher is required by --task distill"),
        ([*args(folders), "--beta", "1.5", *out], "--beta must be in [0, 1], got 1.5"),
        ([*args(folders), "--beta", "-0.1", *out], "--beta must be in [0, 1], got -0.1"),
        ([*args(folders), "--min-p", "2", *out], "--min-p must be in [0, 1], got 2.0"),
        ([*args(folders), "--repetition-penalty", "-1", *out], "--repetition-penalty must be positive, got -1.0"),
        ([*args(folders), "--teacher", str(folders["teacher"]), *out], "the teacher is a transformers causal LM"),
        ([*args(folders), "--teacher", f"hf:{bert}", *out], "--teacher hf:"),
        ([*args(folders), "--teacher", f"hf:{gpt2}", *out], "its tokenizer is not the student's (400 tokens"),
        (
            [*args(folders), "--teacher", f"hf:{wide}", *out],
            "its vocabulary has 410 tokens (vocab_size), the student's",
        ),
    ]
    for argv, said in cases:
        assert said in run_cli_error(capsys, argv), argv
    assert args(folders)[teacher] == f"hf:{folders['teacher']}"
    err = run_cli_error(capsys, [*args(folders), "--teacher", f"hf:{bert}", *out])
    assert err.endswith("BertForMaskedLM is not a causal LM (is_decoder=False: bidirectional attention, each token "
                        "would see the tokens it is trained to predict), so it does not fit --task distill; give a "
                        "decoder (GPT-2, Llama, Qwen, ...), or train this encoder with --task mlm, classify, tag or "
                        "reward") and f"error: --teacher hf:{bert}: Bert" in err  # fmt: skip
    no_prompt = root / "qa.jsonl"
    no_prompt.write_text(json.dumps({"question": "1 + 1", "answer": "2"}) + "\n")
    err = run_cli_error(capsys, [*args(folders), "--dataset", str(no_prompt), *out])
    assert "--task distill: " in err and "has no 'prompt' column (columns: question, answer)" in err
    auto = ["--model", f"hf:{folders['student']}", "--dataset", str(folders["data"]), *out]
    assert "--reward: --task grpo needs at least one reward function" in run_cli_error(capsys, auto)  # auto: grpo
    assert not (tmp_path / "r").exists()


ENVIRONMENT = '''
class Adder:
    """One completion's world, reset with its row: the tools are its methods; no get_reward (distill has none)."""

    def reset(self, prompt, answer, **row):
        return " Use the add tool."

    def add(self, a: int, b: int) -> int:
        """Add two whole numbers.

        Args:
            a: the first number
            b: the second number
        """
        return a + b
'''


def test_an_environments_tools_are_called_and_said(tmp_path_factory, tmp_path, monkeypatch):
    """--environment (one instance per completion, its reset's text added to the prompt, its methods the tools) and
    --max-tool-calls: the first turns scripted (tests/tooldata.py), the tools answered, the figures and the table
    say the calls, the start-up line the limit; a completion's length is its own tokens."""
    from tooldata import scripted, write_sums

    root = tmp_path_factory.mktemp("distill_env")
    (root / "env.py").write_text(ENVIRONMENT)
    write_sums(root / "data", train=6, held_out=1)
    student, teacher = tiny_llama(root / "student", tools=True), tiny_llama(root / "teacher", seed=1, tools=True)
    seen = scripted(monkeypatch, transformers.AutoTokenizer.from_pretrained(student))
    flags = ["--task", "distill", "--model", f"hf:{student}", "--teacher", f"hf:{teacher}", "--dataset",
             str(root / "data"), "--environment", f"{root / 'env.py'}:Adder", "--max-tool-calls", "1",
             "--max-new-tokens", "100", "--batch-size", "6", "--max-steps", "1", "--log-every-steps", "1"]  # fmt: skip
    with contextlib.redirect_stdout(printed := io.StringIO()):
        in_process(tmp_path / "run", *flags)
    assert "anytrain: tools: at most 1 call per completion (--max-tool-calls; TRL: no limit)\n" in printed.getvalue()
    line = [m for m in read_metrics(tmp_path / "run") if m["kind"] == "train"][0]
    assert all("Use the add tool." in turn["prompt"] for turn in seen)  # reset's text in every prompt
    assert line["tool_calls"] > 0 and line["turns"] >= 1 and 0 < line["completion_length"] <= 100
    rows = [json.loads(row) for row in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert any("[call " in row["completion"] and " -> " in row["completion"] for row in rows)
    assert all(row["length"] <= 100 for row in rows)


def test_the_rollouts_sampling_flags_reach_the_students_generate(folders, tmp_path, monkeypatch):
    """--top-k, --min-p, --repetition-penalty (and --top-p, --temperature) are the rollout engine's, as grpo's: the
    student's every sampled generate call gets them; its greedy answers (none here) would not."""
    from anytrain.tasks.causal_lm import rollout

    calls, real = [], rollout.generate

    def recorded(model, prompts, keys, sampling, chunk=0, shared=None):
        calls.append((keys is not None, sampling))
        return real(model, prompts, keys, sampling, chunk, shared)

    monkeypatch.setattr(rollout, "generate", recorded)
    flags = ["--top-k", "3", "--min-p", "0.1", "--repetition-penalty", "1.2", "--top-p", "0.9", "--temperature", "0.8"]
    in_process(tmp_path / "run", *args(folders, "--max-steps", "1", *flags))
    sampled = {(s.top_k, s.min_p, s.repetition_penalty, s.top_p, s.temperature) for keyed, s in calls if keyed}
    assert sampled == {(3, 0.1, 1.2, 0.9, 0.8)} and len(calls) >= 2  # the start-up check's, the step's, evaluation's


# --------------------------------------------------------------------------- it learns; it is exact


@pytest.fixture(scope="module")
def learnt(folders, tmp_path_factory):
    """A run of 12 steps, its summary, its folder and what it printed."""
    run, printed = tmp_path_factory.mktemp("learnt") / "run", io.StringIO()
    with contextlib.redirect_stdout(printed):
        summary = in_process(run, *args(folders, "--max-steps", "12", "--lr", "1e-2", "--eval-every-steps", "6"))
    return summary, run, printed.getvalue()


FIGURES = ("divergence", "entropy", "completion_length", "completion_length_max", "truncated", "generating",
           "time_generate", "time_tools", "time_teacher")  # fmt: skip


def test_the_student_comes_closer_to_its_teacher_and_every_figure_is_said(learnt, folders):
    summary, run, printed = learnt
    train = [m for m in read_metrics(run) if m["kind"] == "train"]
    first, last = (sum(m["loss"] for m in part) / 3 for part in (train[:3], train[-3:]))
    print(f"divergence per token over the first 3 steps {first:.4f}, the last 3 {last:.4f}")
    assert len(train) == 12 and last < 0.6 * first  # measured 0.028 -> 0.013
    for line in train:
        assert set(FIGURES) <= line.keys() and line["loss"] == pytest.approx(line["divergence"], rel=1e-5)
        assert 0 < line["completion_length"] <= 6 and 0 < line["entropy"] < math.log(402) + 1e-6
    assert train[-1]["time_teacher"] > 0 and train[-1]["time_tools"] == 0 and 0 < train[-1]["generating"] < 1
    assert summary["val_loss"] < first and summary["teacher"] == f"hf:{folders['teacher']}"
    assert (summary["beta"], summary["temperature"], summary["divergence_from"]) == (1.0, 1.0, "chunks")
    assert (
        f"anytrain: distill: the teacher hf:{folders['teacher']}; 4 prompts per process and step, answered once at "
        "its first micro-batch, 4 per micro-batch; loss: beta 1, the reverse KL(student || teacher), at temperature 1 "
        "over the whole vocabulary, per completion token of the step, from the output layers' chunks (no full "
        "logits); prompts: each distinct prompt read once per group"
    ) in printed


def test_evaluation_is_the_divergence_and_the_best_weights_the_lowest(learnt):
    summary, run, printed = learnt
    evals = [m for m in read_metrics(run) if m["kind"] == "eval"]
    steps = [("validation", 6), ("validation", 7), ("validation", 12), ("test", 12)]  # each 6, an epoch's end (7)
    assert [(m["split"], m["step"]) for m in evals] == steps
    assert all(sorted(m) == ["epoch", "kind", "loss", "split", "step"] for m in evals)
    best = min(evals[:-1], key=lambda m: (m["loss"], m["step"]))
    assert (summary["best_metric"], summary["best_val_loss"], summary["final_weights_step"]) == (
        "loss", best["loss"], best["step"])  # fmt: skip
    assert summary["test_loss"] == evals[-1]["loss"] and "follow the validation loss (lower is better)" in printed


def test_the_completions_table_holds_each_steps_completions_and_shows_the_farthest(learnt):
    _, run, printed = learnt
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 12 * 4 and [r["step"] for r in rows[::4]] == list(range(12))  # a line per step: its 4
    for row in rows:
        assert list(row) == ["step", "prompt", "completion", "divergence", "entropy", "length"]
        assert isinstance(row["prompt"], list) and 1 <= row["length"] <= 6 and 0 < row["divergence"] < 1
    shown = [line for line in printed.splitlines() if line.startswith("  ...")]
    assert len(shown) == 2 * 12 and all(" (divergence " in line and " tokens)" in line for line in shown)
    farthest = max(rows[-4:], key=lambda r: r["divergence"])
    assert f"(divergence {farthest['divergence']:.4g}, entropy " in shown[-2]


def test_the_run_samples_through_the_chat_template(learnt):
    from anytrain.sample import sample

    _, run, _ = learnt
    reply = sample(str(run), "What is 12 + 5?", tokens=4, top_k=1, seed=0)
    assert isinstance(reply, str) and reply == sample(str(run), "What is 12 + 5?", tokens=4, top_k=1, seed=1)


def test_lora_trains_adapters_from_the_same_first_step(learnt, folders, tmp_path):
    """LoRA's adapters start at zero: the first step samples and scores the same completions as full fine-tuning."""
    summary = in_process(tmp_path / "lora", *args(folders, "--max-steps", "2", "--lora-r", "4"))
    full = [m for m in read_metrics(learnt[1]) if m["kind"] == "train"][0]
    first = [m for m in read_metrics(tmp_path / "lora") if m["kind"] == "train"][0]
    assert first["loss"] == pytest.approx(full["loss"], rel=1e-5)
    assert summary["trainable_parameters"] < summary["parameters"] / 5
    assert (tmp_path / "lora" / "adapter").is_dir() and (tmp_path / "lora" / "hf" / "model.safetensors").is_file()


def test_accumulation_equals_one_batch_of_the_steps_prompts(folders, tmp_path):
    check_accumulated_steps(args(folders), ["--batch-size", "1", "--grad-accum-steps", "4"], tmp_path, rel=1e-5)


def test_the_start_up_check_answers_and_trains_a_step_that_counts_for_nothing(folders, tmp_path, monkeypatch):
    """distill owns its step, so the start-up check runs it (the first step's prompts answered, the divergence) and
    distill forgets it (after_check): the weights, every logged figure and the completions table equal those of the
    same run without the check."""
    flags = args(folders, "--max-steps", "2", "--batch-size", "2", "--grad-accum-steps", "2")
    check_start_up_check_forgotten(flags, tmp_path, monkeypatch, "distill")


@pytest.mark.launch
def test_two_ranks_equal_one_rank_with_twice_the_prompts(folders, tmp_path):
    figures = ("loss", "divergence", "entropy", "completion_length", "truncated")
    check_two_ranks_of_half_the_batch(args(folders), ["--batch-size", "2"], tmp_path, figures, rel=1e-5)
    assert len((tmp_path / "two" / "completions.jsonl").read_text().splitlines()) == 3 * 2  # the main process's


@pytest.mark.launch
def test_a_sigkilled_run_resumes_bit_for_bit(folders, tmp_path):
    """A checkpoint every 3 steps of 2 accumulated micro-batches: the resume starts at a step's first micro-batch,
    which answers its prompts again (keyed: the same completions). The completions table ends as the reference's."""
    flags = args(folders, "--max-steps", "8", "--checkpoint-every-steps", "3", "--batch-size", "2",
                 "--grad-accum-steps", "2")  # fmt: skip
    reference, victim = kill_and_resume(tmp_path, [*flags, "--keep-checkpoints", "9"], 4)
    a, b = read_summary(reference), read_summary(victim)
    assert a["last_weights_sha256"] == b["last_weights_sha256"] and b["resumed_from"].endswith("step-000003")
    assert [(m["step"], m["loss"]) for m in read_metrics(reference)] == [
        (m["step"], m["loss"]) for m in read_metrics(victim)
    ]
    table = (reference / "completions.jsonl").read_text()
    assert (victim / "completions.jsonl").read_text() == table and len(table.splitlines()) == 8 * 4
