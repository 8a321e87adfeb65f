"""Tools for a causal LM's chats, the one home of what a tool is (sft's `tools` column, grpo's --tools and
--environment): plain Python functions with type hints and a docstring, whose JSON schema transformers makes
(`get_json_schema`) and the model's chat template renders (`apply_chat_template(..., tools=...)`).

A chat template can render tools when a whole tool-calling exchange (user, an assistant turn with a call, the
tool's message) comes out with the call's name, its argument and the tool's result in its text: a template that
reads only `content` drops the call without an error, and would train or prompt on a conversation without it.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable

from ...config import ConfigError, first_line

SENTINELS = {"name": "probe_fn_x7q", "key": "probe_key_k3v", "value": "probe_value_v9w", "result": "probe_result_r2z"}


def renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders a tool call and a tool's result (each part in its text)."""
    s = SENTINELS
    call = {"type": "function", "function": {"name": s["name"], "arguments": {s["key"]: s["value"]}}}
    chat = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": s["name"], "content": s["result"]}]  # fmt: skip
    if getattr(tokenizer, "chat_template", None) is None:
        return False
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that raises on tool messages cannot render them
        return False
    return all(v in text for v in s.values())


def check_renders_tools(tokenizer, what: str) -> None:
    """Refuse, in one line naming `what` (the option or column that brought tools), a template without tools."""
    if not renders_tools(tokenizer):
        raise ConfigError(
            f"{what}: the model's chat template cannot render tool calls (a tool call or a tool's result is missing "
            "from its text); give the model a template that renders `tools`, assistant `tool_calls` and `tool` messages"
        )


# --------------------------------------------------------------------------- tools as functions
def schema_of(fn: Callable, where: str) -> dict:
    """The function's JSON schema as the template renders it (transformers' get_json_schema: its name, docstring
    and type hints); ConfigError naming `where` when it has no docstring or a parameter without a type hint."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as e:  # noqa: BLE001 - transformers' parsing errors: one line naming the tool
        name = getattr(fn, "__name__", repr(fn))
        raise ConfigError(
            f"{where}: {name} cannot be a tool ({first_line(e)}); a tool needs type hints on every parameter and a "
            "docstring with an Args: line for each"
        ) from None


def public_functions(module) -> list[Callable]:
    """The functions a module defines (not imports) whose names do not start with an underscore, in file order."""
    found = [f for name, f in vars(module).items() if inspect.isfunction(f) and not name.startswith("_")]
    return [f for f in found if f.__module__ == module.__name__]


def load_tools(specs: list[str], option: str = "--tools") -> list[Callable]:
    """Each FILE.py:function or module:function, or FILE.py alone (its public functions), checked as tools."""
    from ...usermodel import import_attr, import_source

    tools: list[Callable] = []
    for spec in specs:
        if spec.endswith(".py"):
            found = public_functions(import_source(spec, spec, option))
            if not found:
                raise ConfigError(f"{option} {spec}: the file defines no public function")
        else:
            if ":" not in spec:
                raise ConfigError(f"{option} {spec}: expected FILE.py:function, FILE.py or module:function")
            fn = import_attr(spec, option)
            if not callable(fn):
                raise ConfigError(f"{option} {spec}: {spec.rpartition(':')[2]} is not a function")
            found = [fn]
        for fn in found:
            schema_of(fn, f"{option} {spec}")
        tools += found
    names = [t.__name__ for t in tools]
    if len(set(names)) != len(names):
        raise ConfigError(f"{option}: two tools are called the same ({', '.join(names)})")
    return tools


def resolved(value):
    """A coroutine's (an async function's call's) result, run to its end on an event loop of its own; any other
    value as it is. TRL awaits async tools and reward functions (on a loop of its own thread)."""
    if inspect.isawaitable(value):
        import asyncio

        async def wait():
            return await value

        return asyncio.run(wait())
    return value


def in_time(fn: Callable, arguments: dict, timeout: float):
    """fn(**arguments), awaited where fn is async, or TimeoutError after `timeout` seconds. The call runs in a daemon
    thread: one that never returns is left running (Python cannot stop a thread) and keeps nothing from ending the
    run."""
    box: dict = {}

    def work() -> None:
        try:
            box["value"] = resolved(fn(**arguments))
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            box["error"] = e

    thread = threading.Thread(target=work, daemon=True, name=f"tool {getattr(fn, '__name__', '?')}")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"timed out after {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def run_call(tools: dict[str, Callable], call, timeout: float) -> tuple[dict, bool]:
    """One parsed tool call run as TRL's GRPOTrainer runs it (an async tool awaited): the tool's message ({"role":
    "tool", "name", "content": the result as text, or a list as it is, as TRL passes content blocks through}) and
    whether it failed; a failure (an unknown tool, arguments that are not an object or do not fit, an exception, the
    timeout) answers {"error": "..."} as the tool's content, for the model to read."""
    function = call.get("function") if isinstance(call, dict) else None
    name = str(function.get("name", "unknown")) if isinstance(function, dict) else "unknown"
    try:
        if not isinstance(call, dict) or call.get("type", "function") != "function" or function is None:
            raise ValueError(f"Unsupported tool call: {call!r}")
        if name not in tools:
            raise ValueError(f"Tool {name} not found.")
        arguments = function.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ValueError(f"arguments must be an object, got {type(arguments).__name__}")
        result, failed = in_time(tools[name], arguments, timeout), False
    except Exception as e:  # noqa: BLE001 - the model's call went wrong: the model reads why
        result, failed = {"error": str(e)}, True
    content = result if isinstance(result, list) else str(result)
    return {"role": "tool", "name": name, "content": content}, failed


# --------------------------------------------------------------------------- a model's turn and the tools' answers
def check_parses(tokenizer, what: str) -> None:
    """Refuse, in one line, a tokenizer without a response template (transformers' response parsing reads the
    model's calls with it) or a template that renders the tools' answers differently once more turns follow."""
    if getattr(tokenizer, "response_template", None) is None:
        raise ConfigError(
            f"{what}: the model's tokenizer has no response_template, with which transformers parses a reply into "
            "its text and tool calls (`tokenizer.parse_response`); set one in its tokenizer_config.json"
        )
    stops = [tokenizer.eos_token_id, *tokenizer.all_special_ids]
    try:
        tool_suffix(tokenizer, [{"role": "tool", "name": SENTINELS["name"], "content": "1"}], stops, None)
    except ValueError as e:
        raise ConfigError(f"{what}: {e}") from None


def parse_turn(tokenizer, ids: list[int], prefix: list[int], stop: int | None, tools: list | None) -> tuple[dict, bool]:
    """The model's turn as a message (transformers' response parsing: its text and tool calls, the arguments typed
    by the tools' schemas) and whether it was malformed (a call that does not parse: then its text alone, as TRL).
    `stop`: the turn's stop token, dropped from the text where the response template leaves it there."""
    try:
        message = tokenizer.parse_response(ids, prefix=prefix, tools=tools)
        malformed = False
    except Exception:  # noqa: BLE001 - a malformed call: the text as it is
        message, malformed = {"role": "assistant", "content": tokenizer.decode(ids)}, True
    text = message.get("content")
    end = tokenizer.decode([stop]) if stop is not None else ""
    if isinstance(text, str) and end and text.rstrip().endswith(end):
        message["content"] = text.rstrip()[: -len(end)].rstrip()
    return message, malformed


def tool_suffix(tokenizer, answers: list[dict], stops: list[int], tools: list | None) -> list[int]:
    """The tokens the chat template puts after a model's turn that ended at a stop token: the tools' messages and
    the next generation prompt (rendered once with and once without them, the first cut after its last stop)."""
    call = {"type": "function", "function": {"name": answers[0]["name"], "arguments": {}}}
    chat = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    before = ids_of(tokenizer, chat, False, tools)
    ends = [k for k, t in enumerate(before) if t in stops]
    if not ends:
        raise ValueError("the chat template closes an assistant turn with none of the stop tokens")
    before = before[: ends[-1] + 1]
    after = ids_of(tokenizer, chat + answers, True, tools)
    if after[: len(before)] != before:
        raise ValueError("the chat template renders an assistant turn differently once a tool's answer follows it")
    return after[len(before) :]


def ids_of(tokenizer, chat: list, generation_prompt: bool, tools: list | None) -> list[int]:
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt, tools=tools)
    return tokenizer(text, add_special_tokens=False).input_ids
