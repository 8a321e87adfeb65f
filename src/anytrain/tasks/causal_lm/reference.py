"""The reference policy of the causal-LM methods (dpo's --reference, grpo's --kl-beta): the model as it started,
frozen, one implementation for both. `live`: a frozen copy of the starting model in memory (made at the run's
start); `adapter`: with LoRA, the model itself with its adapter off (its weights as they were loaded, no copy);
`cached` (dpo under full fine-tuning: its log-probabilities computed once before step 0, cached.py) and `none` call no
model per batch. `calling(model)` is a context in which the reference is called as logprobs.bare calls a model."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from torch import nn

from ...config import ConfigError
from .logprobs import bare

WAYS = ("live", "adapter", "cached", "none")


def check_reference_option(option: str, lora_r: int) -> None:
    """dpo's and kto's --reference as given: `adapter` needs an adapter to turn off."""
    if option == "adapter" and not lora_r:
        raise ConfigError("--reference adapter: the model with its adapter off needs LoRA (--lora-r)")


class Reference:
    """The run's reference: how it is had (WAYS), and the frozen copy where it is live."""

    def __init__(self, how: str):
        if how not in WAYS:
            raise ValueError(f"reference: {how} is not one of {', '.join(WAYS)}")
        self.how = how
        self.frozen: nn.Module | None = None  # live: the starting model, frozen (start)

    @classmethod
    def of_option(cls, option: str, lora_r: int) -> Reference:
        """dpo's and kto's --reference: `auto` is the adapter's base under LoRA, else the cached log-probabilities."""
        return cls(("adapter" if lora_r else "cached") if option == "auto" else option)

    @property
    def per_batch(self) -> bool:
        """Whether the reference's log-probabilities are computed with each batch (live, adapter)."""
        return self.how in ("live", "adapter")

    def start(self, ctx) -> None:
        """At the run's start (contract.RunContext: the prepared model, its starting weights): live copies it."""
        if self.how == "live":
            model = ctx.accelerator.unwrap_model(ctx.model)
            self.frozen = copy.deepcopy(model).eval().requires_grad_(False)

    @contextmanager
    def calling(self, model: nn.Module) -> Iterator[Callable]:
        """The reference as a call (logprobs.bare): the frozen copy, or `model` (the loop's, inside its wrappers or
        not) with its adapter off."""
        if self.frozen is not None:
            yield bare(self.frozen)
            return
        if self.how != "adapter":
            raise ValueError(f"reference {self.how}: no model to call per batch")
        inner = getattr(model, "module", model)  # DDP's
        inner = getattr(inner, "_orig_mod", inner)  # torch.compile's
        with cast(Any, inner).disable_adapter():  # peft's: the LoRA layers skipped
            yield bare(inner)
