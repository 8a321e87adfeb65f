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
from safetensors.torch import load_file, safe_open, save_file

from .config import TrainConfig, saved_options
from .files import atomic_path, write_atomically
from .tasks import get_task

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
    """safetensors file whose metadata says how to rebuild the model (see load_model): the config,
    and the task's data facts (features and classes, or the vocabulary)."""
    tensors, seen = {}, set()
    for k, v in state_dict.items():  # a tensor shared by two names (tied embeddings) is stored under each
        v = v.detach().cpu().contiguous()
        tensors[k] = v.clone() if v.data_ptr() in seen else v
        seen.add(v.data_ptr())
    with atomic_path(path) as tmp:  # whole or absent: a kill mid-write leaves the previous file or none
        save_file(tensors, str(tmp), metadata={"anytrain_config": json.dumps(cfg.to_dict()), **data_metadata})


def weights_file(run_dir: str | Path) -> Path:
    """A finished run folder's model.safetensors (or the file itself); ConfigError naming run_dir if absent."""
    from .config import ConfigError

    path = Path(run_dir)
    weights = path / WEIGHTS if path.is_dir() else path
    if not weights.is_file():
        raise ConfigError(f"run_dir: no {WEIGHTS} in {run_dir} (a finished run folder is needed)")
    return weights


def read_weights_metadata(path: str | Path) -> tuple[Path, TrainConfig, dict]:
    """(weights file, the config it was trained with, its metadata) of a run folder or model.safetensors."""
    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    return path, TrainConfig(**saved_options(json.loads(meta["anytrain_config"]))), meta


def load_model(path: str | Path, model: torch.nn.Module | None = None) -> torch.nn.Module:
    """Rebuild the trained model from a run folder (or its model.safetensors), ready for inference
    (a classifier on raw features or normalised images, a GPT on token ids). A model that was
    passed to anytrain.train() as an object is not rebuilt: pass a fresh one as `model`."""
    path, cfg, meta = read_weights_metadata(path)
    model = get_task(cfg).model_from_metadata(cfg, meta, model)
    model.load_state_dict(load_file(str(path)))
    return model.eval()


def weights_fingerprint(state_dict: dict) -> str:
    """16 hex digits of a sha256 over every tensor's name and bytes, in name order: equal weights, equal
    fingerprint. summary.json holds each rank's; scripts/fingerprints.py and the tests pin them."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        digest.update(name.encode())
        digest.update(state_dict[name].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def fingerprint_environment() -> str:
    """What bit-identical weights depend on besides the code: the torch build, its CPU kernels, the cores."""
    return f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores"


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process_max_rss"


def write_json(path: Path, data: dict) -> None:
    write_atomically(path, json.dumps(data, indent=2) + "\n")
