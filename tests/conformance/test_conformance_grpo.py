"""The specification of `--task grpo`: an optimizer step under plain SGD is lr times the gradient of TRL 1.16's GRPO
loss (or, with --advantage rloo, RLOOTrainer's) on the completions the step sampled. The run's rollouts are recorded
(GroupRelative.roll_out wrapped: its Rollout and the weights it was sampled with); everything else is recomputed
here, independently:

- each completion: the generated tokens after the prompt through the first stop token (end-of-text, ChatML's
  <|im_end|>), or all --max-new-tokens of them; its text decoded without special tokens;
- rewards (GRPOTrainer._generate_and_score_completions, multi_objective_aggregation="sum_then_normalize"): each
  --reward function on the prompts, the completions as one-message chats and the dataset's columns; None is NaN;
  r = the weighted nansum, NaN where every function returned None (such a completion is unscorable);
- advantages: A = r - nanmean of its group, divided by nanstd (Bessel) + 1e-4 of the group (--scale-rewards group),
  of the step's rewards (batch), or not at all (none); NaN (unscorable) becomes 0;
- log-probabilities (GRPOTrainer._get_per_token_logps_and_entropies): log_softmax(logits / temperature) of each
  completion token, the prompt and completion alone and unpadded, the model in float64; --top-k, --min-p and
  --repetition-penalty shape the sampling alone, not these (the "sampling flags" case: its control, the filtered
  distribution's log-probabilities, is far off);
- the loss (GRPOTrainer._compute_loss, num_iterations 1: old = logp, detached): coef_1 = exp(logp - old) per token,
  or per completion exp(mean over its tokens) (--importance sequence) or exp(their sum) (sequence_sum: anytrain's,
  RLOOTrainer's ratio); per token
  -min(coef_1 A, clip(coef_1, 1 - eps, 1 + eps) A), plus beta (exp(ref - logp) - (ref - logp) - 1) coef_1 with
  --kl-beta (k3, times coef_1: use_bias_correction_kl, TRL's default; ref the starting model); summed over every
  completion token of the step over their count (dapo), each completion's token mean averaged over the completions
  (grpo), or summed over completions x --max-new-tokens (dr_grpo); the same step on accumulated micro-batches
  (anytrain's tasks/grpo/loss.py docstring).

RLOO (--advantage rloo: TRL 1.16's RLOOTrainer, rloo_trainer.py; Ahmadian et al. 2024, "Back to Basics: Revisiting
REINFORCE Style Optimization for Learning from Human Feedback in LLMs"):

- rewards as above; with --kl-beta less beta x the completion's sum over its tokens of old - ref (k1 under the policy
  that sampled it, no gradient: RLOOTrainer._generate_and_score_completions, "Include the KL penalty in the reward");
- advantages (the same function): A_i = r_i - (nansum of its group - r_i) / (scorable in its group - 1), the
  leave-one-out baseline; with --normalize-advantages (normalize_advantages) (A - nanmean A) / (nanstd A + 1e-4) over
  the step; NaN (unscorable, or alone in its group) becomes 0;
- the loss (RLOOTrainer._compute_loss): logps = the sum of the completion's token log-probabilities, coef_1 =
  exp(logps - old_logps), -min(coef_1 A, clip(coef_1, 1 - eps, 1 + eps) A) per completion, their mean; no KL term.
  anytrain reaches it as --importance sequence_sum --grpo-loss grpo, the defaults it settles for rloo: the "rloo
  TRL defaults" case gives none of the objective's flags and checks those, --kl-beta 0.05 included. Other losses
  with RLOO's advantage are GRPOTrainer's formula above with RLOO's advantage (and its KL still in the reward).

Each case also checks a control where it names one: the formula with that setting changed (GRPO's advantage, no
normalisation, no KL, GSPO's mean ratio) is far off, so the case tells the setting apart.

At the first step the reference is the policy, so the KL term and its gradient vanish (RLOO's KL in the reward
too): the KL cases check the second step (its rollout sampled by, and its gradient taken at, the weights after the
first; the reference the starting model). Each case failed before issue 46's fixes where it says so in the guide's
Conformance section.

Model: the tests' Llama with a ChatML template, made to stop early now and then (completions of different lengths tell
the three normalisations apart); 2 prompts x 4 completions (2 in the G=2 cases) of up to 6 tokens a step.
"""

from __future__ import annotations

import random

import pytest
import torch
import yaml
from hfchecks import in_process
from hfmodels import tiny_llama
from rollouts import completions, recorded, stopping
from sgd import LR, TOLERANCE, float64_model, gradients, relative_difference, sgd_flags, token_logps, weights
from textdata import write_jsonl

from anytrain.tasks.grpo.options import RLOO_DEFAULTS
from anytrain.tasks.grpo.task import GroupRelative

transformers = pytest.importorskip("transformers")

PROMPTS, G, NEW = 2, 4, 6  # prompts per step, completions per prompt, --max-new-tokens
EPS = 0.2  # --epsilon (TRL's default), epsilon_high the same

REWARDS = '''
def length(prompts, completions, completion_ids, **columns):
    return [len(c[-1]["content"]) / 8 for c in completions]


def spaces(prompts, completions, completion_ids, answer, **columns):
    return [c[-1]["content"].count(" ") / 2 + (a in c[-1]["content"]) for c, a in zip(completions, answer)]


def odd_none(prompts, completions, completion_ids, **columns):
    """None for every other completion: half of each group."""
    return [None if k % 2 else len(c[-1]["content"]) / 8 for k, c in enumerate(completions)]


def quarter_none(prompts, completions, completion_ids, **columns):
    return [None if k % 4 == 0 else len(ids) / 3 for k, ids in enumerate(completion_ids)]


def second_none(prompts, completions, completion_ids, **columns):
    return [None if k % 4 == 1 else len(ids) / 3 for k, ids in enumerate(completion_ids)]
'''


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("conform_grpo")
    rng = random.Random(1)
    rows = []
    for _ in range(PROMPTS + 2):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"prompt": [{"role": "user", "content": f"{a} + {b} ="}], "answer": str(a + b)})
    (root / "data").mkdir()
    for split, part in (("train", rows[:PROMPTS]), ("validation", rows[PROMPTS:-1]), ("test", rows[-1:])):
        write_jsonl(root / "data" / f"{split}.jsonl", part)
    (root / "rewards.py").write_text(REWARDS)
    model = stopping(tiny_llama(root / "llama"), 10)  # some completions stop early: the normalisations differ
    return {"model": model, "data": root / "data", "rewards": root / "rewards.py", "rows": rows}


def case(**given) -> dict:
    """A case's settings: TRL's defaults, as anytrain's flags default, unless given."""
    return {"loss": "dapo", "scale": "group", "importance": "token", "beta": 0.0, "temperature": 1.0,
            "rewards": {"length": 1.0}, "accum": 1, "steps": 1, "kl_correction": True, "advantage": "grpo",
            "normalize": False, "G": G, "defaults": False, "share": True, **given}  # fmt: skip


def rloo_case(**given) -> dict:
    """An RLOO case: TRL RLOOConfig's defaults (no scaling, normalize_advantages off, RLOOTrainer's loss), unless
    given; beta 0 (at the first step the KL in the reward is 0: the KL cases check the second)."""
    return case(**{"advantage": "rloo", "loss": "grpo", "scale": "none", "importance": "sequence_sum", **given})


def flags(folders, c: dict) -> list[str]:
    objective = [
        "--grpo-loss", c["loss"], "--scale-rewards", c["scale"], "--importance", c["importance"],
        "--kl-beta", str(c["beta"]), "--kl-bias-correction" if c["kl_correction"] else "--no-kl-bias-correction",
    ]  # fmt: skip
    return [
        "--task", "grpo", "--model", f"hf:{folders['model']}", "--dataset", str(folders["data"]),
        "--reward", *(f"{folders['rewards']}:{name}" for name in c["rewards"]),
        "--reward-weights", *map(str, c["rewards"].values()), "--num-generations", str(c["G"]),
        "--max-new-tokens", str(NEW), "--batch-size", str(PROMPTS), "--grad-accum-steps", str(c["accum"]),
        "--temperature", str(c["temperature"]), "--epsilon", str(EPS), "--seed", "5", *sgd_flags(steps=c["steps"]),
        *([] if c["defaults"] else objective), *(["--advantage", "rloo"] if c["advantage"] == "rloo" else []),
        *(["--normalize-advantages"] if c["normalize"] else []), *([] if c["share"] else ["--no-share-prompts"]),
        *c.get("sampling", []),
    ]  # fmt: skip


def recorded_run(folders, run, monkeypatch, c: dict) -> list[tuple[dict, object]]:
    """The run, and each rollout it trained on with the weights that sampled it (float64 copies); the start-up check's
    rollout (its step run once on the first training rows, then forgotten) is left out."""
    seen = recorded(monkeypatch, GroupRelative)
    summary = in_process(run, *flags(folders, c))
    assert summary["optimizer_steps"] == c["steps"] and len(seen) == c["steps"] + 1
    assert all(r.shared == c["share"] for r in seen)  # a group's prompt read once, unless --no-share-prompts
    return [(r.before, r.rollout) for r in seen[1:]]


# --------------------------------------------------------------------------- the formula


def rewards(folders, tokenizer, pieces, c: dict) -> torch.Tensor:
    """(n,) the weighted nansum of the reward functions, NaN where every one returned None."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("conformance_rewards", folders["rewards"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rendered = {}
    for row in folders["rows"]:
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)
        rendered[tuple(ids["input_ids"])] = row
    rows = [rendered[tuple(prompt)] for prompt, _ in pieces]  # each prompt is a dataset row's, rendered
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for _, ids in pieces]
    chats = [[{"role": "assistant", "content": t}] for t in texts]  # as TRL gives a chat prompt's completions
    args = {"prompts": [r["prompt"] for r in rows], "completions": chats, "completion_ids": [ids for _, ids in pieces],
            "answer": [r["answer"] for r in rows]}  # fmt: skip
    table = torch.tensor(
        [[float("nan") if v is None else v for v in getattr(module, name)(**args)] for name in c["rewards"]],
        dtype=torch.float64,
    ).T
    total = (table * torch.tensor(list(c["rewards"].values()), dtype=torch.float64)).nansum(1)
    return total.masked_fill(table.isnan().all(1), float("nan"))


def nanstd(x: torch.Tensor, dim=None) -> torch.Tensor:
    """trl.trainer.utils.nanstd: the standard deviation of the non-NaN values, with Bessel's correction."""
    mean = x.nanmean(dim, keepdim=dim is not None)
    count = (~x.isnan()).sum(dim)
    return ((x - mean) ** 2).nansum(dim).div(count - 1).sqrt()


def advantages(r: torch.Tensor, scale: str, g: int = G) -> torch.Tensor:
    groups = r.view(-1, g)
    centred = (groups - groups.nanmean(1, keepdim=True)).view(-1)
    if scale == "group":
        centred = centred / (nanstd(groups, 1).repeat_interleave(g) + 1e-4)
    elif scale == "batch":
        centred = centred / (nanstd(r) + 1e-4)
    return centred.nan_to_num(0.0)


def rloo_advantages(r: torch.Tensor, c: dict) -> torch.Tensor:
    """RLOOTrainer._generate_and_score_completions: the leave-one-out baseline over the group's scorable rewards
    ((nansum - r) / (scorable - 1): NaN for a completion alone in its group), normalize_advantages over the step;
    NaN -> 0. RLOOTrainer scales by no standard deviation: a case with --scale-rewards is no RLOO formula."""
    assert c["scale"] == "none"
    grouped = r.view(-1, c["G"])
    scorable = (~grouped.isnan()).sum(1, keepdim=True)
    baselines = (torch.nansum(grouped, 1, keepdim=True) - grouped) / (scorable - 1)
    a = r - baselines.view(-1)
    if c["normalize"]:
        a = (a - a.nanmean()) / (nanstd(a) + 1e-4)
    return a.nan_to_num(0.0)


def rloo_kl(model, reference, pieces, c: dict) -> torch.Tensor:
    """(n,) each completion's sum over its tokens of log pi_old - log pi_ref (RLOOTrainer's per_token_kl: the first
    order log-ratio, under the policy that sampled, without gradient)."""
    out = []
    with torch.no_grad():
        for prompt, completion in pieces:
            old = token_logps(model, prompt + completion, c["temperature"])[len(prompt) - 1 :]
            ref = token_logps(reference, prompt + completion, c["temperature"])[len(prompt) - 1 :]
            out.append((old - ref).sum())
    return torch.stack(out)


def step_advantages(model, reference, pieces, r: torch.Tensor, c: dict) -> torch.Tensor:
    """The case's advantages: GRPOTrainer's, or RLOOTrainer's of the rewards less beta x the KL."""
    if c["advantage"] == "grpo":
        return advantages(r, c["scale"], c["G"])
    return rloo_advantages(r - c["beta"] * rloo_kl(model, reference, pieces, c) if c["beta"] else r, c)


def rloo_loss(model, pieces, adv: torch.Tensor, c: dict) -> torch.Tensor:
    """RLOOTrainer._compute_loss: one ratio per completion, of its summed log-probabilities (old_logps = logps
    detached: one step per rollout), clipped; the mean over the completions; no KL term (it is in the reward)."""
    losses = []
    for (prompt, completion), a in zip(pieces, adv):
        logps = token_logps(model, prompt + completion, c["temperature"])[len(prompt) - 1 :].sum()
        coef_1 = (logps - logps.detach()).exp()
        coef_2 = coef_1.clamp(1 - EPS, 1 + EPS)
        losses.append(-torch.min(coef_1 * a, coef_2 * a))
    return torch.stack(losses).mean()


def step_loss(model, reference, pieces, adv: torch.Tensor, c: dict) -> torch.Tensor:
    """RLOOTrainer's loss for RLOO's settings of it, else GRPOTrainer's (with RLOO's advantage: no KL term)."""
    if c["advantage"] == "rloo" and (c["loss"], c["importance"]) == ("grpo", "sequence_sum"):
        return rloo_loss(model, pieces, adv, c)
    return grpo_loss(model, reference, pieces, adv, c)


def grpo_loss(model, reference, pieces, adv: torch.Tensor, c: dict) -> torch.Tensor:
    """TRL's _compute_loss over the step's completions (old = logp detached: one step per rollout); --importance
    sequence_sum (anytrain's, after RLOOTrainer): exp of the completion's summed log-ratio."""
    losses, counts = [], []
    for (prompt, completion), a in zip(pieces, adv):
        if c.get("filtered"):  # the sampling case's control: the filtered distribution's, which TRL does not train on
            logp = filtered_logps(model, prompt, completion, c["temperature"])
        else:
            logp = token_logps(model, prompt + completion, c["temperature"])[len(prompt) - 1 :]
        log_w = logp - logp.detach()
        level = {"token": log_w, "sequence": log_w.mean(), "sequence_sum": log_w.sum()}
        coef_1 = level[c["importance"]].exp()
        per_token = -torch.min(coef_1 * a, coef_1.clamp(1 - EPS, 1 + EPS) * a).expand_as(logp)
        if c["beta"] and c["advantage"] == "grpo":
            with torch.no_grad():
                ref = token_logps(reference, prompt + completion, c["temperature"])[len(prompt) - 1 :]
            k3 = (ref - logp).exp() - (ref - logp) - 1  # TRL before 1.16: k3 alone (--no-kl-bias-correction)
            per_token = per_token + c["beta"] * (k3 * coef_1 if c["kl_correction"] else k3)
        losses.append(per_token)
        counts.append(len(completion))
    if c["loss"] == "grpo":
        return torch.stack([x.mean() for x in losses]).mean()
    total = torch.cat(losses).sum()
    return total / (sum(counts) if c["loss"] == "dapo" else len(pieces) * NEW)


def filtered_logps(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """The completion's log-probabilities under the distribution the sampling case samples from: transformers'
    processors for its flags (the repetition penalty over the prompt and the completion so far, the temperature,
    top-k, min-p) on each position's logits, then log_softmax."""
    from transformers import generation as g

    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1]
    processors = g.LogitsProcessorList([g.RepetitionPenaltyLogitsProcessor(PENALTY), g.TemperatureLogitsWarper(
        temperature), g.TopKLogitsWarper(TOP_K), g.MinPLogitsWarper(MIN_P)])  # fmt: skip
    scores = torch.cat([processors(ids[:, : len(prompt) + t], logits[t : t + 1]) for t in range(len(completion))])
    return scores.log_softmax(-1).gather(1, torch.tensor(completion)[:, None])[:, 0]


# --------------------------------------------------------------------------- the cases


# --top-k, --min-p, --repetition-penalty shape what is sampled, not the log-probabilities: TRL's are those of
# log_softmax(logits / temperature), unfiltered (its _get_per_token_logps_and_entropies), as this file's formula
TOP_K, MIN_P, PENALTY = 8, 0.05, 1.3
SAMPLING = ["--top-k", str(TOP_K), "--min-p", str(MIN_P), "--repetition-penalty", str(PENALTY)]
UNSCORABLE = {"odd_none": 1.0, "second_none": 0.5}  # every function None for the second of each 4 completions
CASES = [
    pytest.param(case(), id="dapo"),
    pytest.param(case(loss="grpo"), id="grpo"),
    pytest.param(case(loss="dr_grpo"), id="dr_grpo"),
    pytest.param(case(scale="batch"), id="scale batch"),
    pytest.param(case(scale="none", share=False), id="scale none, each row whole"),  # --no-share-prompts
    pytest.param(case(importance="sequence"), id="sequence"),
    pytest.param(case(rewards={"length": 1.0, "spaces": 0.5}), id="two rewards weighted"),
    pytest.param(case(accum=3), id="accumulated"),  # micro-batches of 3, 3, 2 completions: groups split
    pytest.param(case(accum=2, loss="grpo"), id="accumulated grpo"),
    pytest.param(case(rewards={"odd_none": 1.0, "quarter_none": 0.5}), id="None for some"),
    pytest.param(case(rewards={"odd_none": 1.0, "second_none": 0.5}), id="None from every function for some"),
    pytest.param(case(temperature=0.7), id="temperature 0.7"),
    pytest.param(case(temperature=0.7, sampling=SAMPLING, control={"filtered": True}), id="sampling flags"),
    pytest.param(case(steps=2), id="second step"),  # the control of the KL cases' second-step check
    pytest.param(case(beta=0.1, steps=2), id="kl second step"),
    pytest.param(case(beta=0.1, steps=2, importance="sequence"), id="kl second step sequence"),
    pytest.param(case(beta=0.1, steps=2, kl_correction=False), id="kl second step uncorrected"),
    pytest.param(case(importance="sequence_sum", control={"importance": "sequence"}), id="sequence_sum"),
    pytest.param(rloo_case(control={"advantage": "grpo"}), id="rloo"),
    pytest.param(rloo_case(normalize=True, control={"normalize": False}), id="rloo normalised"),
    pytest.param(rloo_case(rewards=UNSCORABLE, control={"advantage": "grpo"}), id="rloo None from every function"),
    pytest.param(rloo_case(G=2, control={"advantage": "grpo"}), id="rloo G=2"),
    pytest.param(rloo_case(G=2, rewards=UNSCORABLE, control={"advantage": "grpo"}), id="rloo G=2 one alone"),
    pytest.param(rloo_case(accum=2, control={"advantage": "grpo"}), id="rloo accumulated"),
    pytest.param(rloo_case(loss="dapo", importance="token", control={"advantage": "grpo"}), id="rloo grpo's loss"),
    pytest.param(rloo_case(beta=0.1, steps=2, control={"beta": 0.0}), id="rloo kl second step"),
    pytest.param(rloo_case(beta=0.05, steps=2, defaults=True, control={"beta": 0.0}), id="rloo TRL defaults"),
]


def policy(folders, before: dict, first: bool) -> torch.nn.Module:
    """The float64 model with the weights that sampled the rollout (at the first step, the folder's own)."""
    model = float64_model(folders["model"])
    with torch.no_grad():
        for n, p in model.named_parameters():
            assert not first or torch.equal(before[n], p)
            p.copy_(before[n])
    return model


def difference(model, reference, pieces, r: torch.Tensor, c: dict, end: dict) -> float:
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    adv = step_advantages(model, reference, pieces, r, c)
    return relative_difference(start, end, gradients(model, step_loss(model, reference, pieces, adv, c)), LR)


def controls(c: dict) -> list[dict]:
    """The formulas the step must be far from: the case's own control, and at the first step another normalisation
    (the completions have several lengths)."""
    out = [{**c, **c["control"]}] if "control" in c else []
    if c["steps"] == 1:
        out.append({**c, "loss": "dapo" if c["loss"] == "grpo" else "grpo"})
    return out


@pytest.mark.parametrize("c", CASES)
def test_an_sgd_step_is_the_gradient_of_trls_grpo_loss(folders, tmp_path, monkeypatch, c):
    seen = recorded_run(folders, tmp_path / "run", monkeypatch, c)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["model"])
    before, rollout = seen[-1]  # the step checked: the last (the second, for the KL cases)
    model = policy(folders, before, c["steps"] == 1)
    reference = float64_model(folders["model"]).requires_grad_(False) if c["beta"] else None
    pieces = completions(tokenizer, rollout.rows, NEW)
    r = rewards(folders, tokenizer, pieces, c)
    adv = step_advantages(model, reference, pieces, r, c)
    assert len(pieces) == PROMPTS * c["G"] and adv.abs().max() > 0.1, adv  # a step with something to learn
    assert r.isnan().any() == ("second_none" in c["rewards"])  # the unscorable completions of that case, only
    end = weights(tmp_path / "run" / "hf")
    diff = difference(model, reference, pieces, r, c, end)
    print(f"grpo {c}: rewards {r.tolist()}, relative difference {diff:.2e}")
    if c["steps"] == 1:
        assert len({len(completion) for _, completion in pieces}) > 1
    for other in controls(c):
        far = difference(model, reference, pieces, r, other, end)
        print(f"control {other.get('control')}: relative difference {far:.2e}")
        assert far > 100 * TOLERANCE
    if c["defaults"]:  # the objective's options not given: settled to RLOOTrainer's defaults
        settled = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["grpo"]
        assert {k: settled[k] for k in RLOO_DEFAULTS} == RLOO_DEFAULTS
    assert diff < TOLERANCE
