"""What every transformers task (`--model hf:FOLDER_OR_ID`) shares: the model's own tokenizer loaded from
its folder, the model loaded with the task's Auto class under a config checked against the data
(hf.py), the weights reloadable from the transformers config saved with them, `save_pretrained` into
run_dir/hf at the end, predict tokenising with that folder's tokenizer, and the token-weighted loss
(`token_weighted`) for tasks whose loss is a mean over tokens."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from ..data.splits import Splits
from ..shape import DataShape
from .base import BaseTask


class Transformers(BaseTask):
    """A transformers task's model, tokenizer, metadata, export and predict inputs; its loss, metrics and
    predictions come from the task it is the transformers flavour of (HFClassification(Transformers,
    Classification))."""

    def load_data(self, given=None) -> Splits:
        from .. import hf
        from ..data.hftext import load_hf_splits

        self.tokenizer = hf.load_tokenizer(self.cfg)
        self.data = load_hf_splits(self.cfg, self.tokenizer, self.name, given)
        self.model_config = hf.model_config(
            self.cfg, self.name, self.tokenizer, self.data.class_names, self.data.num_classes
        )
        return self.data

    def build_model(self, given=None) -> nn.Module:
        from .. import hf

        return hf.load_model(self.cfg, self.name, self.model_config)

    def model_from_metadata(self, meta: dict, given=None) -> nn.Module:
        from .. import hf

        return hf.model_from_config(self.name, meta["hf_config"])

    rates = BaseTask.rates  # samples/s and tokens/s from the texts' mean length, whichever task this flavours
    describe_data = BaseTask.describe_data

    def weights_metadata(self) -> dict:
        from ..hf import FOLDER

        data = self.data
        config = self.model_config.to_json_string(use_diff=False)  # load_model rebuilds the model from it
        meta = {"data_shape": data.shape.to_json(), "hf_config": config, "hf": FOLDER}
        if data.num_classes:
            meta["class_names"] = json.dumps(data.class_names or [str(k) for k in range(data.num_classes)])
        return {**meta, "input_columns": json.dumps(data.input_columns)}

    def export(self, model: nn.Module, run_dir: Path) -> None:
        from .. import hf

        hf.save_pretrained(model, self.tokenizer, run_dir)

    def predict_inputs(self, dataset: str, meta: dict, folder: Path) -> tuple:
        from ..data.hftext import predict_hf_texts
        from ..hf import tokenizer_of_run

        columns = json.loads(meta["input_columns"])
        shape = DataShape.from_json(meta["data_shape"])
        return predict_hf_texts(dataset, columns, tokenizer_of_run(folder), shape.max_length)


def token_weighted(batches, loader, epoch: int, skipped: int, per_row, accum: int):
    """Each batch's inputs get `num_items_in_batch`, so that transformers' loss is the sum over its
    target tokens divided by it: the global count of target tokens in the batch's optimizer step
    over (processes x accumulation steps). accelerator.backward divides by the accumulation steps and
    DDP averages over processes, so the step's gradient is that of the mean over all its tokens.
    The counts come from this epoch's batch indices (the sampler is a function of seed and epoch) and
    `per_row` (target tokens per training row), with one all-reduce per epoch: no batch is read ahead."""
    from accelerate.state import PartialState
    from accelerate.utils import reduce

    state = PartialState()
    loader.set_epoch(epoch)
    per_batch = [int(per_row[list(indices)].sum()) for indices in loader.batch_sampler]
    loader.set_epoch(epoch)  # iterating the sampler moved it on
    steps = torch.zeros(math.ceil(len(per_batch) / accum), dtype=torch.float64)
    for k, count in enumerate(per_batch):
        steps[k // accum] += count
    if state.num_processes > 1:
        steps = reduce(steps.to(state.device), "sum").cpu()
    share = (steps / (state.num_processes * accum)).tolist()
    for k, (inputs, targets) in enumerate(batches, start=skipped):
        yield {**inputs, "num_items_in_batch": share[k // accum]}, targets
