"""distill's own options: a section of the config (`distill:` in YAML), flags in --help, part of the resume check.
Registered with the registry line (tasks/__init__.py); this module imports no torch. The sampling and tool options
share grpo's names (one flag sets both sections; each keeps its own default and help: config/schema.py, ALSO)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import POSITIVE, option


@dataclass(frozen=True)
class DistillOptions:
    teacher: str = option(
        "",
        "distill: the teacher, hf:FOLDER (a transformers causal LM with the student's tokenizer and vocabulary); "
        "it reads every completion the student samples, without gradients, in the run's precision",
        required=True,
    )
    beta: float = option(
        1.0,
        "distill: which divergence between the teacher's and the student's next-token distributions is trained "
        "on, TRL's generalized Jensen-Shannon divergence: 0 the forward KL(teacher || student), 1 the reverse "
        "KL(student || teacher) (TRL's default), between them JSD_beta with the mixture (1 - beta) student + beta "
        "teacher (0.5: the symmetric JSD)",
        bounds="[0, 1]",
    )
    temperature: float = option(
        1.0,
        "distill: the sampling temperature, and the temperature both distributions are softened by in the loss "
        "(TRL's, one value for both)",
        bounds=POSITIVE,
    )
    max_new_tokens: int = option(
        128, "distill: the longest completion, in tokens (TRL's max_completion_length)", bounds=POSITIVE
    )
    top_p: float = option(
        1.0, "distill: nucleus sampling: the smallest set of tokens of this probability", bounds="(0, 1]"
    )
    tools: list[str] = option(
        [],
        "distill: tools the student may call in its completions, each FILE.py:function or module:function, or "
        "FILE.py (its public functions), as grpo's --tools: run, answered in a tool message, and the student goes "
        "on; the tools' tokens are read by both models but never trained on. Chat prompts only; repeatable",
        repeatable=True,
    )
    environment: str = option(
        "",
        "distill: FILE.py:Class or module:Class, TRL's environment_factory: one instance per completion, "
        "reset(**row) with the prompt's row, its public methods the completion's tools (its get_reward, if any, "
        "is not used: distillation has no reward)",
    )
    max_tool_calls: int = option(
        10,
        "distill: the tool calls a completion may make: a turn that calls once they are made ends it, unanswered "
        "(TRL's max_tool_calling_iterations counts turns)",
        bounds=POSITIVE,
    )
    tool_timeout: float = option(
        10.0, "distill: seconds a tool call may take; then the model is answered that it timed out", bounds=POSITIVE
    )
    share_prompts: bool = option(
        True,
        "distill: where consecutive completions share a prompt (a prompt repeated in the data), generate and the "
        "student's pass read it once (its key-value cache repeated), checked on the model at the start as grpo's; "
        "--no-share-prompts: every row whole. The teacher always reads every row whole",
    )
    generate_batch: int = option(
        0,
        "distill: completions generated together; 0: as many as fit in half the free memory, a process's whole "
        "step at once where it fits; fewer bound generation's memory at some cost in speed; the completions are "
        "the same",
        bounds="[0, inf)",
    )
