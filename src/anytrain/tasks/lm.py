"""lm: next-token language modelling on windows of text (data/text.py). Targets are the input window
shifted by one token; logits (batch, block, vocabulary); next-token cross-entropy; perplexity and
accuracy. `anytrain sample` continues a prompt with the run's tokenizer (characters, bytes or BPE)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F

from ..best import HIGHER, LOWER
from ..config import ConfigError, TrainConfig
from ..data.splits import Splits
from ..gpt import GPT
from ..shape import DataShape
from ..usermodel import make_model
from .base import means, per_position
from .contract import Task


class LanguageModel(Task):
    name = "lm"
    offers = frozenset({"sample"})
    hints = {"predict": "use `anytrain sample RUN`"}
    goals = {"loss": LOWER, "perplexity": LOWER, "accuracy": HIGHER}

    @classmethod
    def detect(cls, source) -> str | None:
        if source.cfg.model.name == "gpt":
            return "auto: --model gpt models text"
        return "auto: text without labels" if source.plain_text else None

    @classmethod
    def fits(cls, cfg: TrainConfig) -> tuple[tuple[str, ...] | None, str]:
        return ("gpt",), "--task lm"

    @classmethod
    def positions(cls, cfg: TrainConfig) -> str | None:
        return "block_size"

    def load_data(self, given=None) -> Splits:
        from ..data.text import load_text_splits

        self.data = load_text_splits(self.cfg, given)
        return self.data

    def build_model(self, given=None) -> nn.Module:
        shape = self.data.shape
        return make_model(self.cfg.model, shape, given, self.example_targets(shape, 2))

    def model_from_metadata(self, meta: dict, given=None) -> nn.Module:
        from ..data.tokenizer import Vocab

        if "data_shape" in meta:
            shape = meta["data_shape"]
        else:  # runs saved before data_shape was stored with the weights
            size = Vocab.from_dict(meta["vocab"]).size
            shape = DataShape("text", vocab_size=size, block_size=self.cfg.data.block_size)
        return make_model(self.cfg.model, shape, given)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, 1), targets.flatten())  # every position of every window

    def per_sample(self, outputs, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        return per_position(outputs, targets)

    def metrics(self, sums: dict, count: int) -> dict:
        values = means(sums, count)
        return {"loss": values["loss"], "perplexity": math.exp(min(values["loss"], 700.0)), **values}

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return torch.zeros(batch, shape.block_size, dtype=torch.long)

    def describe_data(self, model: nn.Module) -> dict:
        described = super().describe_data(model)
        if isinstance(model, GPT):  # the registry's GPT (MFU in benchmarks/lm_gpu.py)
            described.update(parameters=model.num_parameters())  # its FLOPs: flops.py, in summary.json
        return described

    def sample(self, model: nn.Module, folder: Path, meta: dict, prompt: str, settings: dict) -> str:
        """The prompt and `tokens` sampled tokens, decoded; the prompt is cropped to the last block_size tokens."""
        from ..data.tokenizer import read_tokenizer
        from ..gpt import generate

        block = getattr(model, "block_size", None)
        off = {"--top-p": ("top_p", 1), "--min-p": ("min_p", 0), "--repetition-penalty": ("repetition_penalty", 1)}
        given = next((flag for flag, (name, none) in off.items() if settings[name] != none), None)
        if given:
            raise ConfigError(f"{given}: the gpt samples as nanoGPT does, with --temperature and --top-k only")
        if not isinstance(block, int):
            raise ConfigError(f"run_dir: {folder}: sampling needs a model with a block_size (the registry's gpt)")
        vocab = read_tokenizer(meta["vocab"], folder)
        try:
            ids = vocab.encode(prompt)
        except KeyError as unknown:
            raise ConfigError(f"--prompt: characters not in the run's vocabulary: {unknown.args[0]!r}") from None
        device = settings["device"]
        model = model.to(device)
        context = torch.tensor(ids[-block:], dtype=torch.long, device=device)[None]
        generator = torch.Generator(device=device).manual_seed(settings["seed"])
        out = generate(
            cast(GPT, model),
            context,
            settings["tokens"],
            temperature=settings["temperature"],
            top_k=settings["top_k"],
            generator=generator,
        )
        return prompt + vocab.decode(out[0, context.shape[1] :].tolist())
