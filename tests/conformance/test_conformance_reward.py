"""The specification of `--task reward`: one plain SGD step is lr times the gradient of the Bradley-Terry loss, the
mean over the optimizer step's pairs of

    -log sigma(r_c - r_r)

r being the sequence classifier's one output on the prompt followed by the chosen (c) or rejected (r) answer (TRL 1.16
RewardTrainer.compute_loss, without a margin column; its `center_rewards_coefficient` term is off by default, None,
and anytrain has none). The texts are TRL's (RewardTrainer._prepare_dataset): a chat rendered whole by the chat
template, text as prompt + answer + the end-of-text token. Accumulated micro-batches give the same step.

Model: the zoo's GPT-2 as a sequence classifier (GPT2ForSequenceClassification, its score head saved with it, so the
start is known), which reads its score at the last token that is not padding.
"""

from __future__ import annotations

import json

import pytest
import torch
from hfmodels import chat_tokenizer
from sgd import TOLERANCE, TWO_RANKS, float64_model, sgd_flags, step_difference, trained
from textdata import write_jsonl
from torch.nn.functional import logsigmoid
from zoo import tiny_config

from anytrain.data import preferences

transformers = pytest.importorskip("transformers")

ROWS = 4
AUTO = "AutoModelForSequenceClassification"


def text_pairs(n: int) -> list[dict]:
    return [{"prompt": f"Q: {r['prompt'][-1]['content']} A:", "chosen": " " + r["chosen"][0]["content"],
             "rejected": " " + r["rejected"][0]["content"]} for r in preferences.rows(n, seed=6)]  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("conform_reward")
    tokenizer = chat_tokenizer()
    config = tiny_config("gpt2", len(tokenizer))
    config.num_labels, config.pad_token_id, config.initializer_range = 1, tokenizer.eos_token_id, 0.1
    torch.manual_seed(0)
    transformers.GPT2ForSequenceClassification(config).save_pretrained(root / "gpt2")
    tokenizer.save_pretrained(root / "gpt2")
    out = {"model": root / "gpt2"}
    for name, rows in (("chats", preferences.rows(ROWS + 2, seed=4)), ("text", text_pairs(ROWS + 2))):
        (root / name).mkdir()
        for split, part in (("train", rows[:ROWS]), ("validation", rows[ROWS:-1]), ("test", rows[-1:])):
            write_jsonl(root / name / f"{split}.jsonl", part)
        out[name] = root / name
    return out


def reward(model, tokenizer, prompt, answer) -> torch.Tensor:
    if isinstance(prompt, str):
        ids = tokenizer(prompt + answer + tokenizer.eos_token)["input_ids"]
    else:
        ids = tokenizer.apply_chat_template(prompt + answer, tokenize=True, return_dict=True)["input_ids"]
    return model(input_ids=torch.tensor([ids])).logits[0, 0]


def bradley_terry(model, tokenizer, rows: list[dict]) -> torch.Tensor:
    margins = [reward(model, tokenizer, r["prompt"], r["chosen"]) - reward(model, tokenizer, r["prompt"], r["rejected"])
               for r in rows]  # fmt: skip
    return -logsigmoid(torch.stack(margins)).mean()


@pytest.mark.parametrize(
    "data, mode",
    [("chats", ["--batch-size", "4"]), ("chats", ["--batch-size", "2", "--grad-accum-steps", "2"]),
     ("text", ["--batch-size", "4"]), pytest.param("chats", "two ranks", marks=pytest.mark.launch)],
    ids=["chats", "chats accumulated", "text", "chats on two ranks"],
)  # fmt: skip
def test_the_first_sgd_step_is_the_mean_bradley_terry_loss(folders, tmp_path, data, mode):
    run, ranks = tmp_path / "run", 2 if mode == "two ranks" else 1
    mode = TWO_RANKS[mode] if ranks == 2 else mode
    flags = ["--task", "reward", "--model", f"hf:{folders['model']}", "--dataset", str(folders[data]), *mode]
    summary = trained(run, [*flags, "--max-length", "128", *sgd_flags()], ranks)
    assert summary["optimizer_steps"] == 1 and summary["task"] == "reward"
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["model"])
    start = float64_model(folders["model"], AUTO)
    rows = [json.loads(line) for line in (folders[data] / "train.jsonl").read_text().splitlines()]
    diff = step_difference(start, bradley_terry(start, tokenizer, rows), run, auto_class=AUTO)
    print(f"reward {data} {' '.join(mode)}: relative difference {diff:.2e}")
    assert diff < TOLERANCE
