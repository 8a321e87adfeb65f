"""distill's teacher, `--teacher hf:FOLDER`: checked before anything is written, then loaded beside the student.

It must be a transformers causal LM (a decoder: transformers' causal-LM class for its architecture, attention that
does not see ahead), with the student's tokenizer (the same token for every id: the teacher reads the student's
tokens) and the student's vocabulary (the same vocab_size: the divergence compares the two distributions over every
token). Each refusal is one line naming --teacher. It is loaded as the student is (hf.load_model: its checkpoint's
weights under its own config), frozen, in evaluation mode, without its key-value cache, on the run's device; it runs
without gradients in the run's precision (the caller's autocast). Under FSDP and DeepSpeed every process holds it
whole: it is not sharded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from ...config import ConfigError, TrainConfig
from ...hf import Head

T = TypeVar("T")


def teacher_config(cfg: TrainConfig) -> TrainConfig:
    """The run's config with the teacher as its model: what hf's loaders read."""
    teacher = cfg.section("distill").teacher
    if not teacher.startswith("hf:"):
        raise ConfigError(f"--teacher {teacher}: the teacher is a transformers causal LM, hf:FOLDER_OR_ID")
    return cfg.replace(model=teacher)


def as_teacher(call: Callable[[], T]) -> T:
    """call(), its one-line refusals naming --teacher where they name --model."""
    try:
        return call()
    except ConfigError as e:
        raise ConfigError(str(e).replace("--model ", "--teacher ", 1)) from None


def checked(cfg: TrainConfig, head: Head, student_tokenizer, student_config) -> tuple[Any, Any]:
    """The teacher's transformers config and tokenizer, checked against the student's (module docstring)."""
    from ... import hf

    t_cfg = teacher_config(cfg)
    name = t_cfg.model.name
    tokenizer = as_teacher(lambda: hf.load_tokenizer(t_cfg))
    config = as_teacher(lambda: hf.model_config(t_cfg.replace(max_length=1), head, "distill", None))
    mine, theirs = student_tokenizer.get_vocab(), tokenizer.get_vocab()
    if mine != theirs:
        moved = sum(1 for token, k in theirs.items() if mine.get(token) != k)
        raise ConfigError(
            f"--teacher {name}: its tokenizer is not the student's ({len(theirs)} tokens, the student's {len(mine)}; "
            f"{moved} of its tokens have another id or none in the student's): the teacher must read the student's "
            "tokens as its own"
        )
    vocabulary = config.get_text_config().vocab_size
    own = student_config.get_text_config().vocab_size
    if vocabulary != own:
        raise ConfigError(
            f"--teacher {name}: its vocabulary has {vocabulary} tokens (vocab_size), the student's {own}: the "
            "divergence compares the two next-token distributions over one vocabulary"
        )
    return config, tokenizer


def load(cfg: TrainConfig, head: Head, config) -> nn.Module:
    """The teacher's weights under its checked config, frozen, in evaluation mode, without its key-value cache."""
    from ... import hf

    model = as_teacher(lambda: hf.load_model(teacher_config(cfg), head, config))
    model.config.use_cache = False
    return model.eval().requires_grad_(False)
