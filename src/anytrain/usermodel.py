"""Which model trains: a registry name (`--model resnet`), a user's factory (`--model
my_pkg.nets:build` or `--model path/to/nets.py:build`), or, from Python, a module or factory
object (`anytrain.train(config, model=...)`). Whatever it is gets one forward pass on a tiny batch
before training, so a wrong output shape is one line naming --model, not a traceback mid-step."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from .config import ConfigError, ModelConfig, first_line
from .models import REGISTRY
from .shape import DataShape

AUTO = {"tabular": "mlp", "image": "resnet", "tokens": "bag", "text": "gpt"}  # --model auto, by the kind of data
OBJECT = "object:"  # cfg.model.name of a run whose model was a Python object (anytrain.train(model=...))


def import_attr(spec: str, option: str = "--model"):
    """'package.module:attr' or 'path/to/file.py:attr' -> the attribute; ConfigError naming the option."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        expected = "module:Class or file.py:Class" if option == "--task" else "module:factory / file.py:factory"
        raise ConfigError(f"{option} {spec}: expected {expected}")
    module = import_source(spec, target, option)
    if not hasattr(module, attr):
        raise ConfigError(f"{option} {spec}: {target} has no attribute '{attr}'")
    return getattr(module, attr)


def import_source(spec: str, target: str, option: str):
    """`target` ('package.module' or 'path/to/file.py', of the option's value `spec`) imported; ConfigError naming
    the option."""
    if target.endswith(".py") and not Path(target).expanduser().is_file():
        raise ConfigError(f"{option} {spec}: file not found: {target}")
    try:
        return _import_file(Path(target).expanduser()) if target.endswith(".py") else _import_module(target)
    except Exception as e:  # noqa: BLE001 - any failure inside the user's module is reported as one line
        raise ConfigError(f"{option} {spec}: cannot import {target} ({first_line(e)})") from None


def import_factory(spec: str) -> Callable:
    """'package.module:attr' or 'path/to/file.py:attr' -> the factory; ConfigError naming --model."""
    if ":" not in spec:
        raise ConfigError(
            f"--model {spec}: expected a registry name ({', '.join(REGISTRY)}) or module:factory / file.py:factory"
        )
    factory = import_attr(spec)
    if not callable(factory):
        target, _, attr = spec.rpartition(":")
        raise ConfigError(
            f"--model {spec}: {target}.{attr} is not callable (a factory(model, shape) returning an nn.Module is "
            "expected)"
        )
    return factory


_IMPORTED: dict[tuple[str, float], object] = {}  # a file imported once per version: its classes stay the same


def _import_file(path: Path):
    key = (str(path.resolve()), path.stat().st_mtime)
    if key in _IMPORTED:
        return _IMPORTED[key]
    name = f"anytrain_user_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))  # the file may import its neighbours
    sys.modules[name] = module  # so its classes pickle (DataLoader workers, torch.save)
    spec.loader.exec_module(module)
    _IMPORTED[key] = module
    return module


def _import_module(name: str):
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as under `python -m`: packages in the working directory import
    return importlib.import_module(name)


def model_name(model_cfg: ModelConfig, shape: DataShape) -> str:
    """What --model auto stands for (the one rule: by the kind of data), or the name or factory given."""
    return AUTO[shape.kind] if model_cfg.name == "auto" else model_cfg.name


def make_model(model_cfg: ModelConfig, shape: DataShape, given=None, example_targets=None) -> nn.Module:
    """The model to train (the one way to build one): given (an nn.Module or a factory) or named by
    model_cfg; checked against the data's shape with one forward pass (the task's example targets go
    to a model that takes targets)."""
    label = f"--model {model_cfg.name}"
    name = model_name(model_cfg, shape)
    if given is None and name.startswith(OBJECT):
        raise ConfigError(
            f"this run's model ({name.removeprefix(OBJECT)}) was passed to anytrain.train() as a Python object; "
            "build it again and pass it: load_model(run_dir, model=...)"
        )
    if isinstance(given, nn.Module):
        model = given
    else:
        factory = given if given is not None else REGISTRY.get(name) or import_factory(name)
        try:
            model = factory(model_cfg, shape)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's factory: one line, not its traceback
            raise ConfigError(f"{label}: the factory raised {first_line(e)}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{label}: the factory returned {type(model).__name__}, not a torch.nn.Module")
    check_outputs(model, shape, label, example_targets)
    return model


def logits_of(outputs):
    """The tensor of predictions in a model's output: the output itself, or its `logits` (dict or attribute)."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    return outputs.get("logits") if isinstance(outputs, dict) else getattr(outputs, "logits", None)


def loss_of(outputs):
    """The loss a model computed itself (a dict's or object's `loss`, the transformers convention), or None."""
    if isinstance(outputs, torch.Tensor):
        return None
    return outputs.get("loss") if isinstance(outputs, dict) else getattr(outputs, "loss", None)


def targets_keyword(model: nn.Module) -> str | None:
    """'labels' or 'targets' when the model's forward takes the targets (it computes its own loss)."""
    parameters = inspect.signature(model.forward).parameters
    return next((name for name in ("labels", "targets") if name in parameters), None)


def forward_for(model: nn.Module, pass_targets: bool = True) -> Callable:
    """How the loop calls this model, `forward(model, inputs, targets, share=None)`: model(inputs), or
    model(inputs, labels=targets) for one that takes them (unless the task computes the loss itself,
    pass_targets=False), then also given `num_items_in_batch=share` when the batch has a share of its step
    (transformers' convention: its loss is the sum over the targets divided by it); a dict of inputs
    (transformers' batches) is passed as keyword arguments. Decided once, on the unwrapped model, so the loop
    holds no branch for it."""
    keyword = targets_keyword(model) if pass_targets else None
    if keyword is None:
        return lambda m, inputs, targets, share=None: m(**inputs) if isinstance(inputs, dict) else m(inputs)

    def forward(m, inputs, targets, share=None):
        extra = {keyword: targets} if share is None else {keyword: targets, "num_items_in_batch": share}
        return m(**inputs, **extra) if isinstance(inputs, dict) else m(inputs, **extra)

    return forward


def check_outputs(model: nn.Module, shape: DataShape, label: str, targets: torch.Tensor | None = None) -> None:
    """One forward pass on a batch of 2 (eval mode, no gradients): the logits must have the shape the loss
    needs; a model may instead (or also) return its own loss, as a dict's or an object's `loss`."""
    inputs = shape.example_inputs(2)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            outputs = forward_for(model)(model, inputs.to(device), None if targets is None else targets.to(device))
    except Exception as e:  # noqa: BLE001
        raise ConfigError(
            f"{label}: the model failed on a batch of inputs of shape {tuple(inputs.shape)}: {first_line(e)}"
        ) from None
    finally:
        model.train(was_training)
    logits = logits_of(outputs)
    if logits is None and loss_of(outputs) is None:
        raise ConfigError(
            f"{label}: the model's output has neither logits nor a loss (got {type(outputs).__name__}): return logits, "
            "or a dict or object with `logits` and/or `loss`"
        )
    if logits is None:
        return  # a model that returns only its own loss
    expected = shape.logits_shape(2)
    got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
    if got != expected:
        what = "(batch, block_size, vocab_size)" if shape.kind == "text" else "(batch, num_classes)"
        raise ConfigError(
            f"{label}: the model maps inputs of shape {tuple(inputs.shape)} to {got}; expected logits of shape "
            f"{expected} {what}"
        )
