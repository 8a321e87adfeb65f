"""The rollout engine's options (rollout.py) that mean the same in every task sampling its own completions: how a
completion is sampled past the temperature (TRL's top_p, top_k, min_p, repetition_penalty) and the tools' limits and
batching. grpo's and distill's option classes inherit them (one declaration, one flag that sets both sections:
config/schema.py, ALSO), and declare beside them what differs between the two (the length, the temperature, the
environment, prompt sharing). Imports no torch, as every options module."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import NON_NEGATIVE, POSITIVE, option


@dataclass(frozen=True)
class RolloutOptions:
    top_p: float = option(
        1.0, "grpo, distill: nucleus sampling: the smallest set of tokens of this probability", bounds="(0, 1]"
    )
    top_k: int = option(
        0,
        "grpo, distill: sampling keeps the k most likely tokens (0: all, TRL's default); sampling only: the "
        "log-probabilities trained on are those of softmax(logits / --temperature), as TRL's",
        bounds=NON_NEGATIVE,
    )
    min_p: float = option(
        0.0,
        "grpo, distill: sampling drops the tokens less likely than min_p times the most likely one, after the "
        "temperature, top-k and top-p (0: off, TRL's default None); sampling only, as --top-k",
        bounds="[0, 1]",
    )
    repetition_penalty: float = option(
        1.0,
        "grpo, distill: sampling penalises each token its row has already read (the prompt and the completion so "
        "far): its logit divided by this where positive, multiplied where negative, before the temperature "
        "(transformers' RepetitionPenaltyLogitsProcessor; 1: off, TRL's default); sampling only, as --top-k",
        bounds=POSITIVE,
    )
    tools: list[str] = option(
        [],
        "grpo, distill: tools the model may call in its completions, each FILE.py:function or module:function, or "
        "FILE.py (its public functions): plain functions with type hints and a docstring (transformers' "
        "get_json_schema), shown to the model by its chat template; its calls are parsed by transformers' response "
        "parsing (the tokenizer's response_template), run, and answered in a tool message, and the model goes on; "
        "the tools' tokens are read but never trained on. Chat prompts only; repeatable",
        repeatable=True,
    )
    max_tool_calls: int = option(
        10,
        "grpo, distill: the tool calls a completion may make: a turn that calls once they are made ends it, "
        "unanswered (TRL's max_tool_calling_iterations counts turns and defaults to no limit)",
        bounds=POSITIVE,
    )
    tool_timeout: float = option(
        10.0,
        "grpo, distill: seconds a tool call may take; then the model is answered that it timed out",
        bounds=POSITIVE,
    )
    generate_batch: int = option(
        0,
        "grpo, distill: completions generated together; 0: as many as fit in half the free memory (the GPU's, or "
        "the CPU's available memory) by the model's key-value cache and a step's scores, a process's whole "
        "rollout at once where it fits; fewer bound generation's memory at some cost in speed; the completions are "
        "the same",
        bounds=NON_NEGATIVE,
    )
