"""The reference log-probabilities of full fine-tuning (`--reference cached`, dpo's and kto's): every row's, for
every split, computed once before step 0 by the model as it starts (evaluation mode, no gradients, in the run's
precision), each rank a share of the rows, then saved in the run folder (`reference_logps.safetensors`) under a key
of the model's weights, the data's tokens and the precision. A resumed run whose key matches reads them back rather
than computing them, so its reference is the very one the run started with, bit for bit (`start`: the whole flow).

A split's rows say which sequences a row has (`sequences(indices)`: each row's first sequences, then its second
ones, ...): dpo's pair its chosen and rejected answer, kto's row its completion and its KL pair's."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...data.splits import Splits
from .logprobs import bare, sequence_logps

FILE = "reference_logps.safetensors"
SPLITS = ("train", "validation", "test")


def key(model: nn.Module, data: Splits, precision: str, max_length: int) -> str:
    """A digest of the starting weights (every parameter's bytes), the splits' tokens and the precision."""
    digest = hashlib.sha256(f"{precision} {max_length}".encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    for split in SPLITS:
        rows = getattr(data, split)
        if rows is not None:
            for array in (rows.ids, rows.answer, rows.lengths):
                digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def read(run_dir: Path, expected: str) -> dict[str, torch.Tensor] | None:
    """The saved log-probabilities when their key matches, else None."""
    from safetensors import safe_open

    path = run_dir / FILE
    if not path.exists():
        return None
    with safe_open(str(path), framework="pt") as f:
        if (f.metadata() or {}).get("key") != expected:
            return None
        return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open has no iteration


def write(run_dir: Path, logps: dict[str, torch.Tensor], digest: str) -> None:
    from safetensors.torch import save_file

    from ...files import atomic_path

    with atomic_path(run_dir / FILE) as tmp:
        save_file({k: v.contiguous() for k, v in logps.items()}, str(tmp), metadata={"key": digest})


def start(ctx, data: Splits, batch_size: int, max_length: int, resume: str) -> None:
    """Every split's reference log-probabilities, by the model as it starts, given to the splits' rows (`reference`:
    their batches carry them): read back from the run folder when the key matches (a resumed run), else computed now
    and saved there. `ctx` is the run's contract.RunContext (on_run_start's), `resume` the run's --resume."""
    accelerator, model = ctx.accelerator, ctx.accelerator.unwrap_model(ctx.model)
    digest = key(model, data, accelerator.mixed_precision, max_length)
    found = read(ctx.run_dir, digest) if resume else None
    if found is None:
        accelerator.print(
            "anytrain: computing the reference log-probabilities once, before step 0 (--reference cached)"
        )
        found = {
            split: compute(accelerator, model, getattr(data, split), batch_size)
            for split in SPLITS
            if getattr(data, split) is not None
        }
        if accelerator.is_main_process:  # kept for a resumed run
            write(ctx.run_dir, found, digest)
    else:
        accelerator.print(f"anytrain: the reference log-probabilities read from {ctx.run_dir / FILE} (the same key)")
    for split, logps in found.items():
        getattr(data, split).reference = logps


@torch.no_grad()
def compute(accelerator, model: nn.Module, rows, batch_size: int) -> torch.Tensor:
    """(rows, k) float32: each row's k sequences' log-probabilities under the model (dpo's pair: its chosen and
    rejected answer), in the run's precision (accelerator.autocast); each rank computes every num_processes-th batch,
    and the ranks' shares are gathered."""
    from accelerate.utils import gather_object

    was_training = model.training
    model.eval()
    starts = list(range(0, len(rows), batch_size))[accelerator.process_index :: accelerator.num_processes]
    mine = []
    for start in starts:
        indices = list(range(start, min(start + batch_size, len(rows))))
        inputs = rows.padded_batch(rows.sequences(indices))
        with accelerator.autocast():
            batch = {k: v.to(accelerator.device) for k, v in inputs.items()}
            table = sequence_logps(bare(model), batch)
        mine.append((start, table[:, 0].view(len(table) // len(indices), -1).T.float().cpu()))
    items = gather_object(mine) if accelerator.num_processes > 1 else mine  # every rank's (start, values), in order
    model.train(was_training)
    found = dict(items)
    return torch.cat([found[start] for start in sorted(found)]) if found else torch.zeros(0, 2)
