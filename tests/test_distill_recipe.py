"""examples/distill_sums.py, on-policy distillation against SFT on the teacher's samples on the bundled sums, at its
--quick size (its default study takes minutes: docs/examples.md gives its figures): both branches start from the
same student, train the same steps on the same prompts with the same batch, the teacher's samples are its answers to
those prompts, the held-out sums are asked in neither set, the teacher trained on the chats answers in the tool's
form where the untrained student does not, and the table has its four rows; the scoring counts what it says.
In process (anytrain.train), no launch."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import ROOT

from anytrain.data import sums
from anytrain.tasks.causal_lm.turns import Conversation

transformers = pytest.importorskip("transformers")


def recipe():
    spec = importlib.util.spec_from_file_location("distill_sums", ROOT / "examples" / "distill_sums.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("distill_sums")
    example = recipe()
    return example, example.main(["--quick", "--out", str(out)]), out


def test_both_branches_train_the_same_steps_on_the_same_prompts_from_the_same_student(study):
    example, results, out = study
    args = example.options(["--quick"])
    on, off = results["runs"]["student, on-policy distilled"], results["runs"]["student, SFT on the teacher's samples"]
    assert on["task"] == "distill" and off["task"] == "sft"
    assert on["optimizer_steps"] == off["optimizer_steps"] == args.steps
    assert on["model"] == off["model"] == f"hf:{out / 'student' / 'hf'}"  # the student SFT'd --student-steps
    assert results["runs"]["student, start"]["optimizer_steps"] == args.student_steps > 0
    assert on["train_prompts"] == off["train_samples"] == args.steps * args.batch == results["prompts"]
    assert on["train_steps_per_epoch"] == args.steps  # each prompt once
    asked = [r["prompt"] for r in example.training_prompts(args.steps * args.batch, args.digits)]
    assert args.digits == 4 and all(len(p[0]["content"]) == len("What is 1234 + 5678?") for p in asked)
    samples = [json.loads(line) for line in (out / "teacher-samples.jsonl").read_text().splitlines()]
    assert [s["messages"][:1] for s in samples] == asked  # the teacher answered each training prompt once
    assert all(m["role"] in ("assistant", "tool") for s in samples for m in s["messages"][1:])
    completions = [json.loads(line) for line in (out / "on-policy" / "completions.jsonl").read_text().splitlines()]
    answered = sorted(json.dumps(c["prompt"]) for c in completions)  # every step is logged, all its completions
    assert answered == sorted(json.dumps(p) for p in asked)  # the student answered each training prompt once


def test_the_teacher_learnt_the_tools_form_and_the_table_has_every_row(study, capsys):
    example, results, _ = study
    scores = results["scores"]
    assert scores["teacher"]["called"] > 0.5
    assert list(scores) == list(example.STAGES) and len(example.STAGES) == 4
    assert results["parameters"]["teacher"] > 2 * results["parameters"]["student, start"]
    printed = example.table(results)
    for name in example.STAGES:
        assert f"| {name} | " in printed
    assert printed.count("\n") == 5  # the head, its rule, four rows


@pytest.mark.parametrize("digits", [None, 2, 4])
def test_the_held_out_sums_are_asked_in_neither_set(digits):
    example = recipe()
    asked = {r["prompt"][0]["content"] for r in example.held_out(300, digits)}
    seen = {r["messages"][0]["content"] for r in sums.rows(digits=digits)}
    seen |= {r["prompt"][0]["content"] for r in sums.load_sum_questions(digits=digits)}
    assert len(asked) == 300 and not asked & seen


def test_the_scoring_counts_right_replies_calls_and_right_calls():
    def talk(calls: list[dict], failed: int, malformed: int, reply: str) -> Conversation:
        t = Conversation([], {}, [], calls=len(calls), failed=failed, malformed=malformed)
        t.messages = [{"role": "assistant", "content": "", "tool_calls": [{"function": c} for c in calls]}] * bool(
            calls
        ) + [{"role": "assistant", "content": reply}]
        return t

    right = {"name": "add", "arguments": {"a": 1000, "b": 2000}}
    wrong = {"name": "add", "arguments": {"a": 1000, "b": None}}
    talks = [talk([right], 0, 0, "3000"), talk([wrong, right], 1, 0, "3000"), talk([], 0, 1, "3000"),
             talk([], 0, 0, "12")]  # fmt: skip
    rows = [{"prompt": [{"role": "user", "content": "What is 1000 + 2000?"}], "answer": "3000"}] * 4
    assert recipe().measured(talks, rows) == {
        "right": 0.75,
        "called": 0.5,
        "well_formed": 2 / 4,  # 3 calls (1 failed) and 1 malformed turn: 2 of 4 attempts ran without an error
        "right_call": 0.5,
    }
