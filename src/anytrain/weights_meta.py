"""The metadata saved with a run's weights, typed in memory and strings on disk: `encode` once where
model.safetensors is written (outputs.save_weights), `decode` once where a run's is read
(reload.read_weights_metadata).

safetensors keeps metadata as str -> str. In memory each value is a Python value (`Splits.metadata`,
`Task.weights_metadata`, the `meta` a task's model_from_metadata, predict and sample are given): lists,
ints, floats, dicts, a DataShape, a TargetStats. On disk the format is the one runs have always written,
so every run saved so far reads back the same: JSON text for lists, dicts and numbers, plain strings as
they are.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .data.splits import TargetStats
from .shape import DataShape

# The keys anytrain writes whose values are not plain strings, each with the way it is read back. Every
# other key is a string in memory as on disk: hf_config (transformers' own config JSON, which
# hf.model_from_config reads), hf, chat_format, chat_template ("yes"/"no"), dpo_loss, the task's key, and an
# own task's keys (a value that is not a string is written as JSON and read back as that text).
DECODERS: dict[str, Callable[[str], Any]] = {
    "anytrain_config": json.loads,  # the config's options (reload makes the TrainConfig)
    "data_shape": DataShape.from_json,
    "targets": TargetStats.from_json,
    "num_classes": int,
    "num_features": int,
    "max_length": int,
    "threshold": float,
    "beta": float,
    # lists of strings or ids, and dicts: the image look, the LoRA settings, the vocabulary (tokenizer.Vocab's
    # characters, or a BPE's file and sha256)
    **dict.fromkeys(("input_columns", "class_names", "stop_ids", "image_look", "lora", "vocab"), json.loads),
}


def encode(meta: dict[str, Any]) -> dict[str, str]:
    """The strings safetensors saves: a string as it is, a DataShape or TargetStats as its to_json, else JSON."""
    return {key: encoded(value) for key, value in meta.items()}


def encoded(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (DataShape, TargetStats)):
        return value.to_json()
    return json.dumps(value)


def decode(meta: dict[str, str]) -> dict[str, Any]:
    """The Python values of a run's saved metadata (the keys in DECODERS; every other value stays a string)."""
    return {key: DECODERS.get(key, str)(value) for key, value in meta.items()}
