"""The specification of `--task dpo`: one plain SGD step is lr times the gradient of the mean, over the optimizer
step's pairs, of the per-pair loss of --dpo-loss, with the starting model as the reference (`--reference cached`:
at step 0 the reference is the policy itself, detached). With pi the summed log-probability of an answer's tokens
(c chosen, r rejected), ref the reference's, n the answer's token count and a = pi / n:

    sigmoid  -log sigma(beta ((pi_c - ref_c) - (pi_r - ref_r)))            TRL 1.16 DPOTrainer._compute_loss, "sigmoid"
    ipo      ((pi_c - ref_c) / n_c - (pi_r - ref_r) / n_r - 1 / (2 beta))^2     the same, "ipo" (per-token, as TRL)
    simpo    -log sigma(beta (a_c - a_r) - gamma)                  SimPO (Meng et al. 2024, Eq. 6); TRL's CPOTrainer
                                                                   loss_type="simpo" with cpo_alpha=0
    orpo     -a_c - beta log sigma(log odds(a_c) - log odds(a_r)),  odds(a) = e^a / (1 - e^a)
                                                                   ORPO (Hong et al. 2024, Eqs. 2, 6, 7); the odds
                                                                   term is TRL's ORPOTrainer.odds_ratio_loss

The answer tokens are TRL's (sgd.trl_completion: the prompt, and each prompt + answer, tokenised; the answer from
where they part). Implicit prompts (text pairs without a prompt column) are split as TRL's `extract_prompt`
(trl/data_utils.py): the prompt is the shared beginning up to the first character where chosen and rejected differ,
less one space when that character follows a space; TRL then appends the end-of-text token to each answer.

Not the ORPO of TRL's ORPOTrainer in one respect: TRL's NLL term is the token mean of the chosen sequences' loss over
the whole batch, prompt tokens included; the paper's (and anytrain's) is each chosen answer's mean token loss.

Model: the zoo's Qwen2 (biased attention projections, rotary positions) with the tests' ChatML tokenizer.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from hfmodels import chat_tokenizer
from sgd import TOLERANCE, TWO_RANKS, answer_logps, float64_model, sgd_flags, step_difference, trained, trl_completion
from textdata import write_jsonl
from torch.nn.functional import logsigmoid
from zoo import save_tiny

from anytrain.data import preferences

transformers = pytest.importorskip("transformers")

ROWS = 4
BETA = {"sigmoid": 0.1, "ipo": 0.1, "simpo": 2.0, "orpo": 0.5}
GAMMA = 0.5  # --simpo-gamma
MODES = {"one batch": ["--batch-size", "4"], "accumulated": ["--batch-size", "2", "--grad-accum-steps", "2"],
         "packed": ["--batch-size", "4", "--packing"]}  # fmt: skip


def question(row: dict, answer: str) -> str:
    return f"Q: {row['prompt'][-1]['content']} A: {answer}"


def text_pairs(shared: bool) -> list[dict]:
    """Implicit-prompt text pairs from the bundled preferences, "Q: question A: answer" whole: answers that share
    their beginning ("16" and "15") or that differ from their first character ("4" and "5")."""
    rows = []
    for row in preferences.rows(80, seed=5):
        chosen, rejected = row["chosen"][0]["content"], row["rejected"][0]["content"]
        if bool(os.path.commonprefix([chosen, rejected])) == shared:
            rows.append({"chosen": question(row, chosen), "rejected": question(row, rejected)})
    if shared:  # and the answers of the suspected bug: one the other's beginning
        rows.insert(0, {"chosen": "Q: What is 100 + 25? A: 125.", "rejected": "Q: What is 100 + 25? A: 12."})
    return rows[: ROWS + 2]


MERGING = [  # the prompt's last token joins the chosen answer's first characters, not the rejected one's
    ("Q: Is it? A: what.", "Q: Is it? A: wh."),  # " w" "hat" against " w" "h": TRL's rejected answer is "h", ".", end
    ("Q: Where? A: Our house.", "Q: Where? A: Ou."),
    ("Q: Who? A: us.", "Q: Who? A: u."),
    ("Q: And? A: Use it.", "Q: And? A: Us."),
    ("Q: Hi? A: It is course.", "Q: Hi? A: It is co."),
    ("Q: Why? A: Because.", "Q: Why? A: Be."),
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("conform_dpo")
    out = {"model": save_tiny("qwen2", root / "qwen2", chat_tokenizer())}
    merging = [{"chosen": chosen, "rejected": rejected} for chosen, rejected in MERGING]
    sets = {"chats": preferences.rows(ROWS + 2, seed=3), "implicit": text_pairs(False), "shared": text_pairs(True),
            "merging": merging}  # fmt: skip
    for name, rows in sets.items():
        (root / name).mkdir()
        for split, part in (("train", rows[:ROWS]), ("validation", rows[ROWS:-1]), ("test", rows[-1:])):
            write_jsonl(root / name / f"{split}.jsonl", part)
        out[name] = root / name
    return out


def extract_prompt(chosen: str, rejected: str) -> tuple[str, str, str]:
    """TRL 1.16's trl.data_utils.extract_prompt for text: (prompt, chosen answer, rejected answer)."""
    idx = len(os.path.commonprefix([chosen, rejected]))
    if chosen[idx - 1] == " ":
        idx -= 1
    return chosen[:idx], chosen[idx:], rejected[idx:]


def pair_logps(model, tokenizer, row: dict) -> list[tuple[torch.Tensor, int]]:
    """(summed log-probability, token count) of the chosen and of the rejected answer."""
    if "prompt" in row:
        prompt, answers = row["prompt"], [row["chosen"], row["rejected"]]
    else:
        prompt, *answers = extract_prompt(row["chosen"], row["rejected"])
    out = []
    for ids, mask in trl_completion(tokenizer, prompt, answers):
        logps = answer_logps(model, ids, mask)
        out.append((logps.sum(), len(logps)))
    return out


def pair_loss(loss: str, pi_c, pi_r, n_c: int, n_r: int) -> torch.Tensor:
    """One pair's loss; the reference is the starting model (this very model, detached)."""
    beta, ref_c, ref_r = BETA[loss], pi_c.detach(), pi_r.detach()
    a_c, a_r = pi_c / n_c, pi_r / n_r
    if loss == "sigmoid":
        return -logsigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))
    if loss == "ipo":
        return ((pi_c - ref_c) / n_c - (pi_r - ref_r) / n_r - 1 / (2 * beta)) ** 2
    if loss == "simpo":
        return -logsigmoid(beta * (a_c - a_r) - GAMMA)
    log_odds = (a_c - a_r) - (torch.log(-torch.expm1(a_c)) - torch.log(-torch.expm1(a_r)))
    return -a_c - beta * logsigmoid(log_odds)


def dpo_loss(model, tokenizer, rows: list[dict], loss: str) -> torch.Tensor:
    """The mean over the step's pairs."""
    losses = []
    for row in rows:
        (pi_c, n_c), (pi_r, n_r) = pair_logps(model, tokenizer, row)
        losses.append(pair_loss(loss, pi_c, pi_r, n_c, n_r))
    return torch.stack(losses).mean()


def read_rows(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]


def one_step(folders, run, data: str, loss: str, *flags: str, ranks: int = 1) -> float:
    """The run's first update against the formula's gradient: their relative difference."""
    args = ["--task", "dpo", "--model", f"hf:{folders['model']}", "--dataset", str(folders[data]), *flags]
    args += ["--dpo-loss", loss, "--beta", str(BETA[loss]), "--simpo-gamma", str(GAMMA), "--max-length", "128"]
    summary = trained(run, [*args, *sgd_flags()], ranks)
    assert summary["optimizer_steps"] == 1 and summary["dpo_loss"] == loss
    assert summary["reference"] == ("none" if loss in ("simpo", "orpo") else "cached")
    assert ("packed_texts_kept_apart_by" in summary) == ("--packing" in flags)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["model"])
    start = float64_model(folders["model"])
    diff = step_difference(start, dpo_loss(start, tokenizer, read_rows(folders[data]), loss), run)
    print(f"dpo {loss} on {data}, {' '.join(flags)}: relative difference {diff:.2e}")
    return diff


@pytest.mark.parametrize(
    "loss, mode",
    [("sigmoid", "one batch"), ("ipo", "one batch"), ("simpo", "one batch"), ("orpo", "one batch"),
     ("sigmoid", "accumulated"), ("orpo", "accumulated"), ("sigmoid", "packed"), ("ipo", "packed")],
)  # fmt: skip
def test_the_first_sgd_step_is_the_mean_pair_loss(folders, tmp_path, loss, mode):
    assert one_step(folders, tmp_path / "run", "chats", loss, *MODES[mode]) < TOLERANCE


@pytest.mark.launch
@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_two_ranks_take_the_step_of_the_mean_pair_loss(folders, tmp_path, loss):
    """2 gloo ranks, each 2 of the step's 4 pairs: the same formula (the mean over all 4)."""
    assert one_step(folders, tmp_path / "run", "chats", loss, *TWO_RANKS["two ranks"], ranks=2) < TOLERANCE


@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_implicit_text_prompts_whose_answers_differ_from_their_first_character(folders, tmp_path, loss):
    """TRL's split gives back the space before the answer: the prompt ends at "A:", as anytrain's does."""
    assert one_step(folders, tmp_path / "run", "implicit", loss, "--batch-size", "4") < TOLERANCE


@pytest.mark.parametrize("loss", ["sigmoid", "ipo", "simpo", "orpo"])
def test_implicit_text_prompts_whose_answers_share_their_beginning(folders, tmp_path, loss):
    """Answers "16" and "15": TRL's prompt ends with the shared "1"; "125." against "12.": the answers are "5." and ".".
    The sigmoid loss cannot tell the splits apart (a shared token has the same log-probability in both answers and
    cancels in pi_c - pi_r); the per-token losses can (the answers' token counts differ): before issue 46 anytrain
    split at the last space (answers " 16" and " 15"), and ipo, simpo and orpo were 0.52, 0.50 and 0.67 away."""
    assert one_step(folders, tmp_path / "run", "shared", loss, "--batch-size", "4") < TOLERANCE


def test_implicit_text_prompts_whose_last_token_joins_one_answer_are_split_as_trl_splits_them(folders, tmp_path):
    """TRL 1.16 (DPOTrainer's tokenize_fn) starts both answers where the prompt's tokens and the first of the two
    sequences part (the shorter common_prefix_length): "... A: wh" is " w" "h" alone, " w" "hat" before the chosen
    answer's "at.", so the rejected answer is "h" "." and the end of text, 3 tokens, not 2. IPO's per-token
    log-ratios see the count (sigmoid's difference cancels it): splitting each sequence on its own (the characters
    each token holds) takes a step 0.87 of it away."""
    assert one_step(folders, tmp_path / "run", "merging", "ipo", "--batch-size", "4") < TOLERANCE
