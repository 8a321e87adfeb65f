"""The bundled tool task (issue 47): `--dataset tool-sums`, chats in TRL's tool-calling format that add with a tool
(a fifth recovering from a wrong first call), `--dataset sum-questions`, their prompts and answers, and the recipe
examples/tool_use.py that trains on them (its runs are minutes long: the guide gives its figures), whose held-out
sums are asked in neither set and whose figures (called, well-formed calls, right) mean what the guide says."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import ROOT
from hfmodels import tool_tokenizer

from anytrain.data import sums
from anytrain.data.sources import read_dataset
from anytrain.tasks.causal_lm.turns import Conversation

transformers = pytest.importorskip("transformers")


def recipe():
    spec = importlib.util.spec_from_file_location("tool_use", ROOT / "examples" / "tool_use.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tool_sums_are_tool_calling_chats_whose_every_answer_is_the_sum():
    data, name = read_dataset("tool-sums")
    assert name.startswith("tool-sums (bundled: 4000") and len(data) == sums.ROWS
    assert json.loads(data[0]["tools"]) == sums.schema() and sums.schema()[0]["function"]["name"] == "add"
    wrong = 0
    for row in data.select(range(500)):
        messages = row["messages"]
        a, b = (int(x) for x in messages[0]["content"][len("What is ") : -1].split(" + "))
        calls = [
            m["tool_calls"][0]["function"]["arguments"]
            for m in messages
            if m["role"] == "assistant" and m["tool_calls"]
        ]
        results = [m["content"] for m in messages if m["role"] == "tool"]
        assert calls[-1] == {"a": a, "b": b} and results[-1] == str(a + b) == messages[-1]["content"] == row["answer"]
        if len(calls) == 2:  # the wrong first call: b left out, answered with the tool's error
            wrong += 1
            assert calls[0] == {"a": a, "b": None} and "NoneType" in results[0] and results[0].startswith("{'error'")
        assert 4 <= len(str(a)) <= 6 and 4 <= len(str(b)) <= 6
    assert 0.15 < wrong / 500 < 0.25  # WRONG = 0.2


def test_the_tool_template_renders_a_tool_sum_with_its_call_and_the_tools_answer():
    row = sums.rows(1)[0]
    text = tool_tokenizer().apply_chat_template(row["messages"], tools=sums.schema(), tokenize=False)
    a, b = row["messages"][1]["tool_calls"][0]["function"]["arguments"].values()
    assert f'{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}' in text
    assert f"<tool_response>\n{row['answer']}\n</tool_response>" in text and '"name": "add"' in text.split("<tools>")[1]


def test_digits_makes_every_number_that_wide_and_leaves_the_bundled_sums_as_they_are():
    for digits in (2, 4):
        chats, questions = sums.load_tool_sums(digits), sums.load_sum_questions(200, digits=digits)
        for text in [r["messages"][0]["content"] for r in chats.select(range(200))] + [
            r["prompt"][0]["content"] for r in questions
        ]:
            assert [len(x) for x in text[len("What is ") : -1].split(" + ")] == [digits, digits]
        assert all(r["messages"][-1]["content"] == r["answer"] for r in chats.select(range(50)))
    assert sums.rows(300) == sums.rows(300, digits=None)  # the default: 4 to 6 digits, the same rows
    widths = {len(x) for r in sums.rows(300) for x in r["messages"][0]["content"][len("What is ") : -1].split(" + ")}
    assert widths == {4, 5, 6}


def test_the_sum_questions_are_prompts_with_their_answers():
    data, _ = read_dataset("sum-questions")
    assert data.column_names == ["prompt", "answer"] and len(data) == sums.ROWS
    for row in data.select(range(100)):
        a, b = (int(x) for x in row["prompt"][0]["content"][len("What is ") : -1].split(" + "))
        assert row["prompt"][0]["role"] == "user" and len(row["prompt"]) == 1 and row["answer"] == str(a + b)


def test_the_recipe_asks_sums_asked_in_neither_set_and_measures_what_the_guide_says():
    example = recipe()
    rows = example.held_out(200)
    asked = {r["prompt"][0]["content"] for r in rows}
    seen = {r["messages"][0]["content"] for r in sums.rows()}
    seen |= {r["prompt"][0]["content"] for r in sums.load_sum_questions()}
    assert len(rows) == 200 and not asked & seen

    def talk(calls: int, failed: int, malformed: int, reply: str) -> Conversation:
        t = Conversation([], {}, [], calls=calls, failed=failed, malformed=malformed)
        t.messages = [{"role": "assistant", "content": reply}]
        return t

    talks = [talk(1, 0, 0, "12"), talk(2, 1, 0, "13"), talk(0, 0, 1, "12"), talk(0, 0, 0, "x")]
    answers = [{"answer": "12"}, {"answer": "13"}, {"answer": "7"}, {"answer": "9"}]
    assert example.measured(talks, answers) == {
        "called": 0.5,  # two of four called a tool
        "well_formed": 2 / 4,  # 3 calls (1 failed) + 1 malformed turn: 2 of 4 attempts ran without an error
        "right": 0.5,
    }
