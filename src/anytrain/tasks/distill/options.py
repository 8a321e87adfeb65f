"""distill's own options: a section of the config (`distill:` in YAML), flags in --help, part of the resume check.
Registered with the registry line (tasks/__init__.py); this module imports no torch. The rollout's sampling and tool
options are the rollout engine's (tasks/causal_lm/rollout_options.py: inherited, they come first in the section),
grpo's too; --temperature, --max-new-tokens, --environment and --share-prompts share grpo's names with a default
or a meaning of their own here (one flag sets both sections; each keeps its own default and help: config/schema.py,
ALSO)."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import POSITIVE, option
from ..causal_lm.rollout_options import RolloutOptions


@dataclass(frozen=True)
class DistillOptions(RolloutOptions):
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
    environment: str = option(
        "",
        "distill: FILE.py:Class or module:Class, TRL's environment_factory: one instance per completion, "
        "reset(**row) with the prompt's row, its public methods the completion's tools (its get_reward, if any, "
        "is not used: distillation has no reward)",
    )
    share_prompts: bool = option(
        True,
        "distill: where consecutive completions share a prompt (a prompt repeated in the data), generate and the "
        "student's pass read it once (its key-value cache repeated), checked on the model at the start as grpo's; "
        "--no-share-prompts: every row whole. The teacher always reads every row whole",
    )
