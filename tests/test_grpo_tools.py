"""--task grpo with tools (issue 47): --tools and --environment, multi-turn completions as TRL's GRPOTrainer makes
them. Tools are a file's public functions or the named ones, checked as transformers makes their schemas; a call is
answered as TRL answers it (an unknown tool, bad arguments, an exception, a hang past --tool-timeout: an error the
model reads, counted); a conversation appends the tools' answers exactly as the chat template renders them and
learns only the model's tokens; the figures count calls, failures, turns; reward functions get the conversation;
each completion has its own environment, reset with its row; bad input is one line each. The gradient with the
tools' tokens masked: tests/conformance/test_conformance_grpo_tools.py. A tiny random model writes no calls: the
first turns are scripted (tests/tooldata.py), every later turn is the model's."""

from __future__ import annotations

import contextlib
import io
import json
import time

import pytest
import torch
from conftest import kill_and_resume, launch, max_abs_diff, read_metrics, read_summary
from hfchecks import in_process
from hfmodels import chat_tokenizer, tiny_llama, tool_tokenizer
from textdata import write_jsonl
from tooldata import KINDS, TOOLS, scripted, sum_rows, write_sums

from anytrain import load_model
from anytrain.config import ConfigError, TrainConfig
from anytrain.tasks.causal_lm.tools import check_parses, check_renders_tools, load_tools, run_call
from anytrain.tasks.causal_lm.turns import Conversation, Toolkit, assembled

transformers = pytest.importorskip("transformers")

REWARDS = '''
def called(prompts, completions, completion_ids, **columns):
    """1.0 where the completion called a tool (a tool's message follows), 0.1 per character of its last reply."""
    return [float(any(m["role"] == "tool" for m in c)) + 0.1 * len(c[-1].get("content") or "") for c in completions]


def answered(prompts, completions, completion_ids, answer, **columns):
    """1.0 where a tool's message holds the row's answer: the conversation, as TRL gives it."""
    return [float(any(m["role"] == "tool" and m["content"] == a for m in c)) for c, a in zip(completions, answer)]
'''

ENVIRONMENT = '''
class Adder:
    """One completion's world: the row's answer, the calls made."""

    def __init__(self):
        self.answer, self.calls, self.resets = None, [], 0

    def reset(self, prompt, answer, **row):
        self.answer, self.resets = answer, self.resets + 1
        return " Use the add tool."

    def add(self, a: int, b: int) -> int:
        """Add two whole numbers.

        Args:
            a: the first number
            b: the second number
        """
        total = a + b
        self.calls.append((a, b))
        return total

    def get_reward(self) -> float:
        return float(any(str(a + b) == self.answer for a, b in self.calls))


class NoReset:
    def add(self, a: int) -> int:
        """Add.

        Args:
            a: a number
        """
        return a


def fresh(prompts, completions, completion_ids, environments, answer, **columns):
    """1.0 where every completion has its own instance, reset once with its own row."""
    own = len({id(e) for e in environments}) == len(environments)
    return [float(own and e.resets == 1 and e.answer == a) for e, a in zip(environments, answer)]
'''

G, NEW = 5, 120  # completions per prompt (one of each kind, by their keys, now and then), --max-new-tokens


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo_tools")
    (root / "tools.py").write_text(TOOLS)
    (root / "rewards.py").write_text(REWARDS)
    (root / "env.py").write_text(ENVIRONMENT)
    rows = write_sums(root / "data", held_out=1)
    return {"root": root, "model": tiny_llama(root / "llama", tools=True), "data": root / "data", "rows": rows,
            "tools": root / "tools.py", "rewards": root / "rewards.py", "env": root / "env.py"}  # fmt: skip


def flags(folders, *more: str) -> list[str]:
    return [
        "--task", "grpo", "--model", f"hf:{folders['model']}", "--dataset", str(folders["data"]),
        "--num-generations", str(G), "--max-new-tokens", str(NEW), "--batch-size", "2", "--max-steps", "1",
        "--log-every-steps", "1", "--seed", "3", "--optimizer", "sgd", "--lr", "0.05", *more,
    ]  # fmt: skip


# --------------------------------------------------------------------------- tools, calls, templates


def test_tools_are_a_files_public_functions_or_the_named_ones_each_refused_in_one_line(folders, tmp_path):
    path = folders["tools"]
    assert [t.__name__ for t in load_tools([str(path)])] == ["add", "wait"]  # not floor (imported), not _private
    assert [t.__name__ for t in load_tools([f"{path}:add"])] == ["add"]
    bad = tmp_path / "bad.py"
    bad.write_text(
        'def nodoc(a: int) -> int:\n    return a\n\n\ndef nohint(a):\n    """No hint.\n\n    Args:\n        a: x\n'
        '    """\n    return a\n\n\nvalue = 3\n'
    )
    cases = [
        ([str(tmp_path / "missing.py")], "--tools .*missing.py: file not found"),
        ([f"{path}:mul"], "has no attribute 'mul'"),
        ([f"{bad}:nodoc"], "nodoc cannot be a tool"),
        ([f"{bad}:nohint"], "nohint cannot be a tool"),
        ([f"{bad}:value"], "value is not a function"),
        ([f"{path}:add", f"{path}:add"], "two tools are called the same"),
        (["add"], "expected FILE.py:function"),
    ]
    for specs, message in cases:
        with pytest.raises(ConfigError, match=message) as refused:
            load_tools(specs)
        assert "\n" not in str(refused.value)


def test_a_call_is_answered_as_trl_answers_it_and_a_failure_is_counted(folders):
    tools = {t.__name__: t for t in load_tools([str(folders["tools"])])}

    def call(name, **arguments):
        return {"type": "function", "function": {"name": name, "arguments": arguments}}

    assert run_call(tools, call("add", a=2, b=3), 1.0) == ({"role": "tool", "name": "add", "content": "5"}, False)
    unknown, failed = run_call(tools, call("mul", a=2, b=3), 1.0)
    assert failed and unknown == {"role": "tool", "name": "mul", "content": str({"error": "Tool mul not found."})}
    missing, failed = run_call(tools, call("add", a=2), 1.0)
    assert failed and "missing 1 required positional argument: 'b'" in missing["content"]
    wrong, failed = run_call(tools, call("add", a=2, b="many"), 1.0)
    assert failed and "unsupported operand" in wrong["content"]
    started = time.perf_counter()
    hung, failed = run_call(tools, call("wait", seconds=60), 0.2)
    assert failed and hung["content"] == str({"error": "timed out after 0.2 s"})
    assert time.perf_counter() - started < 30  # not the tool's 60 s


def test_a_template_that_cannot_render_or_parse_tool_calls_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="^--tools: the model's chat template cannot render tool calls"):
        check_renders_tools(chat_tokenizer(), "--tools")  # ChatML that reads only `content`: the call would vanish
    blind = tool_tokenizer()
    blind.response_template = None
    with pytest.raises(ConfigError, match="^--tools: the model's tokenizer has no response_template"):
        check_parses(blind, "--tools")
    check_renders_tools(tool_tokenizer(), "--tools")
    check_parses(tool_tokenizer(), "--tools")


# --------------------------------------------------------------------------- a conversation


def a_conversation(folders, max_calls: int = 10, positions: int = 1024):
    from transformers.utils import get_json_schema

    tokenizer = tool_tokenizer()
    (add,) = load_tools([f"{folders['tools']}:add"])
    schemas = [get_json_schema(add)]
    prompt = [{"role": "user", "content": "What is 1234 + 4321?"}]
    text = tokenizer.apply_chat_template(prompt, tools=schemas, tokenize=False, add_generation_prompt=True)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    kit = Toolkit(tokenizer, [tokenizer.eos_token_id, end], positions, max_calls, 1.0)
    talk = Conversation(tokenizer(text).input_ids, {"add": add}, schemas)
    call = tokenizer('<tool_call>\n{"name": "add", "arguments": {"a": 1234, "b": 4321}}\n</tool_call>').input_ids
    return tokenizer, kit, talk, prompt, call + [end], end


def test_a_conversation_appends_what_the_template_renders_and_learns_only_the_models_tokens(folders):
    tokenizer, kit, talk, prompt, call, end = a_conversation(folders)
    talk.take(call, True, kit, room=NEW)
    assert talk.open and (talk.calls, talk.failed, talk.turns) == (1, 0, 1)
    function = {"name": "add", "arguments": {"a": 1234, "b": 4321}}  # typed by the tool's schema
    assert talk.messages == [
        {"role": "assistant", "tool_calls": [{"type": "function", "function": function}]},
        {"role": "tool", "name": "add", "content": "5555"},
    ]
    # independently: the conversation as the template renders it, up to the next generation prompt
    whole = tokenizer.apply_chat_template(
        [*prompt, *talk.messages], tools=talk.schemas, tokenize=False, add_generation_prompt=True
    )
    assert tokenizer.decode(talk.prefix + talk.ids) == whole
    answer = tokenizer("5555").input_ids + [end]
    talk.take(answer, True, kit, room=NEW - len(call))
    assert not talk.open and talk.turns == 2 and talk.messages[-1] == {"role": "assistant", "content": "5555"}

    other = Conversation(talk.prefix[3:], {}, talk.schemas)  # an empty completion beside it, its prompt shorter
    done = assembled([talk, other], 0, torch.device("cpu"))
    region, real = done.ids[0, done.width :], done.mask[0, done.width :].bool()
    assert region[done.completion[0]].tolist() == call + answer  # the model's turns, and nothing else, learned
    told = tokenizer.decode(region[real & ~done.completion[0]])
    assert told == whole[len(tokenizer.decode(talk.prefix + call)) :]  # the tools' tokens: the template's text
    assert done.completion_ids()[0] == talk.ids  # what the reward functions get: every token after the prompt
    real_positions = done.positions[0][done.mask[0].bool()]
    assert real_positions.tolist() == list(range(len(talk.prefix) + len(talk.ids)))
    assert done.completion[1].sum() == 0 and done.mask[1, done.width :].sum() == 0


def test_a_call_past_max_tool_calls_or_without_room_ends_the_completion_unanswered(folders):
    tokenizer, kit, talk, _, call, _ = a_conversation(folders, max_calls=1)
    talk.take(call, True, kit, room=NEW)
    talk.take(call, True, kit, room=NEW)  # a second call, --max-tool-calls 1 made: not run
    assert not talk.open and talk.calls == 1 and talk.messages[-1]["role"] == "assistant"
    assert sum(1 for m in talk.messages if m["role"] == "tool") == 1

    tokenizer, kit, talk, _, call, _ = a_conversation(folders, positions=len(a_conversation(folders)[2].prefix) + 60)
    talk.take(call, True, kit, room=NEW)  # its answer would pass the model's positions
    assert not talk.open and talk.calls == 1 and talk.ids == call and talk.learned == [True] * len(call)
    tokenizer, kit, talk, _, call, _ = a_conversation(folders)
    talk.take(call, True, kit, room=0)  # its own tokens spent: the call is not run
    assert not talk.open and talk.calls == 0 and not talk.truncated


# --------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def tool_run(folders, tmp_path_factory):
    """One step with --tools (the first turns scripted): its summary, what was scripted, its folder, what it printed."""
    run, printed = tmp_path_factory.mktemp("tool_run") / "run", io.StringIO()
    with pytest.MonkeyPatch.context() as monkeypatch, contextlib.redirect_stdout(printed):
        seen = scripted(monkeypatch, transformers.AutoTokenizer.from_pretrained(folders["model"]))
        rewards = f"{folders['rewards']}:answered"
        summary = in_process(run, *flags(folders, "--tools", f"{folders['tools']}:add", "--reward", rewards))
    return summary, seen, run, printed.getvalue()


def test_a_run_with_tools_answers_counts_and_rewards_the_conversations(tool_run):
    summary, seen, run, printed = tool_run
    assert "anytrain: tools: at most 10 calls per completion (--max-tool-calls; TRL: no limit)\n" in printed
    step = [s["kind"] for s in seen[10:20]]  # after the start-up check's rollout (10 completions, forgotten)
    calls = sum(k in ("right", "bad argument", "unknown") for k in step)
    assert 0 < calls < len(step) and len(set(step)) >= 3
    figures = summary["train_last"]
    assert figures["tool_calls"] == pytest.approx(calls / 10) == figures["called_tools"]
    failures = sum(k in ("bad argument", "unknown") for k in step)
    assert figures["tool_failures"] == pytest.approx(failures / calls)
    assert figures["turns"] == pytest.approx((10 + calls) / 10)  # every answered call gets the model's next turn
    assert figures["malformed_turns"] == pytest.approx(step.count("malformed") / (10 + calls))
    assert figures["reward_answered"] == pytest.approx(step.count("right") / 10)  # the tool's answer was in the chat
    assert summary["val_greedy_reward"] == 1.0  # greedy: the right call, answered
    assert 0 < figures["time_tools"] < figures["time_generate"]  # the tools' time apart from the model's
    table = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    calls = [k in ("right", "bad argument", "unknown") for k in step[: len(table)]]  # the table: the first rows
    assert ["[call " in r["completion"] for r in table] == calls, (step, [r["completion"][:30] for r in table])
    assert all(" -> " in r["completion"] for r, called in zip(table, calls) if called)  # each call with its answer


def test_accumulated_micro_batches_equal_one_batch_with_tools(folders, tool_run, tmp_path, monkeypatch):
    summary, _, run, _ = tool_run
    scripted(monkeypatch, transformers.AutoTokenizer.from_pretrained(folders["model"]))
    more = ["--tools", f"{folders['tools']}:add", "--reward", f"{folders['rewards']}:answered"]
    accumulated = in_process(tmp_path / "run", *flags(folders, *more, "--grad-accum-steps", "2"))
    assert accumulated["train_last"]["tool_calls"] == summary["train_last"]["tool_calls"] > 0
    one, two = load_model(run).state_dict(), load_model(tmp_path / "run").state_dict()
    base = transformers.AutoModelForCausalLM.from_pretrained(folders["model"]).state_dict()
    diff = max((one[k] - two[k]).abs().max().item() for k in one)
    moved = max((one[k] - base[k]).abs().max().item() for k in one)  # what the step changed: far above the gap
    assert diff < 1e-7 < 1e-5 < moved, (diff, moved)


def test_each_completion_has_its_own_environment_reset_with_its_row(folders, tmp_path, monkeypatch):
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["model"])
    seen = scripted(monkeypatch, tokenizer)
    more = ["--environment", f"{folders['env']}:Adder", "--reward", f"{folders['env']}:fresh"]
    summary = in_process(tmp_path / "run", *flags(folders, *more))
    assert summary["rewards"] == ["fresh", "Adder"]  # get_reward: a reward function named after the class
    figures = summary["train_last"]
    assert figures["reward_fresh"] == 1.0  # every completion its own instance, reset once with its own row
    step = [s["kind"] for s in seen[10:20]]
    assert figures["reward_Adder"] == pytest.approx(step.count("right") / 10)  # the instance's state after the talk
    assert all(s["prompt"].rstrip().endswith("Use the add tool.<|im_end|>\n<|im_start|>assistant") for s in seen)
    assert '"name": "add"' in seen[0]["prompt"]  # its methods are the tools the template shows


@pytest.mark.parametrize(
    "more, message",
    [
        (["--environment", "{env}:NoReset", "--reward", "answer"], "NoReset has no reset method"),
        (["--environment", "{env}", "--reward", "answer"], "expected FILE.py:Class"),
        (["--tools", "{tools}:nowhere", "--reward", "answer"], "has no attribute 'nowhere'"),
        (["--tools", "{tools}"], "needs at least one reward function"),
    ],
)
def test_bad_tool_options_are_one_line_each(folders, tmp_path, more, message):
    given = [m.format(env=folders["env"], tools=folders["tools"]) for m in more]
    with pytest.raises(ConfigError, match=message) as refused:
        in_process(tmp_path / "run", *flags(folders, *given))
    assert "\n" not in str(refused.value) and not (tmp_path / "run" / "config.yaml").exists()


def test_tools_need_chat_prompts_and_a_template_that_renders_them(folders, tmp_path):
    text = tmp_path / "text"
    text.mkdir()
    (text / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": f"{k} + 1 =", "answer": "x"}) + "\n" for k in range(6))
    )
    tools = ["--tools", str(folders["tools"]), "--reward", "answer"]
    with pytest.raises(ConfigError, match="^--tools: the prompts of .* are text; tools need chat prompts"):
        in_process(tmp_path / "a", *flags({**folders, "data": text}, *tools))
    plain = tiny_llama(tmp_path / "plain")  # ChatML without tools
    with pytest.raises(ConfigError, match="^--tools: the model's chat template cannot render tool calls"):
        in_process(tmp_path / "b", *flags({**folders, "model": plain}, *tools))


def test_kinds_cover_what_a_model_does_with_a_tool():
    assert KINDS == ("right", "bad argument", "unknown", "malformed", "none")


# --------------------------------------------------------------------------- launched: the model calls by itself


@pytest.fixture(scope="module")
def caller(folders, tmp_path_factory):
    """The tiny tool Llama after 60 steps of sft on sums answered by a call to add (TRL's tool-calling chats, the
    same schema in their `tools` column): about one completion in five then calls add well formed by itself, as a
    launched run, which nothing scripts, needs."""
    from transformers.utils import get_json_schema

    root = tmp_path_factory.mktemp("caller")
    (add,) = load_tools([f"{folders['tools']}:add"])
    tools = json.dumps([get_json_schema(add)])
    chats = []
    for row in sum_rows(200, seed=5):
        a, b = (int(x) for x in row["prompt"][0]["content"][len("What is ") : -1].split(" + "))
        call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
        chats.append({"tools": tools, "messages": [row["prompt"][0], {"role": "assistant", "content": "",
                      "tool_calls": [call]}, {"role": "tool", "name": "add", "content": str(a + b)},
                      {"role": "assistant", "content": str(a + b)}]})  # fmt: skip
    write_jsonl((root / "chats").mkdir() or root / "chats" / "train.jsonl", chats)
    in_process(root / "sft", "--task", "sft", "--model", f"hf:{folders['model']}", "--dataset", str(root / "chats"),
               "--max-length", "1024", "--batch-size", "8", "--max-steps", "60", "--lr", "1e-2", "--val-fraction",
               "0.05", "--test-fraction", "0.05", "--eval-every-steps", "0")  # fmt: skip
    return root / "sft" / "hf"


def launched_flags(folders, caller, *more: str) -> list[str]:
    rewards = f"{folders['rewards']}:called"  # a reward that varies within groups: the step moves the weights
    return [*flags({**folders, "model": caller}, "--tools", f"{folders['tools']}:add", "--reward", rewards), *more]


def tool_lines(run) -> list[tuple]:
    return [
        (m["tool_calls"], m["tool_failures"], m["turns"], m["reward"])
        for m in read_metrics(run)
        if m["kind"] == "train"
    ]


@pytest.mark.launch
def test_two_ranks_equal_one_rank_with_tools(folders, caller, tmp_path):
    one = in_process(tmp_path / "one", *launched_flags(folders, caller, "--max-steps", "2", "--batch-size", "4"))
    done = launch("multi_cpu.yaml", *launched_flags(folders, caller, "--max-steps", "2", "--batch-size", "2"),
                  "--output-dir", str(tmp_path / "two"))  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert read_summary(tmp_path / "two")["scenario"]["num_processes"] == 2 and one["optimizer_steps"] == 2
    lines = [tool_lines(tmp_path / d) for d in ("one", "two")]
    assert sum(lines[0], ()) == pytest.approx(sum(lines[1], ()), abs=1e-9) and all(line[0] > 0 for line in lines[0])
    weights = [load_model(tmp_path / d).state_dict() for d in ("one", "two")]
    start = transformers.AutoModelForCausalLM.from_pretrained(caller).state_dict()
    assert max_abs_diff(*weights) < 1e-6 < 1e-4 < max_abs_diff(weights[0], start), lines


@pytest.mark.launch
def test_a_sigkilled_run_with_tools_resumes_bit_for_bit(folders, caller, tmp_path):
    more = ("--max-steps", "5", "--checkpoint-every-steps", "2", "--batch-size", "2", "--keep-checkpoints", "9")
    reference, victim = kill_and_resume(tmp_path, launched_flags(folders, caller, *more), 3)
    a, b = read_summary(reference), read_summary(victim)
    assert a["last_weights_sha256"] == b["last_weights_sha256"] and b["resumed_from"].endswith("step-000002")
    assert tool_lines(reference) == tool_lines(victim) and sum(line[0] for line in tool_lines(reference)) > 0


ASYNC_TOOLS = '''
import asyncio


async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    await asyncio.sleep(0)
    return a + b


async def broken(a: int) -> int:
    """Fail.

    Args:
        a: anything
    """
    raise RuntimeError("no luck")


async def hang(a: int) -> int:
    """Never answer.

    Args:
        a: anything
    """
    await asyncio.sleep(60)
    return a


def pair(a: int) -> list:
    """Two numbers.

    Args:
        a: the first
    """
    return [a, a + 1]
'''


def test_async_tools_are_awaited_and_a_list_passes_through_as_trl_passes_it(tmp_path):
    """TRL awaits coroutine tools (grpo_trainer's async tool path) with the same error answers, and gives a tool's
    list result to the template and the reward functions as it is (content blocks), anything else as str()."""
    path = tmp_path / "async_tools.py"
    path.write_text(ASYNC_TOOLS)
    tools = {t.__name__: t for t in load_tools([str(path)])}

    def call(name, **arguments):
        return {"type": "function", "function": {"name": name, "arguments": arguments}}

    assert run_call(tools, call("add", a=2, b=3), 1.0) == ({"role": "tool", "name": "add", "content": "5"}, False)
    broken, failed = run_call(tools, call("broken", a=1), 1.0)
    assert failed and broken["content"] == str({"error": "no luck"})  # raised inside the coroutine: a failure
    started = time.perf_counter()
    hung, failed = run_call(tools, call("hang", a=1), 0.2)
    assert failed and hung["content"] == str({"error": "timed out after 0.2 s"}) and time.perf_counter() - started < 30
    assert run_call(tools, call("pair", a=3), 1.0) == ({"role": "tool", "name": "pair", "content": [3, 4]}, False)


def test_an_async_reward_function_is_awaited():
    from anytrain.tasks.grpo.rewards import Reward, scores

    async def judged(prompts, completions, **kwargs):
        return [float(len(c)) for c in completions]

    args = {"prompts": ["p"] * 2, "completions": ["ab", "abc"], "completion_ids": [[1]] * 2}
    assert scores([Reward("judged", judged, 1.0)], args, lambda k: f"row {k}")[:, 0].tolist() == [2.0, 3.0]


def test_an_environment_whose_reset_returns_no_text_is_refused_naming_the_class_and_type(folders):
    from anytrain.tasks.causal_lm.rollout import Rollouts

    class Counter:
        def reset(self, **row):
            return 3  # an int: TRL adds a text to the prompt; this would be dropped unseen

        def add(self, a: int) -> int:
            """Add one.

            Args:
                a: the number
            """
            return a + 1

    engine = Rollouts(TrainConfig(), type("Options", (), {"environment": "here:Counter"})())
    engine.environment = Counter
    engine.prompts = {"train": type("Rows", (), {"ids": [[1, 2]], "prompts": [[{"role": "user", "content": "?"}]],
                                               "columns": {}})()}  # fmt: skip
    with pytest.raises(ConfigError, match=r"Counter\.reset returned int 3, not a text \(str\)") as refused:
        engine.conversation("train", 0)
    assert "\n" not in str(refused.value)
