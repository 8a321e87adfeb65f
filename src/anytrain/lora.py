"""LoRA through peft (--lora-r N): a transformers model's own weights stay frozen; small low-rank adapters
beside its linear projections are trained instead. This module wraps a loaded model (saying the trainable
share), rebuilds the wrapped model from a run's metadata, and writes the end's two exports: the adapter
(`PeftModel.from_pretrained(base, run_dir/adapter)` loads it) and the merged model (run_dir/hf, which
`AutoModelForCausalLM.from_pretrained` loads, with the same outputs). Checkpoints hold what training
changes only (trainer.py's save hook: the adapters; the optimizer holds their state alone anyway)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, cast

from torch import nn

from .config import ConfigError, TrainConfig, first_line

ADAPTER = "adapter"  # run_dir/adapter: the adapter's save_pretrained folder
# the transformers heads LoRA adapts here (a sequence classifier's score head trains beside the adapters: SEQ_CLS)
PEFT_TASKS = {"AutoModelForCausalLM": "CAUSAL_LM", "AutoModelForSequenceClassification": "SEQ_CLS"}


def peft():
    try:
        import peft
    except ImportError:
        raise ConfigError("--lora-r needs peft: pip install -e '.[hf]'") from None
    return peft


def settings(cfg: TrainConfig) -> dict:
    """The adapter's settings, as the weights' metadata keeps them."""
    model = cfg.model
    targets = [t.strip() for t in model.lora_targets.split(",") if t.strip()] or "all-linear"
    return {"r": model.lora_r, "lora_alpha": model.lora_alpha, "lora_dropout": model.lora_dropout, "targets": targets}


def linear_layers(model: nn.Module) -> list[str]:
    """The full names of the model's linear layers (GPT-2's are Conv1D)."""
    from transformers.pytorch_utils import Conv1D

    return [name for name, m in model.named_modules() if isinstance(m, (nn.Linear, Conv1D))]


def check_targets(model: nn.Module, targets) -> None:
    """Every name in --lora-targets names a linear layer (peft refuses only when none does)."""
    layers = linear_layers(model)
    for target in [] if isinstance(targets, str) else targets:
        if not any(name == target or name.endswith(f".{target}") for name in layers):
            names = ", ".join(sorted({name.rsplit(".", 1)[-1] for name in layers}))
            raise ConfigError(
                f"--lora-targets: the model has no linear layer named {target}; its linear layers: {names}"
            )


def wrap(model: nn.Module, found: dict, auto_class: str, say=None) -> nn.Module:
    """The model with LoRA adapters (peft's "all-linear": every linear projection but the output layer)."""
    lib = peft()
    config = lib.LoraConfig(
        r=found["r"],
        lora_alpha=found["lora_alpha"],
        lora_dropout=found["lora_dropout"],
        target_modules=found["targets"],
        task_type=PEFT_TASKS[auto_class],
    )
    check_targets(model, found["targets"])
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="fan_in_fan_out is set to False")  # GPT-2's Conv1D: peft copes
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")  # peft asks it
            wrapped = lib.get_peft_model(model, config)
    except ValueError as e:
        raise ConfigError(f"--lora-targets: {first_line(e)}") from None
    if say is not None:
        trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        total = sum(p.numel() for p in wrapped.parameters())
        say(f"LoRA r={found['r']}: {trainable:,} of {total:,} parameters trainable ({trainable / total:.2%})")
    return wrapped


def metadata(cfg: TrainConfig) -> dict:
    return {"lora": settings(cfg)} if cfg.model.lora_r else {}


def rebuild(model: nn.Module, meta: dict, auto_class: str) -> nn.Module:
    """A model rebuilt from a run's metadata, wrapped again when the run trained LoRA adapters."""
    return wrap(model, meta["lora"], auto_class) if "lora" in meta else model


def export(model: nn.Module, run_dir: Path) -> nn.Module:
    """Save the adapter into run_dir/adapter; return the merged model (peft merges in place: the last use)."""
    peft_model = cast(Any, model)  # a peft PeftModel
    peft_model.save_pretrained(run_dir / ADAPTER)
    return peft_model.merge_and_unload()
