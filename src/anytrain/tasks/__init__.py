"""The tasks, one module each, and the registry: one line per task.

    classify     classify.py     class ids; cross-entropy; accuracy (tables, images, streams, text)
    regress      regress.py      numeric targets, standardised; MSE or huber; RMSE, MAE, R²
    multilabel   multilabel.py   multi-hot targets; BCE; micro/macro F1, exact match
    lm           lm.py           token windows; next-token cross-entropy; perplexity
    hf:classify  hf_text.py      a transformers sequence classifier on text
    hf:lm        hf_lm.py        a transformers causal LM, token-weighted loss
    hf:tag       hf_tag.py       a transformers token classifier on tagged words; entity P/R/F1
    hf:mlm       hf_mlm.py       a transformers masked LM on your text (domain adaptation); perplexity
    hf:seq2seq   hf_seq2seq.py   a transformers encoder-decoder on source and target texts; exact match, BLEU
    hf:sft       hf_sft.py       a transformers causal LM on chats (loss on the answers); exact match by generation
    hf:classify-images  hf_image.py  a transformers vision model with its image processor (--task classify on images)

A task implements base.Task (the written contract); settle.py decides which registry line a run uses,
once, before anything is written. Adding a task is its module plus its line here.
"""

from __future__ import annotations

from ..config import TrainConfig
from .base import BaseTask, Task, best_criterion, check_loss, evaluate, training_loss, user_loss_function
from .classify import Classification
from .hf_image import HFImageClassification
from .hf_lm import HFCausalLM
from .hf_mlm import MaskedLM
from .hf_seq2seq import Seq2Seq
from .hf_sft import SupervisedFineTuning
from .hf_tag import TokenClassification
from .hf_text import HFClassification
from .lm import LanguageModel
from .multilabel import MultiLabel
from .regress import Regression

REGISTRY: dict[str, type[BaseTask]] = {
    "classify": Classification,
    "regress": Regression,
    "multilabel": MultiLabel,
    "lm": LanguageModel,
    "hf:classify": HFClassification,
    "hf:lm": HFCausalLM,
    "hf:tag": TokenClassification,
    "hf:mlm": MaskedLM,
    "hf:seq2seq": Seq2Seq,
    "hf:sft": SupervisedFineTuning,
    "hf:classify-images": HFImageClassification,
}
META_KEY = "task_module"  # the registry line of a run, saved with its weights


def make_task(cfg: TrainConfig, key: str) -> Task:
    """The registry's task for a settled config (settle.settle gives the key)."""
    task = REGISTRY[key](cfg)
    task.key = key
    return task


def task_of_run(cfg: TrainConfig, meta: dict) -> Task:
    """The task a finished run trained, from its saved config and weights' metadata."""
    key = meta.get(META_KEY) or (f"hf:{cfg.data.task}" if cfg.model.name.startswith("hf:") else cfg.data.task)
    return make_task(cfg, key)


__all__ = [
    "REGISTRY",
    "Task",
    "best_criterion",
    "check_loss",
    "evaluate",
    "make_task",
    "task_of_run",
    "training_loss",
    "user_loss_function",
]
