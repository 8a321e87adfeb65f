"""The specification of `--task sft`: one plain SGD step is lr times the gradient of the mean negative log-likelihood
over every answer token of the optimizer step (TRL 1.16 SFTTrainer.compute_loss: -log_probs summed over the labelled
tokens, divided by num_items_in_batch, the step's labelled tokens over its accumulated micro-batches).

The answer tokens, as TRL labels them: for chats with several assistant turns (assistant-only loss, TRL's
`{% generation %}` templates, e.g. trl/chat_templates/qwen2_5_training.jinja), each assistant turn's content and
its end-of-turn tokens, i.e. what the model generates after the generation prompt (the training template also counts
the newline after "assistant", which is the generation prompt's); for prompt/completion text (completion-only loss),
the completion with the end-of-text token TRL appends, from where the prompt's tokens and the whole text's part.
Each case is the same formula: one batch, two accumulated micro-batches (the mean is over the whole step's tokens,
not a mean of micro-batch means), and --packing (the texts kept apart in packed rows).

Tool-calling chats (TRL's `tool_calls` and `tool` messages, a `tools` column of schemas, here as JSON text): the
answer tokens are each assistant turn as the rendered ChatML shows it, after `<|im_start|>assistant\n` through its
`<|im_end|>\n`: its text, its `<tool_call>` blocks and its end of turn; the tool results (the template's user turns
of `<tool_response>`) and the tools block are not (trl/chat_templates/qwen2_5_training.jinja's `{% generation %}`
holds the same text, calls included, the generation prompt's newline aside as above). The control there learns the
tool results too.

Models: the tests' Llama with a ChatML template (chats; with the tools template for tool chats), the zoo's GPT-2
(absolute positions, tied embeddings) for prompt/completion text.
"""

from __future__ import annotations

import json
import re

import pytest
import toolchats
import torch
from hfmodels import gpt2_tokenizer, tiny_llama
from sgd import (
    TOLERANCE,
    TWO_RANKS,
    answer_logps,
    answer_mask,
    float64_model,
    sgd_flags,
    step_difference,
    trained,
    trl_completion,
)
from textdata import write_jsonl
from zoo import save_tiny

from anytrain.data import instructions

transformers = pytest.importorskip("transformers")

ROWS = 4  # the training split: one optimizer step of all its rows
MODES = {"one batch": ["--batch-size", "4"], "accumulated": ["--batch-size", "2", "--grad-accum-steps", "2"],
         "packed": ["--batch-size", "4", "--packing"]}  # fmt: skip


def multi_turn_chats(n: int) -> list[dict]:
    """n of the bundled chats with two or more assistant turns (some with a system message)."""
    rows = instructions.rows(200, seed=11)
    return [r for r in rows if sum(m["role"] == "assistant" for m in r["messages"]) >= 2][:n]


def tool_chats(n: int) -> list[dict]:
    """n generated tool chats (tests/toolchats.py), tools as JSON text; the first four hold a call beside text, two
    calls in one turn, a system line, a chat that ends at its call and one that ends with a text answer."""
    rows = toolchats.rows(n, seed=7, as_json=True)
    turns = [turn for row in rows[:ROWS] for turn in row["messages"] if turn.get("tool_calls")]
    assert any(turn.get("content") for turn in turns) and any(len(turn["tool_calls"]) == 2 for turn in turns)
    assert any(row["messages"][0]["role"] == "system" for row in rows[:ROWS])
    assert {bool(row["messages"][-1].get("tool_calls")) for row in rows[:ROWS]} == {True, False}
    return rows


def prompt_completions(n: int) -> list[dict]:
    rows = instructions.rows(n, seed=12)
    return [{"prompt": f"Q: {r['messages'][-2]['content']}\nA:", "completion": " " + r["messages"][-1]["content"]}
            for r in rows]  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("conform_sft")
    out = {"llama": tiny_llama(root / "llama"), "gpt2": save_tiny("gpt2", root / "gpt2", gpt2_tokenizer())}
    out["tool-llama"] = tiny_llama(root / "tool-llama", tools=True)
    data = {"chats": multi_turn_chats(ROWS + 2), "pairs": prompt_completions(ROWS + 2), "tools": tool_chats(ROWS + 2)}
    for name, rows in data.items():
        (root / name).mkdir()
        for split, part in (("train", rows[:ROWS]), ("validation", rows[ROWS:-1]), ("test", rows[-1:])):
            write_jsonl(root / name / f"{split}.jsonl", part)
        out[name] = root / name
    return out


def chat_answers(tokenizer, messages: list[dict]) -> tuple[list[int], list[bool]]:
    """The chat rendered once; its answers: each assistant turn from the end of the generation prompt before it
    through the end of the turn (the text the model generates, its end-of-turn tokens included)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for k, turn in enumerate(messages):
        if turn["role"] == "assistant":
            start = len(tokenizer.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True))
            through = tokenizer.apply_chat_template(messages[: k + 1], tokenize=False)
            assert text.startswith(through) and through.endswith(turn["content"] + "<|im_end|>\n")
            spans.append((start, len(through)))
    return answer_mask(tokenizer, text, spans, special=False)


ASSISTANT_TURN = re.compile(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>\n)", re.S)
TOOL_RESULTS = re.compile(r"<\|im_start\|>user\n(<tool_response>.*?<\|im_end\|>\n)", re.S)


def tool_chat_answers(tokenizer, row: dict, results: bool = False) -> tuple[list[int], list[bool]]:
    """A tool chat rendered once, with its tools: its answers are the assistant turns as the ChatML text shows them,
    from after `<|im_start|>assistant\n` through `<|im_end|>\n` (`results`, the control: the tool results too)."""
    text = tokenizer.apply_chat_template(row["messages"], tools=json.loads(row["tools"]), tokenize=False)
    spans = [m.span(1) for m in ASSISTANT_TURN.finditer(text)]
    assert len(spans) == sum(turn["role"] == "assistant" for turn in row["messages"])
    answers = "".join(text[a:b] for a, b in spans)
    for call in (c["function"] for turn in row["messages"] for c in turn.get("tool_calls") or []):
        assert f'<tool_call>\n{{"name": "{call["name"]}", "arguments": {json.dumps(call["arguments"])}}}' in answers
    assert '"description": "Add."' in text[: spans[0][0]]  # the tools block, before the first answer
    if results:
        spans += [m.span(1) for m in TOOL_RESULTS.finditer(text)]
    return answer_mask(tokenizer, text, spans, special=False)


def answer_sequences(tokenizer, rows: list[dict], results: bool = False) -> list[tuple[list[int], list[bool]]]:
    if "tools" in rows[0]:
        return [tool_chat_answers(tokenizer, row, results) for row in rows]
    if "messages" in rows[0]:
        return [chat_answers(tokenizer, row["messages"]) for row in rows]
    return [trl_completion(tokenizer, row["prompt"], [row["completion"]])[0] for row in rows]


def sft_loss(model, tokenizer, rows: list[dict], results: bool = False) -> torch.Tensor:
    """sum over the step's answer tokens of -log p(token | what precedes it), over their count."""
    logps = torch.cat([answer_logps(model, *seq) for seq in answer_sequences(tokenizer, rows, results)])
    assert len(logps) >= 3 * len(rows)
    return -logps.sum() / len(logps)


def per_text_means(model, tokenizer, rows: list[dict]) -> torch.Tensor:
    """The control: each text's mean token loss, averaged over the texts (not what TRL computes)."""
    return torch.stack([-answer_logps(model, *seq).mean() for seq in answer_sequences(tokenizer, rows)]).mean()


def first_step(folders, run, data: str, model: str, mode: str, max_length: int = 128):
    """The run of the first step on the case, its summary checked; (the starting model in float64, its tokenizer, the
    training rows)."""
    given = {**MODES, **TWO_RANKS}[mode]
    flags = ["--task", "sft", "--model", f"hf:{folders[model]}", "--dataset", str(folders[data]), *given]
    summary = trained(run, [*flags, "--max-length", str(max_length), *sgd_flags()], 2 if mode in TWO_RANKS else 1)
    assert summary["optimizer_steps"] == 1 and summary["task"] == "sft" and summary["truncated_train_tokens"] == 0
    assert ("packed_texts_kept_apart_by" in summary) == (mode == "packed")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders[model])
    rows = [json.loads(line) for line in (folders[data] / "train.jsonl").read_text().splitlines()]
    return float64_model(folders[model]), tokenizer, rows


@pytest.mark.parametrize("mode", [*MODES, pytest.param("two ranks", marks=pytest.mark.launch)])
@pytest.mark.parametrize("data, model", [("chats", "llama"), ("pairs", "gpt2")])
def test_the_first_sgd_step_is_the_mean_answer_token_loss(folders, tmp_path, data, model, mode):
    start, tokenizer, rows = first_step(folders, tmp_path / "run", data, model, mode)
    diff = step_difference(start, sft_loss(start, tokenizer, rows), tmp_path / "run")
    control = step_difference(start, per_text_means(start, tokenizer, rows), tmp_path / "run")
    print(f"sft {data} ({model}), {mode}: relative difference {diff:.2e} (per-text means: {control:.2e})")
    assert diff < TOLERANCE and control > 100 * TOLERANCE


@pytest.mark.parametrize("mode", MODES)
def test_the_first_sgd_step_on_tool_chats_learns_the_calls_and_not_the_tool_results(folders, tmp_path, mode):
    start, tokenizer, rows = first_step(folders, tmp_path / "run", "tools", "tool-llama", mode, 1024)
    diff = step_difference(start, sft_loss(start, tokenizer, rows), tmp_path / "run")
    control = step_difference(start, sft_loss(start, tokenizer, rows, results=True), tmp_path / "run")
    print(f"sft tool chats, {mode}: relative difference {diff:.2e} (the tool results learned too: {control:.2e})")
    assert diff < TOLERANCE and control > 100 * TOLERANCE
