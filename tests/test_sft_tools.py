"""Supervised fine-tuning on tool-calling chats in TRL's format (`--task sft`, issue 47): assistant turns with
`tool_calls`, `tool` messages with the results, and a `tools` column of JSON schemas (a list, or its JSON text),
rendered by the model's chat template (tests/hfmodels.py's TOOLS_TEMPLATE, Qwen 2.5's layout) with `tools=` in every
rendering. The targets are the assistant turns with their rendered calls and end of turn, never a tool's result nor
the tools block; both forms of the column give the same tokens; evaluation generates a last call from what precedes
it; a template that cannot render tools and a malformed call are one line each; a short run learns.
(The first SGD step on tool chats is held to its formula in tests/conformance/test_conformance_sft.py.)"""

from __future__ import annotations

import json
import re

import pytest
import toolchats
from conftest import read_metrics, run_cli_error
from hfchecks import in_process, target_runs
from hfmodels import tiny_llama, tool_tokenizer
from textdata import write_jsonl

from anytrain.config import ConfigError
from anytrain.shape import IGNORE
from anytrain.tasks.causal_lm.answers import last_answer
from anytrain.tasks.causal_lm.chats import MESSAGES, Renderer, tokenise

pytest.importorskip("transformers")

CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
CHAT = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "name": "add", "content": "RESULT_5_OF_ADD"},
    {"role": "assistant", "content": "It is 5."},
    {"role": "user", "content": 'Spell "bako" backwards.'},
    {"role": "assistant", "content": "Reversing.", "tool_calls": [toolchats.call("reverse", word="bako")]},
]
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
REVERSE_TEXT = 'Reversing.\n<tool_call>\n{"name": "reverse", "arguments": {"word": "bako"}}\n</tool_call>'


def encoded(tokenizer, row: dict, form: str = MESSAGES):
    """The row's one text's ids and labels, and the text (as sft renders and tokenises it)."""
    [(text, spans)] = Renderer(form, MESSAGES, tokenizer, "rows", "train")(row, 3)
    return *tokenise(tokenizer, text, spans, False), text


def test_the_targets_of_a_tool_chat_are_its_calls_and_answers_not_the_tool_results():
    tokenizer = tool_tokenizer()
    ids, labels, text = encoded(tokenizer, {"messages": CHAT, "tools": toolchats.schemas()})
    runs = target_runs(tokenizer, ids, labels)
    assert runs == [f"{CALL_TEXT}<|im_end|>\n", "It is 5.<|im_end|>\n", f"{REVERSE_TEXT}<|im_end|>\n"]
    assert "RESULT_5_OF_ADD" in text and not any("RESULT_5_OF_ADD" in run or "tool_response" in run for run in runs)
    assert text.count("<tool_call>") == 3 and not any("# Tools" in run for run in runs)  # the block's is context


def test_the_tools_column_as_a_list_or_as_json_text_renders_the_schemas_into_the_prompt():
    tokenizer, tools = tool_tokenizer(), toolchats.schemas()
    ids, labels, text = encoded(tokenizer, {"messages": CHAT, "tools": tools})
    assert encoded(tokenizer, {"messages": CHAT, "tools": json.dumps(tools)}) == (ids, labels, text)
    first = next(k for k, label in enumerate(labels) if label != IGNORE)
    prompt = tokenizer.decode(ids[:first])
    assert '<tools>\n{"type": "function", "function": {"name": "add", "description": "Add."' in prompt
    assert '"name": "reverse"' in prompt and prompt.endswith("<|im_start|>assistant\n")
    plain = tokenizer.apply_chat_template(CHAT, tokenize=False)  # no tools (null, empty): no tools block
    assert plain != text and all(encoded(tokenizer, {"messages": CHAT, "tools": none})[2] == plain
                                 for none in (None, [], "", "[]"))  # fmt: skip
    pair = {"prompt": CHAT[:2], "completion": CHAT[2:], "tools": json.dumps(tools)}  # TRL's other form
    assert encoded(tokenizer, pair, "prompt-completion") == (ids, labels, text)


def test_evaluation_generates_a_last_call_from_the_chat_and_tools_before_it():
    """The exact match's prompt is the chat before its last answer with the tools and the generation prompt; what
    it expects is the rendered call, as the template writes it (its text and <tool_call> blocks)."""
    import torch

    tokenizer, tools = tool_tokenizer(), toolchats.schemas()
    ids, labels, _ = encoded(tokenizer, {"messages": CHAT, "tools": tools})
    prompt, answer = last_answer(torch.tensor(ids), torch.tensor(labels), len(ids))
    asked = tokenizer.apply_chat_template(CHAT[:-1], tools=tools, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(prompt) == asked
    assert tokenizer.decode(answer, skip_special_tokens=True).strip() == REVERSE_TEXT


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft_tools")
    split = root / "split"
    split.mkdir()
    rows = toolchats.rows(48, seed=1)
    for name, part in (("train", rows[:40]), ("validation", rows[40:44]), ("test", rows[44:])):
        write_jsonl(split / f"{name}.jsonl", part)
    return {"split": split, "tools": tiny_llama(root / "tools", tools=True), "plain": tiny_llama(root / "plain")}


def test_tool_chats_are_refused_in_one_line_where_the_template_cannot_render_them(folders, tmp_path, capsys):
    out = ["--output-dir", str(tmp_path / "run"), "--max-length", "1024"]
    plain = ["--task", "sft", "--model", f"hf:{folders['plain']}", *out]
    err = run_cli_error(capsys, [*plain, "--dataset", str(folders["split"])])
    assert "row 0 of the train split of" in err and "column 'tools': the model's chat template cannot render" in err
    no_column = [{"messages": row["messages"]} for row in toolchats.rows(30, seed=2)]
    err = run_cli_error(capsys, [*plain, "--dataset", str(write_jsonl(tmp_path / "calls.jsonl", no_column))])
    assert "row 0 of the train split" in err and "its tool calls: the model's chat template cannot render" in err
    assert not (tmp_path / "run").exists()


def test_a_malformed_tool_call_or_tools_column_names_its_row(folders, tmp_path, capsys):
    args = ["--task", "sft", "--model", f"hf:{folders['tools']}", "--output-dir", str(tmp_path / "run")]
    cases = {  # the call, the tool's result, what the line says
        "no function name": ({"type": "function", "function": {"arguments": {"a": 1}}}, "5", "without function.name"),
        "a call as text": ('{"name": "add"}', "5", "a tool call without function.name"),
        "a result not text": (CALL, 5, "a tool message without text content"),
        "calls not a list": (None, "5", "tool_calls must be a list"),
    }
    for case, (call, result, said) in cases.items():
        rows = toolchats.rows(30, seed=3, as_json=True)
        calls = [call] if call is not None else {"name": "add"}
        rows[5] = {**rows[5], "messages": [CHAT[1], {"role": "assistant", "content": "", "tool_calls": calls},
                                           {"role": "tool", "name": "add", "content": result}]}  # fmt: skip
        err = run_cli_error(capsys, [*args, "--dataset", str(write_jsonl(tmp_path / "bad.jsonl", rows))])
        assert "row 5 of the train split of" in err and said in err, (case, err)
    tokenizer = tool_tokenizer()
    for row, said in (
        ({"prompt": "Q?", "completion": "A", "tools": toolchats.schemas()}, "tools (column 'tools') need chats"),
        ({"messages": [{**CHAT[1], "tool_calls": [CALL]}, CHAT[4]]}, "a user message with tool_calls"),
        ({"messages": CHAT, "tools": [["add"]]}, "column 'tools': expected a list of JSON schemas"),
    ):
        with pytest.raises(ConfigError, match=r"row 3 of the train split of rows.*" + re.escape(said)):
            encoded(tokenizer, row, "prompt-completion" if "prompt" in row else MESSAGES)
    rows = toolchats.rows(30, seed=3, as_json=True)
    rows[4]["tools"] = "[{not json"
    err = run_cli_error(capsys, [*args, "--dataset", str(write_jsonl(tmp_path / "bad.jsonl", rows))])
    assert "row 4 of the train split of" in err and "column 'tools': not JSON" in err
    assert not (tmp_path / "run").exists()


def test_a_short_run_on_tool_chats_learns_them(folders, tmp_path, capsys):
    flags = ["--model", f"hf:{folders['tools']}", "--dataset", str(folders["split"]), "--max-length", "1024"]
    summary = in_process(tmp_path / "run", *flags, "--epochs", "4", "--batch-size", "8", "--lr", "1e-2")
    assert summary["task"] == "sft" and summary["truncated_train_tokens"] == 0
    first = read_metrics(tmp_path / "run")[0]["loss"]
    print(f"tool chats: first loss {first:.3f}, val_loss {summary['val_loss']:.3f}, test_exact_match "
          f"{summary['test_exact_match']:.2f}")  # fmt: skip
    assert summary["val_loss"] < first / 3, (first, summary["val_loss"])  # measured 5.06 -> 1.14
    out = capsys.readouterr().out
    assert "assistant answers in" in out and "call tools: the calls are learned as the chat template renders" in out
    assert "(expected '<tool_call>" in out  # a last call generated at evaluation, compared with the rendered call
