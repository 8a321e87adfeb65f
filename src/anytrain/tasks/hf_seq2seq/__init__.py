"""seq2seq: a transformers encoder-decoder (AutoModelForSeq2SeqLM: T5, BART, ...) on source and target
texts (tasks/hf_seq2seq/hfpairs.py): translation, summarising, rewriting. The loss is the cross-entropy over the
target tokens, token-weighted over the optimizer step (transformers.TokenWeighted). Evaluation also
generates (greedy, up to --max-length tokens) and scores the generations: exact match, and corpus BLEU
by sacrebleu from per-sentence statistics summed over batches and ranks (so 2 ranks score as 1).
`anytrain predict` and `anytrain sample` generate."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from ...best import HIGHER
from ...config import ConfigError
from ...data.splits import Splits
from ...hf import Head
from ...shape import IGNORE, DataShape
from ..causal_lm.generation import unwrapped
from ..transformers import TokenWeighted


def bleu_scorer():
    try:
        from sacrebleu.metrics import BLEU
    except ImportError:
        raise ConfigError("--task seq2seq scores with sacrebleu: pip install 'anytrain[hf]'") from None
    return BLEU()


def bleu_stats(hypotheses: list[str], references: list[str]) -> list[list[float]]:
    """Each sentence's BLEU statistics (sacrebleu's), which summed over a corpus give its corpus BLEU."""
    return [[float(v) for v in row] for row in bleu_scorer()._extract_corpus_statistics(hypotheses, [references])]


def bleu_from_stats(summed: list[float]) -> float:
    """Corpus BLEU (0-100) from summed statistics, with sacrebleu's defaults (exponential smoothing)."""
    scorer = bleu_scorer()
    lengths, matches, totals = summed[:2], summed[2:6], summed[6:10]
    score = scorer.compute_bleu([int(v) for v in matches], [int(v) for v in totals], int(lengths[0]), int(lengths[1]))
    return score.score


class Seq2Seq(TokenWeighted):
    name = "seq2seq"
    goals = {**TokenWeighted.goals, "exact_match": HIGHER, "bleu": HIGHER}
    headline = "exact_match"
    offers = frozenset({"export", "predict", "sample"})
    head = Head("AutoModelForSeq2SeqLM", "sequence-to-sequence")

    def load_data(self, given=None) -> Splits:
        from ... import hf
        from .hfpairs import pair_splits

        self.tokenizer = hf.load_tokenizer(self.cfg)
        self.model_config = self.checked_config(self.tokenizer.pad_token_id)
        start = self.model_config.decoder_start_token_id
        self.data = pair_splits(
            self.cfg,
            self.tokenizer,
            self.tokenizer.pad_token_id if start is None else start,
            given,
            self.run.pad_multiple,
        )
        return self.data

    def generate(self, model: nn.Module, inputs: dict, **sampling) -> list[str]:
        ids = cast(Any, unwrapped(model)).generate(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            max_new_tokens=sampling.pop("max_new_tokens", self.cfg.data.max_length),
            **sampling,
        )
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True)

    def eval_batch(self, model: nn.Module, batch, forward: Callable) -> dict:
        """The target tokens' loss and accuracy (teacher-forced), then the greedy generations' exact match and
        BLEU statistics, per sample."""
        stats = super().eval_batch(model, batch, forward)
        inputs, targets = batch
        hypotheses = self.generate(model, inputs, do_sample=False, num_beams=1)
        references = self.tokenizer.batch_decode(
            targets.masked_fill(targets == IGNORE, self.tokenizer.pad_token_id), skip_special_tokens=True
        )
        exact = [h.strip() == r.strip() for h, r in zip(hypotheses, references)]
        device = targets.device
        stats["exact_match"] = torch.tensor(exact, dtype=torch.float64, device=device)
        stats["bleu"] = torch.tensor(bleu_stats(hypotheses, references), dtype=torch.float64, device=device)
        return stats

    def metrics(self, sums: dict, count: int) -> dict:
        values = super().metrics(sums, count)
        return {
            **values,
            "exact_match": sums["exact_match"].item() / count,
            "bleu": bleu_from_stats(sums["bleu"].tolist()),
        }

    def example_targets(self, shape: DataShape, batch: int) -> torch.Tensor:
        return shape.example_inputs(batch)

    def weights_metadata(self) -> dict:
        return {**super().weights_metadata(), "max_length": self.cfg.data.max_length}

    def predict_inputs(self, dataset: str, meta: dict, folder: Path) -> tuple:
        from ...hf import tokenizer_of_run
        from .hfpairs import predict_pairs

        self.tokenizer = tokenizer_of_run(folder)
        column = meta["input_columns"][0]
        return predict_pairs(dataset, column, self.tokenizer, meta["max_length"])

    def predict_batch(self, model: nn.Module, inputs, meta: dict) -> list[dict]:
        texts = self.generate(model, inputs, do_sample=False, num_beams=1, max_new_tokens=meta["max_length"])
        return [{"prediction": text} for text in texts]

    def sample(self, model: nn.Module, folder: Path, meta: dict, prompt: str, settings: dict) -> str:
        """The prompt as a source, and a target sampled for it (transformers' generate: temperature, top-p, top-k,
        min-p, repetition penalty, seed, up to --tokens tokens)."""
        from ...hf import tokenizer_of_run

        self.tokenizer = tokenizer_of_run(folder)
        model = model.to(settings["device"])
        inputs = self.tokenizer([prompt], return_tensors="pt").to(settings["device"])
        torch.manual_seed(settings["seed"])
        sampling = {k: settings[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty")}
        sampling.update(do_sample=True, min_p=settings["min_p"] or None)  # min-p 0: no min-p filter at all
        return self.generate(model, inputs, max_new_tokens=settings["tokens"], **sampling)[0]
