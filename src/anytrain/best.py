"""The best validation so far, by --best-metric (`Criterion`), and its weights, for --final-weights best (the
default).

The task declares the metrics it logs and which way each improves (tasks/base.py: `goals`), and its headline
metric (`headline`: accuracy for a classifier, loss for a language model), which --best-metric auto means.
A copy is taken in CPU memory whenever that metric improves; every checkpoint after it holds
the copy too (best_weights.safetensors, unless the checkpoint's own weights are the best), so a killed
and resumed run ends with the same weights; at the end the copy goes back into the model before the
test split is evaluated and model.safetensors written. Only what training changes is copied: the
trainable parameters and the saved buffers (frozen weights, such as a LoRA base model's, stay as loaded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from .outputs import whole

FILE = "best_weights.safetensors"  # in a checkpoint folder
HIGHER, LOWER = "higher", "lower"  # which way a metric improves (a task's `goals`)


@dataclass(frozen=True)
class Criterion:
    """The validation metric that picks the best weights and that early stopping watches, and its direction."""

    metric: str
    higher: bool  # a higher value is better (accuracy), else a lower one (loss)

    def improves(self, value: float, best: float | None, min_delta: float, loss: float, best_loss: float) -> bool:
        """Whether a validation beats the best so far (best None: none yet): its metric by more than min_delta,
        or the same metric at a lower loss (accuracy is coarse: of two validations alike in it, the one with
        the lower loss; a task without an evaluation loss passes inf for both: no tie-break); a NaN never does."""
        if not math.isfinite(value):
            return False
        if best is None:
            return True
        if value == best and self.metric != "loss":
            return loss < best_loss
        return value > best + min_delta if self.higher else value < best - min_delta

    def __str__(self) -> str:
        return f"validation {self.metric} ({HIGHER if self.higher else LOWER} is better)"


def changing_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors training changes, by name (a tied weight once, under its first name)."""
    saved = model.state_dict(keep_vars=True)
    tensors: dict[str, torch.Tensor] = {name: p for name, p in model.named_parameters() if p.requires_grad}
    tensors.update((name, b) for name, b in model.named_buffers() if name in saved)
    return tensors


class BestWeights:
    """The copy and the optimizer step it was taken at (-1: none yet)."""

    def __init__(self, keep: bool):
        self.keep = keep  # --final-weights best
        self.tensors: dict[str, torch.Tensor] | None = None
        self.step = -1

    def take(self, model: nn.Module, step: int) -> None:
        """A copy on the CPU; of sharded (FSDP2) weights the whole tensors, so every rank calls this together."""
        if self.keep:
            self.tensors = {k: whole(v.detach()).to("cpu", copy=True) for k, v in changing_tensors(model).items()}
            self.step = step

    def to_save(self, step: int) -> dict[str, dict]:
        """What a checkpoint at `step` must hold besides its own weights: the copy, when it is another step's."""
        return {FILE: self.tensors} if self.tensors is not None and self.step != step else {}

    def resume(self, model: nn.Module, checkpoint: Path, best_step: int, step: int) -> None:
        """After loading the checkpoint of `step`: the copy is its weights, or the file it holds."""
        if not self.keep or best_step < 0:
            return
        if best_step == step:
            self.take(model, step)
        elif (checkpoint / FILE).is_file():
            self.tensors, self.step = load_file(str(checkpoint / FILE)), best_step

    def restore(self, model: nn.Module, step: int) -> bool:
        """Put the copy back into the model; False (nothing done) when there is none or it is the last step's."""
        if self.tensors is None or self.step == step:
            return False
        from torch.distributed.tensor import DTensor, distribute_tensor

        own = changing_tensors(model)
        with torch.no_grad():
            for name, tensor in self.tensors.items():
                target = own[name]
                if isinstance(target, DTensor):  # FSDP2: each rank keeps its shard of the copy
                    tensor = distribute_tensor(tensor.to(target.device), target.device_mesh, target.placements)
                target.copy_(tensor)
        return True
