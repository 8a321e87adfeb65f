"""The run folder: config.yaml, metrics.jsonl, model.safetensors, summary.json.

Only the main process writes; every function here is a no-op-free plain helper, the caller
decides who calls it.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
from pathlib import Path

import torch
from safetensors.torch import save_file

from .config import TrainConfig
from .files import atomic_path, write_atomically

WEIGHTS = "model.safetensors"


class MetricsLog:
    """One JSON object per line: every logged training step and every evaluation. With `tracker`
    (accelerator.log), the same numbers also go to the experiment trackers, at the same steps,
    named `train/loss`, `validation/loss`, `test/accuracy`, ..."""

    def __init__(self, path: Path | None, tracker=None):
        self.file = open(path, "a", buffering=1) if path is not None else None
        self.tracker = tracker

    def write(self, **record) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
        if self.tracker is not None:
            prefix = record["kind"] if record["kind"] == "train" else record["split"]
            values = {
                f"{prefix}/{k}": v
                for k, v in record.items()
                if k not in ("kind", "split", "step", "epoch") and isinstance(v, (int, float))
            }
            self.tracker(values, step=record["step"])

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def save_weights(state_dict: dict, path: Path, cfg: TrainConfig, data_metadata: dict) -> None:
    """safetensors file whose metadata says how to rebuild the model (reload.load_model): the config,
    and the task's data facts (features and classes, or the vocabulary), Python values that
    weights_meta.encode turns into the strings safetensors keeps."""
    from .weights_meta import encode

    tensors, seen = {}, set()
    for k, v in state_dict.items():  # a tensor shared by two names (tied embeddings) is stored under each
        v = v.detach().cpu().contiguous()
        tensors[k] = v.clone() if v.data_ptr() in seen else v
        seen.add(v.data_ptr())
    with atomic_path(path) as tmp:  # whole or absent: a kill mid-write leaves the previous file or none
        save_file(tensors, str(tmp), metadata=encode({"anytrain_config": cfg.to_dict(), **data_metadata}))


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a shard (an FSDP2 weight is a DTensor: gathered from every rank, so every rank calls
    this together), the tensor itself otherwise."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def weights_fingerprint(state_dict: dict) -> str:
    """16 hex digits of a sha256 over every tensor's name and bytes, in name order: equal weights, equal
    fingerprint. summary.json holds each rank's; scripts/fingerprints.py and the tests pin them. Sharded (FSDP2)
    weights are gathered first: every rank calls this together."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        digest.update(name.encode())
        digest.update(whole(state_dict[name].detach()).cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def fingerprint_environment() -> str:
    """What bit-identical weights depend on besides the code: the torch build, its CPU kernels, the cores.
    A CPU with AMX tiles gets other oneDNN/MKL kernels than one with AVX512 alone (measured: other bits)."""
    kernels = torch.backends.cpu.get_cpu_capability()
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:  # not Linux
        flags = []
    return f"torch {torch.__version__}, {kernels}{'+AMX' if 'amx_tile' in flags else ''}, {os.cpu_count()} cores"


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    return process_peak_rss(), "process_max_rss"


def process_peak_rss() -> int:
    """This process's own peak resident set: on Linux VmHWM of /proc/self/status. ru_maxrss also counts the
    parent's resident set when it started this process (Linux keeps the larger across fork and exec): a run
    started by a process of 800 MiB read 800 MiB there, and 10 MiB here (tested). Elsewhere ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if os.uname().sysname == "Darwin" else 1024  # macOS counts bytes, Linux kibibytes
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def write_json(path: Path, data: dict) -> None:
    write_atomically(path, json.dumps(data, indent=2) + "\n")
