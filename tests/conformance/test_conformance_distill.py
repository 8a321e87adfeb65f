"""The specification of `--task distill`: an optimizer step under plain SGD is lr times the gradient of TRL 1.16's
DistillationTrainer loss on the completions the step sampled. The run's answers are recorded
(OnPolicyDistillation.roll_out wrapped: the completions and the weights that sampled them); everything else is
recomputed here, independently, in float64 with full logits, each completion alone and unpadded:

- each completion: the generated tokens after the prompt through the first stop token (end-of-text, ChatML's
  <|im_end|>), or all --max-new-tokens of them; with a tool turn, the conversation rebuilt from the chat template
  (test_conformance_grpo_tools.rebuilt), the tools' tokens read by both models but not counted (TRL's tool_mask);
- at each counted token, from the student's and the teacher's logits over the whole vocabulary at the position
  before it, divided by --temperature: TRL's generalized JSD (trl/experimental/gkd/gkd_trainer.py,
  GKDTrainer.generalized_jsd_loss, reduction "none"; DistillationTrainer's ChunkedDivergenceFunction computes the
  same per token): beta 0 the forward KL(teacher || student), beta 1 the reverse KL(student || teacher), else
  beta KL(teacher || m) + (1 - beta) KL(student || m), m = (1 - beta) student + beta teacher;
- the loss: their sum over every counted token of the step over their count (DistillationTrainer._compute_loss:
  sum / num_items_in_batch, the step's count gathered over processes; loss_is_scaled_for_ga: accumulated
  micro-batches are not divided again), so accumulation and 2 ranks train the same step.

Each case checks a control that must miss: the formula with the wrong beta (and, where the case says, the
per-completion mean, the temperature 1, or the tools' tokens counted).

Models: the student the tests' Llama with a ChatML template, made to stop early now and then (completions of
several lengths), the teacher another, wider one (96 wide: only the vocabulary is shared); 4 prompts a step, up to 6
tokens each.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from hfchecks import in_process
from hfmodels import tiny_llama
from rollouts import completions, recorded, stopping
from sgd import LR, TOLERANCE, float64_model, gradients, relative_difference, sgd_flags, trained, weights
from textdata import write_jsonl

from anytrain.tasks.distill.task import OnPolicyDistillation

transformers = pytest.importorskip("transformers")

PROMPTS, NEW = 4, 6  # prompts per step, --max-new-tokens


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("conform_distill")
    rng = random.Random(2)
    rows = [{"prompt": [{"role": "user", "content": f"{rng.randint(0, 99)} + {rng.randint(0, 9)} ="}]}
            for _ in range(PROMPTS + 2)]  # fmt: skip
    (root / "data").mkdir()
    for split, part in (("train", rows[:PROMPTS]), ("validation", rows[PROMPTS:-1]), ("test", rows[-1:])):
        write_jsonl(root / "data" / f"{split}.jsonl", part)
    teacher = tiny_llama(root / "teacher", seed=1, width=96)
    student = stopping(tiny_llama(root / "student"), 9)  # some stop early: per-token and per-completion means differ
    return {"student": student, "teacher": teacher, "data": root / "data"}


def case(**given) -> dict:
    """A case's settings: TRL's defaults (beta 1, temperature 1), 4 prompts in one micro-batch, sgd.LR, unless
    given."""
    return {"beta": 1.0, "temperature": 1.0, "batch": PROMPTS, "accum": 1, "lr": LR, **given}


def flags(folders, c: dict) -> list[str]:
    return [
        "--task", "distill", "--model", f"hf:{folders['student']}", "--teacher", f"hf:{folders['teacher']}",
        "--dataset", str(folders["data"]), "--max-new-tokens", str(NEW), "--beta", str(c["beta"]),
        "--temperature", str(c["temperature"]), "--batch-size", str(c["batch"]), "--grad-accum-steps",
        str(c["accum"]), "--seed", "5", *sgd_flags(c["lr"]),
    ]  # fmt: skip


# --------------------------------------------------------------------------- the formula


def generalized_jsd(student: torch.Tensor, teacher: torch.Tensor, beta: float, temperature: float) -> torch.Tensor:
    """TRL's generalized_jsd_loss per token (reduction "none", summed over the vocabulary): (n, V) logits -> (n,)."""
    s = torch.log_softmax(student / temperature, -1)
    t = torch.log_softmax(teacher / temperature, -1)
    if beta == 0:
        return (t.exp() * (t - s)).sum(-1)  # F.kl_div(s, t, log_target=True): KL(teacher || student)
    if beta == 1:
        return (s.exp() * (s - t)).sum(-1)  # F.kl_div(t, s, log_target=True): KL(student || teacher)
    m = torch.logsumexp(torch.stack([s + math.log1p(-beta), t + math.log(beta)]), 0)
    return beta * (t.exp() * (t - m)).sum(-1) + (1 - beta) * (s.exp() * (s - m)).sum(-1)


def pieces_of(tokenizer, answered) -> list[tuple[list[int], list[int], list[bool]]]:
    """Each completion's (prompt, completion tokens, which count): the prompt without its left padding; the
    completion through its first stop token, or all of it; every one of its tokens counted."""
    return [(prompt, region, [True] * len(region)) for prompt, region in completions(tokenizer, answered.rows, NEW)]


def step_loss(student, teacher, pieces, c: dict, per_completion: bool = False) -> torch.Tensor:
    """The sum of the divergence over every counted token of the step over their count (or, the control, the mean
    of each completion's mean)."""
    values = []
    for prompt, region, counted in pieces:
        x = torch.tensor([prompt + region])
        at = slice(len(prompt) - 1, len(prompt) + len(region) - 1)  # the positions that predict the region
        s = student(input_ids=x, use_cache=False).logits[0, at]
        with torch.no_grad():
            t = teacher(input_ids=x, use_cache=False).logits[0, at]
        values.append(generalized_jsd(s, t, c["beta"], c["temperature"])[torch.tensor(counted)])
    if per_completion:
        return torch.stack([v.mean() for v in values]).mean()
    return torch.cat(values).sum() / sum(len(v) for v in values)


def difference(folders, before: dict, pieces, c: dict, end: dict, **control) -> float:
    student = float64_model(folders["student"])
    with torch.no_grad():
        for n, p in student.named_parameters():
            p.copy_(before[n])
    teacher = float64_model(folders["teacher"]).requires_grad_(False)
    start = {n: p.detach().clone() for n, p in student.named_parameters()}
    per_completion = control.pop("per_completion", False)
    loss = step_loss(student, teacher, pieces, {**c, **control}, per_completion)
    return relative_difference(start, end, gradients(student, loss), c["lr"])


def wrong_beta(c: dict) -> dict:
    return {"beta": 0.0 if c["beta"] == 1 else 1.0}


# --------------------------------------------------------------------------- the cases

CASES = [
    pytest.param(case(), {}, id="beta 1 (TRL's default): reverse KL"),
    pytest.param(case(beta=0.0), {}, id="beta 0: forward KL"),
    pytest.param(case(beta=0.5), {"per_completion": True}, id="beta 0.5: JSD"),
    pytest.param(case(beta=0.3, temperature=0.7), {"temperature": 1.0}, id="beta 0.3, temperature 0.7"),
    pytest.param(case(beta=0.5, batch=1, accum=4), {"per_completion": True}, id="accumulated 4 x 1"),
]


@pytest.mark.parametrize(("c", "extra"), CASES)
def test_an_sgd_step_is_the_gradient_of_trls_distillation_loss(folders, tmp_path, monkeypatch, c, extra):
    seen = recorded(monkeypatch, OnPolicyDistillation)  # the start-up check's answers first
    summary = in_process(tmp_path / "run", *flags(folders, c))
    assert summary["optimizer_steps"] == 1 and len(seen) == 2  # the start-up check's answers, then the step's
    before, answered = seen[-1].before, seen[-1].rollout
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["student"])
    pieces = pieces_of(tokenizer, answered)
    assert len(pieces) == PROMPTS and len({len(region) for _, region, _ in pieces}) > 1  # several lengths
    end = weights(tmp_path / "run" / "hf")
    diff = difference(folders, before, pieces, c, end)
    print(f"distill {c}: lengths {[len(r) for _, r, _ in pieces]}, relative difference {diff:.2e}")
    for control in (wrong_beta(c), extra):
        if control:
            far = difference(folders, before, pieces, c, end, **control)
            print(f"control {control}: relative difference {far:.2e}")
            assert far > 100 * TOLERANCE
    assert diff < TOLERANCE


@pytest.mark.launch
def test_two_ranks_train_the_same_step(folders, tmp_path, monkeypatch):
    """2 gloo ranks x 2 prompts: each rank answers its half of the step (keyed by the row: the completions of one
    rank x 4), the count gathered over both; the update is the formula's on the step's 4 completions."""
    c = case(beta=0.5)
    seen = recorded(monkeypatch, OnPolicyDistillation)  # the start-up check's answers first
    in_process(tmp_path / "one", *flags(folders, c))
    before, answered = seen[-1].before, seen[-1].rollout
    pieces = pieces_of(transformers.AutoTokenizer.from_pretrained(folders["student"]), answered)
    trained(tmp_path / "two", flags(folders, {**c, "batch": PROMPTS // 2}), ranks=2)
    end = weights(tmp_path / "two" / "hf")
    diff = difference(folders, before, pieces, c, end)
    far = difference(folders, before, pieces, c, end, **wrong_beta(c))
    print(f"distill on 2 ranks: relative difference {diff:.2e}, wrong beta {far:.2e}")
    assert diff < TOLERANCE and far > 100 * TOLERANCE


def test_an_sgd_step_with_a_tool_turn_counts_the_models_tokens_alone(tmp_path_factory, tmp_path, monkeypatch):
    """The first turn scripted (tests/tooldata.py: a call to add, with a bad argument, to an unknown tool, a malformed
    one, or the model's own text), the tool's answer and the model's next turn; the conversation rebuilt from the
    chat template: the tools' tokens are read by both models, and only the model's are counted."""
    from test_conformance_grpo_tools import NEW as TOOL_NEW
    from test_conformance_grpo_tools import rebuilt
    from tooldata import TOOLS, scripted, write_sums

    root = tmp_path_factory.mktemp("conform_distill_tools")
    (root / "tools.py").write_text(TOOLS)
    rows = write_sums(root / "data", train=8, held_out=1)
    folders = {"student": tiny_llama(root / "student", tools=True), "data": root / "data",
               "teacher": tiny_llama(root / "teacher", seed=1, width=96, tools=True)}  # fmt: skip
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["student"])
    turns, seen = scripted(monkeypatch, tokenizer), recorded(monkeypatch, OnPolicyDistillation)
    c = case(beta=0.5, batch=8, lr=8.0)  # a small gradient (long conversations): at lr 0.5 float32's rounding of the
    # weights alone is 7e-5 of the update (the formula's own difference: 4e-6 at lr 8)
    run_flags = [*flags(folders, c), "--tools", f"{root / 'tools.py'}:add", "--max-new-tokens", str(TOOL_NEW)]
    in_process(tmp_path / "run", *run_flags)
    before, answered = seen[-1].before, seen[-1].rollout
    kinds = [t["kind"] for t in turns[8:16]]  # the step's first turns, after the start-up check's
    width, pieces = answered.rows.width, []
    for k, row in enumerate(answered.prompts):
        real = answered.rows.mask[k].bool()
        region = answered.rows.ids[k, width:][real[width:]].tolist()
        prompt, learned, _ = rebuilt(tokenizer, rows[row], kinds[k], region)
        assert answered.rows.ids[k, :width][real[:width]].tolist() == prompt
        last = max(j for j, m in enumerate(learned) if m) + 1  # the region through the model's last own token
        pieces.append((prompt, region[:last], learned[:last]))
    assert any(not all(counted) for _, _, counted in pieces)  # a tool's answer inside some conversation
    end = weights(tmp_path / "run" / "hf")
    diff = difference(folders, before, pieces, c, end)
    counted_too = [(p, r, [True] * len(r)) for p, r, _ in pieces]
    tools_counted = difference(folders, before, counted_too, c, end)
    far = difference(folders, before, pieces, c, end, **wrong_beta(c))
    print(f"distill with tools: kinds {kinds}, relative difference {diff:.2e}, tools' tokens counted "
          f"{tools_counted:.2e}, wrong beta {far:.2e}")  # fmt: skip
    assert diff < TOLERANCE and tools_counted > 100 * TOLERANCE and far > 100 * TOLERANCE
