"""Whether a transformers causal LM keeps packed texts apart (--packing, data/packing.py), checked on the model
itself before the first step, and the block-diagonal attention mask for the models whose positions do not.

A packed row holds several texts, its position ids restarting at 0 for each. Most architectures then mask
attention per text by themselves (transformers builds the mask from the position ids), but not all: ALiBi
models (BLOOM, MPT) ignore position ids, others (OPT, BioGPT, XGLM) take positions from them yet attend across
the whole row, and a state-space model (Mamba) carries its state from one text into the next. Nothing fails:
the second text simply attends to the first, and its loss is not the loss of the text alone.

So `keep_apart(model)` packs two random texts into one row and compares each one's logits with those of the
text alone: equal with the position ids alone ("positions"), else equal when the row also gets a 4D mask, causal
within each text and closed across texts (as a boolean or as an additive float mask, whichever the model's
attention reads right: "mask" or "additive mask"; the task's packed rows then put one in every batch), else
refused in one line
naming the architecture. The check runs in float32 on the CPU, where the model is built, and draws from its own
random generator (training's random numbers are untouched).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from .config import ConfigError, first_line
from .data.packing import block_mask

LENGTHS = (11, 7)  # the two texts of the check: the second attends to the first unless they are kept apart
TOLERANCE = 1e-4  # a logit change relative to the logits' scale that counts: float32 rounding is ~1e-7, leaks 1e-2+


def changes(model: nn.Module, mask: str | None) -> tuple[float, float]:
    """How much the logits of two texts packed into one row (position ids restarting; with mask "bool" or
    "float", also the 4D block-diagonal mask) differ from each text's alone, relative to the logits' scale:
    (the first text's change, the second's)."""
    generator = torch.Generator().manual_seed(0)
    vocabulary = cast(Any, model).get_input_embeddings().weight.shape[0]  # a transformers model
    device = next(model.parameters()).device  # checked where the model is (a GPU's attention kernels differ)
    texts = [torch.randint(1, vocabulary, (1, n), generator=generator).to(device) for n in LENGTHS]
    alone = [model(input_ids=ids, use_cache=False).logits.float() for ids in texts]
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None].to(device)
    extra = {} if mask is None else {"attention_mask": block_mask(positions, mask == "float", torch.float32)}
    logits = model(input_ids=torch.cat(texts, 1), position_ids=positions, use_cache=False, **extra).logits.float()
    scale = max(a.abs().max().item() for a in alone) or 1.0
    first, second = logits[:, : LENGTHS[0]], logits[:, LENGTHS[0] :]
    return (first - alone[0]).abs().max().item() / scale, (second - alone[1]).abs().max().item() / scale


def keep_apart(model: nn.Module) -> str:
    """How packed texts stay apart in this model: "positions", "mask" or "additive mask" (then its packed batches
    need the block-diagonal mask, boolean or float: data/packing.py puts it in them);
    ConfigError naming the architecture when neither keeps them apart. The first text's change with the
    position ids alone is the packed computation's rounding (nothing precedes it); a way is exact when neither
    text changes by more than ten times that (or TOLERANCE)."""
    was_training, tried = model.training, {}
    model.eval()
    try:
        with torch.no_grad():
            rounding = changes(model, None)[0]
            tolerance = max(TOLERANCE, 10 * rounding)
            for mask in (None, "bool", "float"):
                try:
                    change = max(changes(model, mask)) / tolerance
                except Exception as e:  # noqa: BLE001 - a model that refuses a 4D mask or position ids
                    tried[mask] = first_line(e)
                    continue
                if change <= 1:
                    break
                tried[mask] = f"the logits change {change:.3g} times the tolerance"
            else:
                raise ConfigError(refusal(model, tried))
    finally:
        model.train(was_training)
    return {None: "positions", "bool": "mask", "float": "additive mask"}[mask]


SAID = {
    "positions": "the texts of a row are kept apart by their position ids (checked on the model: packed, each "
    "text's logits are its logits alone)",
    "mask": "the texts of a row are kept apart by a block-diagonal attention mask, as the model's position ids do "
    "not keep them apart (checked on the model: packed with it, each text's logits are its logits alone)",
}
SAID["additive mask"] = SAID["mask"]


def refusal(model: nn.Module, tried: dict) -> str:
    name, kind = type(model).__name__, getattr(model.config, "model_type", "?")
    return (
        f"--packing: {name} ({kind}) does not keep packed texts apart: a text's logits depend on the text before "
        f"it in the row, with the position ids restarting ({tried[None]}) and with a block-diagonal attention mask "
        f"({tried['float']}); train it without --packing"
    )
