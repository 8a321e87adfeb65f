"""A prompt as a causal LM reads it before it answers, the one encoding grpo's rollouts and `anytrain sample`'s
replies use: text as it is (with the tokenizer's own special tokens, a BOS where it adds one), or a chat rendered by
the model's chat template with its generation prompt (the template's special tokens, none added)."""

from __future__ import annotations

from ...config import ConfigError
from ..hf_sft.chats import check_messages, render


def prompt_text(tokenizer, prompt, where: str) -> str:
    """The prompt as the model reads it: text as it is, a chat rendered by the template with its generation prompt."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ConfigError(f"{where}: the prompt is empty")
        return prompt
    if not isinstance(prompt, list):
        raise ConfigError(f"{where}: the prompt must be text or a list of messages, got {type(prompt).__name__}")
    check_messages(prompt, where, answered=False)
    return render(tokenizer, prompt, True)


def prompt_ids(tokenizer, prompt, where: str) -> list[int]:
    """The prompt's token ids, as generation reads them (module docstring)."""
    text = prompt_text(tokenizer, prompt, where)
    return tokenizer(text, add_special_tokens=isinstance(prompt, str)).input_ids
