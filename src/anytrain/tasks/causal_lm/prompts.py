"""Chats and prompts as a causal LM reads them: a chat checked (roles, text content, an answer where one is
expected; with `tools`, sft's, tool messages and assistant tool calls too) and rendered by the model's chat template
(sft's, dpo's and grpo's data read them through here; sft's with the row's tool schemas), and a prompt
as the model reads it before it answers, the one encoding grpo's rollouts and `anytrain sample`'s replies use: text
as it is (with the tokenizer's own special tokens, a BOS where it adds one), or a chat rendered by the model's chat
template with its generation prompt (the template's special tokens, none added)."""

from __future__ import annotations

from ...config import ConfigError

ROLES = ("system", "user", "assistant")  # a chat's roles (TRL's conversational format)
TOOL_ROLES = (*ROLES, "tool")  # with tools: a tool's result, {"role": "tool", "name": ..., "content": ...}


def check_messages(messages, where: str, answered: bool = True, tools: bool = False) -> None:
    """A conversation: a non-empty list of {role, content} with known roles and (`answered`) an assistant turn;
    with `tools`, also tool messages and assistant turns with `tool_calls` (whose content may be empty or absent)."""
    if not isinstance(messages, list) or not messages:
        raise ConfigError(f"{where}: expected a list of {{role, content}} messages, got {type(messages).__name__}")
    roles = TOOL_ROLES if tools else ROLES
    for turn in messages:
        role = turn.get("role") if isinstance(turn, dict) else None
        if role not in roles:
            raise ConfigError(f"{where}: unknown role {role!r} (roles: {', '.join(roles)})")
        calls = tools and turn.get("tool_calls") not in (None, [])  # none: null, [] or absent
        if calls:
            check_calls(turn["tool_calls"], role, where)
        content = turn.get("content")
        if not isinstance(content, str) and not (calls and content is None):  # a call's content: "", null or absent
            raise ConfigError(f"{where}: a {role} message without text content")
    if answered and not any(turn["role"] == "assistant" for turn in messages):
        raise ConfigError(f"{where}: no assistant turn, so nothing to learn from it")


def check_calls(calls, role, where: str) -> None:
    """An assistant turn's tool calls, in TRL's form: a list of {"type": "function", "function": {"name":
    NAME, "arguments": {...}}} (arguments a dict or its JSON text), beside text content or none."""
    shape = '[{"type": "function", "function": {"name": ..., "arguments": {...}}}]'
    if role != "assistant":
        raise ConfigError(f"{where}: a {role} message with tool_calls (only assistant turns call tools)")
    if not isinstance(calls, list):
        raise ConfigError(f"{where}: an assistant message's tool_calls must be a list {shape}")
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise ConfigError(f"{where}: a tool call without function.name (expected {shape}, got {call!r:.80})")
        name = function["name"]
        if not isinstance(function.get("arguments", {}), (dict, str)):
            raise ConfigError(f"{where}: tool call {name!r}: its arguments must be a dict (or its JSON text)")


def render(tokenizer, messages: list, generation_prompt: bool = False, tools: list | None = None) -> str:
    """The chat as the template renders it; `tools`: the tools' schemas it shows (None: none, as for tools=[])."""
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt, tools=tools or None
    )


def prompt_text(tokenizer, prompt, where: str, tools: list | None = None) -> str:
    """The prompt as the model reads it: text as it is, a chat rendered by the template with its generation prompt."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ConfigError(f"{where}: the prompt is empty")
        return prompt
    if not isinstance(prompt, list):
        raise ConfigError(f"{where}: the prompt must be text or a list of messages, got {type(prompt).__name__}")
    check_messages(prompt, where, answered=False)
    return render(tokenizer, prompt, True, tools)


def prompt_ids(tokenizer, prompt, where: str, tools: list | None = None) -> list[int]:
    """The prompt's token ids, as generation reads them (module docstring); a chat shown `tools` (their schemas)."""
    text = prompt_text(tokenizer, prompt, where, tools)
    return tokenizer(text, add_special_tokens=isinstance(prompt, str)).input_ids
