"""sft: supervised fine-tuning of a transformers causal LM on chats or prompt/completion pairs (tasks/hf_sft/chats.py).
The loss is on the answers' tokens only, the mean over every answer token of the optimizer step's global
batch (hf:lm's token weighting: the fused loss of lmhead.py with num_items_in_batch). Evaluation also generates
each held-out conversation's last answer from the turns before it (greedy, through the causal-LM core's generate,
stopping at the template's end-of-turn token): exact match of the stripped texts, and the first few in the log.
`anytrain sample` puts the prompt in a user turn of the chat template and prints the reply."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ...best import HIGHER
from ...config import ConfigError, TrainConfig
from ...data.splits import Splits
from ...shape import IGNORE
from ..hf_lm import HFCausalLM
from ..hf_seq2seq import unwrapped

SHOWN = 3  # generations printed after each evaluation


def last_answer(ids: torch.Tensor, targets: torch.Tensor, length: int) -> tuple[list[int], list[int]]:
    """(the tokens before a row's last answer, the answer's tokens): the answer is the row's last run of targets."""
    learned = (targets != IGNORE).nonzero().flatten().tolist()
    if not learned:  # truncation left no answer: the whole row is the prompt, nothing is expected
        return ids[:length].tolist(), []
    start = end = learned[-1]
    while start > 0 and targets[start - 1] != IGNORE:
        start -= 1
    return ids[:start].tolist(), ids[start : end + 1].tolist()


class SupervisedFineTuning(HFCausalLM):
    name = "sft"
    goals = {**HFCausalLM.goals, "exact_match": HIGHER}
    headline = "exact_match"
    offers = HFCausalLM.offers - {"predict"}  # hf:lm scores texts; a chat run answers prompts instead

    hints = {"predict": "it answers prompts with `anytrain sample RUN --prompt ...`"}

    @classmethod
    def detect(cls, source) -> str | None:
        """Chats in TRL's columns: a messages column, or prompt and completion columns."""
        from .chats import MESSAGES, chat_format

        if not source.readable:
            return None
        form = chat_format(source.train.column_names, source.train.features, source.cfg.data.text_column)
        if form == MESSAGES:
            return f"auto: a '{source.cfg.data.text_column or MESSAGES}' column of messages"
        return None if form is None else "auto: prompt and completion columns"

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.stops: list[int] = []  # the template's end-of-turn ids (load_data, sample)
        self.shown: list[str] = []  # this evaluation's first generations, for the log: a run's own, never shared

    def load_data(self, given=None) -> Splits:
        from ... import hf
        from .chats import chat_splits

        self.tokenizer = hf.load_tokenizer(self.cfg)
        self.data, self.stops = chat_splits(self.cfg, self.tokenizer, given)
        self.model_config = self.checked_config(self.tokenizer.pad_token_id)
        return self.data

    def generate(
        self, model: nn.Module, prompts: list[list[int]], new_tokens: int, keys=None, temperature=1.0, top_k=0
    ) -> list[str]:
        """Each prompt's reply through the causal-LM core's generate (greedy, or sampled by `keys`), cut at its first
        stop token, decoded. A prompt keeps its last tokens where it and the reply would not fit the model's
        positions."""
        from ...hf import max_positions
        from ..causal_lm.generation import Sampling, generate

        positions = max_positions(unwrapped(model).config) or len(max(prompts, key=len)) + new_tokens
        new_tokens = max(1, min(new_tokens, positions - 1))
        prompts = [p[-(positions - new_tokens) :] for p in prompts]
        sampling = Sampling(new_tokens, tuple(self.stops), self.tokenizer.pad_token_id, temperature, top_k=top_k)
        done = generate(unwrapped(model), prompts, keys, sampling)
        replies = [ids[:-1] if ids and ids[-1] in self.stops else ids for ids in done.completion_ids()]
        return [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in replies]

    def eval_batch(self, model: nn.Module, inputs, targets: torch.Tensor, forward: Callable) -> dict:
        """The answers' loss and accuracy (teacher-forced), then each row's last answer generated: exact match."""
        stats = super().eval_batch(model, inputs, targets, forward)
        stats["exact_match"] = self.exact_match(model, inputs["input_ids"], targets, inputs["attention_mask"])
        return stats

    def exact_match(self, model: nn.Module, ids: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor):
        """Each row's last answer (its last run of targets) generated greedily from the tokens before it: 1.0 where
        the stripped texts are equal; the evaluation's first few kept for the log."""
        pairs = [last_answer(*row) for row in zip(ids.cpu(), targets.cpu(), mask.sum(1).tolist())]
        replies = self.generate(model, [p for p, _ in pairs], max(len(a) for _, a in pairs))
        expected = [self.tokenizer.decode(answer, skip_special_tokens=True).strip() for _, answer in pairs]
        exact = [reply.strip() == answer for reply, answer in zip(replies, expected)]
        if not self.shown:  # the first rows of the evaluation, for the log
            for (prompt, _), reply, answer in list(zip(pairs, replies, expected))[:SHOWN]:
                asked = self.tokenizer.decode(prompt, skip_special_tokens=True).strip().replace("\n", " | ")
                self.shown.append(f"  ...{asked[-60:]!r} -> {reply.strip()!r} (expected {answer!r})")
        return torch.tensor(exact, dtype=torch.float64, device=targets.device)

    def say_shown(self) -> None:
        """The evaluation's first generated answers, printed once by the main process (metrics calls it)."""
        from accelerate.state import PartialState
        from tqdm.auto import tqdm

        if self.shown and PartialState().is_main_process:
            tqdm.write("\n".join(["generated answers:", *self.shown]))
        self.shown = []

    def metrics(self, sums: dict, count: int) -> dict:
        self.say_shown()
        return {**super().metrics(sums, count), "exact_match": sums["exact_match"].item() / count}

    def weights_metadata(self) -> dict:
        return {**super().weights_metadata(), **self.data.metadata}

    def sample(self, model: nn.Module, folder: Path, meta: dict, prompt: str, settings: dict) -> str:
        """The reply to the prompt, as a user turn in the chat template (a text prompt as it is, for runs that
        trained on prompt/completion text), sampled (temperature, top-k, up to --tokens tokens; the seed is the
        completion's key: the same seed, the same reply on any device or batch)."""
        from ...hf import max_positions, tokenizer_of_run

        self.tokenizer, self.stops = tokenizer_of_run(folder), meta["stop_ids"]
        if meta.get("chat_template") == "yes":
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            ids = self.tokenizer(text, add_special_tokens=False).input_ids
        else:
            ids = self.tokenizer(prompt).input_ids
        positions = max_positions(model.config) or settings["tokens"] + 1
        if settings["tokens"] >= positions:
            raise ConfigError(f"--tokens must be fewer than the model's {positions} positions")
        from ..causal_lm.generation import completion_keys

        key = completion_keys(settings["seed"], 0, 0, torch.tensor([0]), 1)  # the same seed, the same reply
        sampling = {"temperature": settings["temperature"], "top_k": settings["top_k"]}
        return self.generate(model.to(settings["device"]).eval(), [ids], settings["tokens"], key, **sampling)[0]
