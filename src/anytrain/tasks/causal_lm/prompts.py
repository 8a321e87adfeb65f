"""Chats and prompts as a causal LM reads them: a chat checked (roles, text content, an answer where one is
expected) and rendered by the model's chat template (sft's, dpo's and grpo's data read them through here), and a prompt
as the model reads it before it answers, the one encoding grpo's rollouts and `anytrain sample`'s replies use: text
as it is (with the tokenizer's own special tokens, a BOS where it adds one), or a chat rendered by the model's chat
template with its generation prompt (the template's special tokens, none added)."""

from __future__ import annotations

from ...config import ConfigError

ROLES = ("system", "user", "assistant")  # a chat's roles (TRL's conversational format)


def check_messages(messages, where: str, answered: bool = True) -> None:
    """A conversation: a non-empty list of {role, content} with known roles and (`answered`) an assistant turn."""
    if not isinstance(messages, list) or not messages:
        raise ConfigError(f"{where}: expected a list of {{role, content}} messages, got {type(messages).__name__}")
    for turn in messages:
        role = turn.get("role") if isinstance(turn, dict) else None
        if role not in ROLES:
            raise ConfigError(f"{where}: unknown role {role!r} (roles: {', '.join(ROLES)})")
        if not isinstance(turn.get("content"), str):
            raise ConfigError(f"{where}: a {role} message without text content")
    if answered and not any(turn["role"] == "assistant" for turn in messages):
        raise ConfigError(f"{where}: no assistant turn, so nothing to learn from it")


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
