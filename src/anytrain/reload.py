"""A finished run back in memory: its weights file found, the config and metadata saved with it read,
and the model rebuilt by the run's task (`anytrain.load_model`), for predict, sample and your code."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, safe_open

from .config import ConfigError, TrainConfig, registration_kept, saved_options
from .outputs import WEIGHTS
from .tasks import task_of_run
from .weights_meta import decode


def weights_file(run_dir: str | Path) -> Path:
    """A finished run folder's model.safetensors (or the file itself); ConfigError naming run_dir if absent."""
    path = Path(run_dir)
    weights = path / WEIGHTS if path.is_dir() else path
    if not weights.is_file():
        raise ConfigError(f"run_dir: no {WEIGHTS} in {run_dir} (a finished run folder is needed)")
    return weights


def read_weights_metadata(path: str | Path) -> tuple[Path, TrainConfig, dict]:
    """(weights file, the config it was trained with, its metadata) of a run folder or model.safetensors: the
    metadata's Python values (weights_meta.decode), as the task wrote them."""
    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS
    with safe_open(str(path), framework="pt") as f:
        meta = decode(f.metadata())
    with registration_kept():  # a run being configured in this process keeps its options (a distiller's teacher)
        cfg = TrainConfig(**saved_options(meta["anytrain_config"]))
    return path, cfg, meta


def load_model(path: str | Path, model: torch.nn.Module | None = None) -> torch.nn.Module:
    """Rebuild the trained model from a run folder (or its model.safetensors), ready for inference
    (a classifier on raw features or normalised images, a GPT on token ids). A model that was
    passed to anytrain.train() as an object is not rebuilt: pass a fresh one as `model`."""
    path, cfg, meta = read_weights_metadata(path)
    model = task_of_run(cfg, meta).model_from_metadata(meta, model)
    model.load_state_dict(load_file(str(path)))
    return model.eval()
