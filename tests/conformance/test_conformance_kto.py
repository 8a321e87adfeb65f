"""The specification of `--task kto`: two plain SGD steps are lr times the sum of the gradients, at the starting
weights and then at the first step's, of the mean over the optimizer step's rows of each row's weighted loss, with
the starting model as the reference (TRL 1.16 KTOTrainer._compute_loss). With pi a completion's summed
log-probability under the model, ref the reference's, r = pi - ref, w the row's class weight (--desirable-weight,
--undesirable-weight) and beta:

    kto                desirable  w (1 - sigma(beta (r - z)))     undesirable  w (1 - sigma(beta (z - r)))
    apo_zero_unpaired  desirable  w (1 - sigma(beta r))            undesirable  w sigma(beta r)

z, the KL estimate (kto only), is the mean over the step's rows of the KL pair's log-ratio pi - ref, clamped at 0 and
detached (TRL: `(KL_logps - ref_KL_logps).mean().detach()`, gathered over the ranks, `.clamp(min=0)`). A row's KL
pair is its prompt followed by another row's completion (TRL's KL completions, `add_kl_completion_ids`). TRL takes
the completion of the row before it in its batch; anytrain the completion of the row after it in a cycle through the
split drawn from numpy's default_rng([--seed, 0]) (tasks/kto/rows.py: `partners`), so the pair is fixed by the data
whatever the batch, ranks and accumulation (docs/kto.md); `--kl-pairs trl` takes TRL's (one case). And z is the
whole step's: its accumulated micro-batches' and its ranks' rows together (TRL's is a micro-batch's, gathered over
ranks).

Two steps, not one: at the first the model is its own reference, so r = 0 and z = 0 for every row and both losses
have the same gradient, beta w / 4 times the log-probability's, up or down with the label; the KL term and the loss
types part only from the second step on. The completion tokens are TRL's (sgd.trl_completion: the prompt, and the
prompt + completion, tokenised; the completion from where they part; text gets the end-of-text token); a pair is
unpaired as TRL's unpair_preference_dataset unpairs it, its desirable row then its undesirable one.

Every case has a control, a formula a plausible mistake would compute, which must miss by far more than the
tolerance: the KL estimate of matched pairs (each prompt with its own completion), z per micro-batch or per rank (TRL
under accumulation), the other loss type, the weights swapped, the rows' labels swapped.

Model: the zoo's Qwen2 (biased attention projections, rotary positions) with the tests' ChatML tokenizer.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from hfmodels import chat_tokenizer
from sgd import (
    TOLERANCE,
    TWO_RANKS,
    answer_logps,
    float64_model,
    gradients,
    relative_difference,
    sgd_flags,
    trained,
    trl_completion,
    weights,
)
from textdata import write_jsonl
from zoo import save_tiny

from anytrain.data import preferences

transformers = pytest.importorskip("transformers")

ROWS, SEED, LR = 4, 7, 0.5  # one optimizer step is the whole training split: both steps hold its 4 rows
BETA = {"kto": 0.5, "apo_zero_unpaired": 0.5}
MODES = {"one batch": ["--batch-size", "4"], "accumulated": ["--batch-size", "2", "--grad-accum-steps", "2"],
         "packed": ["--batch-size", "4", "--packing"], "live": ["--batch-size", "4", "--reference", "live"],
         "weighted": ["--batch-size", "4", "--desirable-weight", "1.5", "--undesirable-weight", "0.5"],
         "trl pairs": ["--batch-size", "4", "--kl-pairs", "trl"]}  # fmt: skip


def unpaired_chats() -> list[dict]:
    """Three desirable rows and an undesirable one, then a validation and a test row."""
    rows = preferences.rows(ROWS + 2, seed=3)
    labels = [True, False, True, True, True, False]
    return [{"prompt": r["prompt"], "completion": r["chosen" if good else "rejected"], "label": good}
            for r, good in zip(rows, labels)]  # fmt: skip


TEXT_PAIRS = [  # text pairs with an explicit prompt: unpaired into 4 training rows (2 desirable), 1 + 1 held out
    {"prompt": "Q: What is 2 + 2? A:", "chosen": " 4.", "rejected": " 5."},
    {"prompt": "Q: Spell cat backwards. A:", "chosen": " tac.", "rejected": " cat."},
    {"prompt": "Q: Hello? A:", "chosen": " Hi.", "rejected": " No."},
    {"prompt": "Q: Bye? A:", "chosen": " Bye.", "rejected": " Hi."},
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("conform_kto")
    out = {"model": save_tiny("qwen2", root / "qwen2", chat_tokenizer())}
    sets = {"chats": (unpaired_chats(), ROWS), "pairs": (TEXT_PAIRS, ROWS // 2)}
    for name, (rows, train) in sets.items():
        (root / name).mkdir()
        for split, part in (("train", rows[:train]), ("validation", rows[train:-1]), ("test", rows[-1:])):
            write_jsonl(root / name / f"{split}.jsonl", part)
        out[name] = root / name
    return out


def training_rows(folder) -> list[dict]:
    """The training split as kto reads it: unpaired rows as they are; a pair its desirable row, then its undesirable."""
    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    if "label" in rows[0]:
        return rows
    return [{"prompt": r["prompt"], "completion": r[side], "label": side == "chosen"}
            for r in rows for side in ("chosen", "rejected")]  # fmt: skip


def partners(n: int, trl: bool = False) -> list[int]:
    """Row i's KL partner: the next row in the cycle default_rng([SEED, 0]).permutation(n); trl (--kl-pairs trl, one
    batch of all n rows): TRL's add_kl_completion_ids, the completions rotated by one, row i getting row i - 1's."""
    if trl:
        return [(i - 1) % n for i in range(n)]
    order = np.random.default_rng([SEED, 0]).permutation(n)
    partner = np.empty(n, dtype=np.int64)
    partner[order] = np.roll(order, -1)
    return partner.tolist()


def halves(n: int, epoch: int) -> list[list[int]]:
    """The two micro-batches (or ranks' batches) of an epoch's one step: its order's halves (ORDER_KEY 3)."""
    order = np.random.default_rng([SEED, 3, epoch]).permutation(n).tolist()
    return [order[: n // 2], order[n // 2 :]]


def sequences(tokenizer, rows: list[dict], eos: bool = True) -> list[tuple]:
    """Each row's (completion ids, mask) and (prompt ids, completion ids) as TRL tokenises it (eos=False: a text
    completion without the end-of-text token TRL appends, the control)."""
    out = []
    for row in rows:
        completion = row["completion"] if eos else row["completion"].removesuffix(tokenizer.eos_token)
        ((ids, mask),) = trl_completion(tokenizer, row["prompt"], [completion])
        if not eos:
            ids, mask = ids[:-1], mask[:-1]
        start = mask.index(True)
        out.append(((ids, mask), (ids[:start], ids[start:])))
    return out


def kl_sum(model, ref, seqs, rows: list[int], partner: list[int]) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64)
    for i in rows:
        prompt, completion = seqs[i][1][0], seqs[partner[i]][1][1]
        ids, mask = prompt + completion, [False] * len(prompt) + [True] * len(completion)
        with torch.no_grad():
            total = total + answer_logps(model, ids, mask).sum() - answer_logps(ref, ids, mask).sum()
    return total


def step_loss(model, ref, seqs, labels, case: dict, groups: list[list[int]]) -> torch.Tensor:
    """The mean over the rows of the weighted loss; z from each group's rows (the step's: one group of all)."""
    beta, (wd, wu), losses = case["beta"], case["weights"], []
    for group in groups:
        z = (kl_sum(model, ref, seqs, group, case["partner"]) / len(group)).clamp(min=0)
        for i in group:
            (ids, mask), good = seqs[i][0], labels[i]
            pi = answer_logps(model, ids, mask).sum()
            with torch.no_grad():
                r = pi - answer_logps(ref, ids, mask).sum()
            r = pi - pi.detach() + r  # the gradient of pi, the value of pi - ref
            if case["loss"] == "kto":
                loss = 1 - torch.sigmoid(beta * (r - z)) if good else 1 - torch.sigmoid(beta * (z - r))
            else:
                loss = 1 - torch.sigmoid(beta * r) if good else torch.sigmoid(beta * r)
            losses.append((wd if good else wu) * loss)
    return torch.stack(losses).sum() / len(seqs)


def two_steps(folder, tokenizer, case: dict, grouped: bool = False) -> tuple[dict, dict, float]:
    """The starting weights and the sum of the two steps' gradients (grouped: z per half of each step), and the
    second step's z."""
    rows = training_rows(folder)
    seqs, labels = sequences(tokenizer, rows, not case.get("no_eos")), [row["label"] for row in rows]
    labels = [not good for good in labels] if case.get("swap_labels") else labels
    start = float64_model(case["model"])
    everything = [list(range(len(rows)))]
    g1 = gradients(start, step_loss(start, start, seqs, labels, case, halves(len(rows), 0) if grouped else everything))
    moved = copy.deepcopy(start)
    with torch.no_grad():
        for name, p in moved.named_parameters():
            p -= LR * g1[name]
    groups = halves(len(rows), 1) if grouped else everything
    g2 = gradients(moved, step_loss(moved, start, seqs, labels, case, groups))
    z = float((kl_sum(moved, start, seqs, everything[0], case["partner"]) / len(rows)).clamp(min=0))
    w0 = {n: p.detach() for n, p in start.named_parameters()}
    return w0, {n: g1[n] + g2[n] for n in g1}, z


def run_and_compare(folders, run, data: str, loss: str, flags: list[str], controls: dict, ranks: int = 1) -> float:
    """The run's two updates against the formula's gradients, and each control's (which must miss: 20 times the
    tolerance, where the formula is some 1e-6 away)."""
    weighted = "--desirable-weight" in flags
    args = ["--task", "kto", "--model", f"hf:{folders['model']}", "--dataset", str(folders[data]), *flags]
    args += ["--kto-loss", loss, "--beta", str(BETA[loss]), "--max-length", "128", "--seed", str(SEED)]
    summary = trained(run, [*args, *sgd_flags(LR, steps=2)], ranks)
    assert summary["optimizer_steps"] == 2 and summary["kto_loss"] == loss
    assert summary["reference"] == ("live" if "live" in flags else "cached")
    assert ("packed_texts_kept_apart_by" in summary) == ("--packing" in flags)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["model"])
    trl = "--kl-pairs" in flags
    case = {"model": folders["model"], "loss": loss, "beta": BETA[loss], "partner": partners(ROWS, trl),
            "weights": (1.5, 0.5) if weighted else (1.0, 1.0)}  # fmt: skip
    end = weights(run / "hf")
    w0, grads, z = two_steps(folders[data], tokenizer, case)
    diff = relative_difference(w0, end, grads, LR)
    missed = {}
    for name, (change, grouped) in controls.items():
        _, wrong, _ = two_steps(folders[data], tokenizer, {**case, **change}, grouped)
        missed[name] = relative_difference(w0, end, wrong, LR)
    said = ", ".join(f"{k} {v:.2e}" for k, v in missed.items())
    print(f"kto {loss} on {data}, {' '.join(flags)}: relative difference {diff:.2e} (z {z:.3f}); controls: {said}")
    assert all(v > 20 * TOLERANCE for v in missed.values()), missed
    if "matched KL pairs" in controls:
        assert z > 0.05, z  # the KL term is live at the second step
    return diff


MATCHED = {"matched KL pairs": ({"partner": list(range(ROWS))}, False)}
CONTROLS = {
    ("kto", "one batch"): {**MATCHED, "apo_zero_unpaired": ({"loss": "apo_zero_unpaired"}, False)},
    ("kto", "accumulated"): {**MATCHED, "z per micro-batch": ({}, True)},
    ("kto", "packed"): MATCHED,
    ("kto", "live"): MATCHED,
    ("kto", "weighted"): {**MATCHED, "weights swapped": ({"weights": (0.5, 1.5)}, False)},
    ("kto", "trl pairs"): {**MATCHED, "the cycle's pairs": ({"partner": partners(ROWS)}, False)},
    ("apo_zero_unpaired", "one batch"): {"kto": ({"loss": "kto"}, False), "beta 0.4": ({"beta": 0.4}, False)},
}


@pytest.mark.parametrize("loss, mode", list(CONTROLS))
def test_two_sgd_steps_are_the_mean_row_loss_with_the_steps_kl_estimate(folders, tmp_path, loss, mode):
    assert run_and_compare(folders, tmp_path / "run", "chats", loss, MODES[mode], CONTROLS[loss, mode]) < TOLERANCE


def test_text_pairs_are_unpaired_and_their_completions_end_with_the_end_of_text_token(folders, tmp_path):
    """The KL estimate is 0 here (clamped: the step pushed the undesirable completions down, and the KL pairs with
    them); the controls: the labels swapped (a pair's rejected row desirable), no end-of-text token."""
    controls = {"labels swapped": ({"swap_labels": True}, False), "no end-of-text token": ({"no_eos": True}, False)}
    assert run_and_compare(folders, tmp_path / "run", "pairs", "kto", MODES["one batch"], controls) < TOLERANCE


@pytest.mark.launch
def test_two_ranks_take_the_steps_of_the_mean_row_loss_with_the_steps_kl_estimate(folders, tmp_path):
    """2 gloo ranks, each 2 of the step's 4 rows: the same formula, z over all 4 (the control: each rank's z over its
    own 2 rows, which no gather adds up)."""
    controls = {**MATCHED, "z per rank": ({}, True)}
    diff = run_and_compare(folders, tmp_path / "run", "chats", "kto", TWO_RANKS["two ranks"], controls, ranks=2)
    assert diff < TOLERANCE
