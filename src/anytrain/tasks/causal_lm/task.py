"""`CausalLM`, the abstract base of the transformers causal-LM tasks (hf:lm, sft, dpo, grpo): what each of them does
with its model the same way. The model is the tokenizer's and the config's of `--model hf:FOLDER`, loaded as
AutoModelForCausalLM without its key-value cache in training (as TRL: it costs memory, and turns off transformers'
mask per packed text), with the texts of a packed row kept apart (--packing), its activations checkpointed and its
LoRA adapters where asked, then given to the loop as head.CausalLMHead (the fused output layer). The weights reload
from the transformers config saved with them, the model exports to run_dir/hf, and `anytrain sample` answers a
prompt in a user turn of the chat template (hf:lm, which continues text, has its own).

A task standing on it defines load_data (its rows, with `read_model` before them, or `load_tokenizer` and
`check_config` around them; `stops_for` once their format is known), its step or loss, and its evaluation."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ... import lora
from ...config import TrainConfig
from ...hf import Head
from .. import transformers
from ..contract import Task


class CausalLM(Task):
    """A transformers causal LM's model, tokenizer, reload, export and sample (module docstring)."""

    head = Head("AutoModelForCausalLM", "causal-LM", loss_type="ForCausalLM")
    hints = {"predict": "it answers prompts with `anytrain sample RUN --prompt ...`"}

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.ends: dict = {}  # the stop ids and whether the rows were chats, saved with the weights (stops_for)

    @classmethod
    def settle(cls, cfg: TrainConfig) -> tuple[TrainConfig, tuple[str, ...]]:
        return transformers.fitted_max_length(cls.head, cfg)

    @classmethod
    def positions(cls, cfg: TrainConfig) -> str | None:
        return "max_length"

    def read_model(self) -> None:
        """The model's own tokenizer, then its config checked for the task (said before any data is read)."""
        self.load_tokenizer()
        self.check_config()

    def load_tokenizer(self) -> None:
        from ... import hf

        self.tokenizer = hf.load_tokenizer(self.cfg)

    def check_config(self) -> None:
        """The model's transformers config for the task, checked against the tokenizer and --max-length."""
        pad = self.tokenizer.pad_token_id
        self.model_config = transformers.checked_config(self.cfg, self.head, self.name, pad, self.tokenizer)

    def stops_for(self, chats: bool) -> list[int]:
        """Where a generated answer stops (the template's end of turn, else the end-of-text token, and the model's
        own end ids), saved with the weights for `anytrain sample`, as is whether the rows were chats."""
        from .generation import model_eos, stop_ids

        stops = stop_ids(self.tokenizer, model_eos(self.cfg, self.model_config), chats)
        self.ends = {"stop_ids": stops, "chat_template": "yes" if chats else "no"}
        return stops

    def build_model(self, given=None) -> nn.Module:
        from ... import hf
        from .head import CausalLMHead, chunk_of, describe_router, why_not

        model = hf.load_model(self.cfg, self.head, self.model_config)
        self.use_cache = getattr(model.config, "use_cache", None)  # restored for the exported model
        model.config.use_cache = False
        why = why_not(model, self.run.shards)
        if why is None:
            self.say(f"the loss and log-probabilities come from the output layer {chunk_of(model)} tokens at a time "
                     "(no full logits)")  # fmt: skip
        else:
            self.say(f"the model computes its own loss from its full logits: {why}")
        router = describe_router(model)
        if router is not None:
            self.say(f"a mixture of experts: {router}")
        if self.cfg.data.packing:  # offered by hf:lm, sft and dpo
            self.packed_by = keep_texts_apart(model, self.data.train, self.say)
        if self.cfg.model.gradient_checkpointing:
            hf.checkpoint_activations(model)
        if self.cfg.model.lora_r:  # the weights frozen, adapters beside them trained
            model = lora.wrap(model, lora.settings(self.cfg), self.head.auto_class, self.say)
        return CausalLMHead(model, fused=why is None)

    def model_from_metadata(self, meta: dict, given=None) -> nn.Module:
        return transformers.model_from_metadata(self.head, meta)

    def describe_data(self, model: nn.Module) -> dict:
        from ...hf import checkpoints_activations

        facts = {**super().describe_data(model), "gradient_checkpointing": checkpoints_activations(model)}
        if self.cfg.data.packing:
            facts["packed_texts_kept_apart_by"] = self.packed_by  # "positions", or "mask" (packed.py)
        return facts

    def weights_metadata(self) -> dict:
        """The transformers config and the data's shape; the stop ids and whether the rows were chats (stops_for)."""
        saved = transformers.saved_metadata(self.cfg, self.data, self.model_config)
        return {**saved, **self.data.metadata, **self.ends}

    def export(self, model: nn.Module, run_dir: Path) -> None:
        from .head import plain

        transformers.export(self.cfg, plain(model), self.tokenizer, run_dir, getattr(self, "use_cache", None))

    def sample(self, model: nn.Module, folder: Path, meta: dict, prompt: str, settings: dict) -> str:
        """The reply to the prompt, in a user turn of the chat template (as it is for text rows)."""
        from .answers import Answers

        return Answers.sample(model, folder, meta, prompt, settings)


def keep_texts_apart(model: nn.Module, train, say) -> str:
    """--packing: how this model keeps the texts of a row apart, checked on it (packed.py), or refused; the training
    rows told which mask their batches need. Returns "positions" or "mask"."""
    from ... import packed

    way = packed.keep_apart(model)
    train.mask = way  # packed rows: the mask in every batch it needs
    say(f"--packing: {packed.SAID[way]}")
    return way.split()[-1]
