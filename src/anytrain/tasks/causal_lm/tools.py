"""Tools for a causal LM's chats, the one home of what a tool is (sft's `tools` column, grpo's --tools and
--environment): plain Python functions with type hints and a docstring, whose JSON schema transformers makes
(`get_json_schema`) and the model's chat template renders (`apply_chat_template(..., tools=...)`).

A chat template can render tools when a whole tool-calling exchange (user, an assistant turn with a call, the
tool's message) comes out with the call's name, its argument and the tool's result in its text: a template that
reads only `content` drops the call without an error, and would train or prompt on a conversation without it.
"""

from __future__ import annotations

from ...config import ConfigError

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
