"""Preference pairs (`--task dpo` on a causal LM, `--task reward` on a sequence classifier), in TRL's formats:

    prompt, chosen, rejected   text, or lists of {"role", "content"} messages (the prompt rendered by the chat
                               template with its generation prompt, each answer as the turns that follow it)
    chosen, rejected           implicit prompt: whole chats that share every turn but the last assistant answer
                               (or texts split as TRL's extract_prompt splits them: the prompt is their common
                               beginning up to the first character where they differ, less a space just before
                               it, which begins both answers: " 12." and " 125." share the prompt "... 12")

A pair becomes two token sequences, the prompt followed by each answer (text ends with the end-of-text token; a
chat is rendered by the template). An answer's tokens are those that hold any of its characters, so its end-of-turn
token counts too, and so does a first token that straddles the boundary (a byte-level BPE's " word" after a prompt
ending in a space). Bad rows are refused in one line naming the row: an empty answer, the same answer twice,
implicit chats with different prompts, a prompt that leaves no room for an answer at --max-length or has no token of
its own (all of it joined to the answer's first token).
An answer longer than the room left is cut at --max-length (said at start, with how many).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...config import ConfigError, TrainConfig
from ...data.sources import carve_rows, opened
from ...data.splits import Rows, Splits
from ...shape import IGNORE, DataShape
from .prompts import check_messages, render

PROMPT, CHOSEN, REJECTED = "prompt", "chosen", "rejected"


def pair_format(columns: list[str]) -> str | None:
    """'explicit' (prompt, chosen, rejected columns), 'implicit' (chosen and rejected), else None."""
    if CHOSEN not in columns or REJECTED not in columns:
        return None
    return "explicit" if PROMPT in columns else "implicit"


def answer_text(value, name: str, where: str):
    """A chosen or rejected answer as given, refused when missing or empty."""
    empty = value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value)
    if isinstance(value, list) and value and all(isinstance(t, dict) for t in value):
        empty = not any(str(t.get("content") or "").strip() for t in value if t.get("role") == "assistant")
    if empty:
        raise ConfigError(f"{where}: the {name} answer is missing or empty")
    return value


def implicit_prompt(chosen, rejected, where: str):
    """(prompt, chosen answer, rejected answer) of chats or texts that share their prompt."""
    if isinstance(chosen, str) and isinstance(rejected, str):
        cut = text_split(chosen, rejected)
        if not chosen[:cut].strip():
            raise ConfigError(f"{where}: chosen and rejected share no prompt (implicit prompt: no common beginning)")
        return chosen[:cut], chosen[cut:], rejected[cut:]
    if not (isinstance(chosen, list) and isinstance(rejected, list)):
        raise ConfigError(f"{where}: chosen and rejected must both be text or both be lists of messages")
    if chosen[:-1] != rejected[:-1] or not chosen[:-1]:
        raise ConfigError(
            f"{where}: implicit prompt: chosen and rejected must be the same chat up to their last assistant turn, "
            "and they differ there"
        )
    return chosen[:-1], chosen[-1:], rejected[-1:]


def text_split(chosen: str, rejected: str) -> int:
    """Where TRL 1.16's extract_prompt (trl/data_utils.py) ends the prompt of two texts: at the first character where
    they differ, one earlier where a space precedes it (the space begins the answers); where one text is the other's
    beginning, before the shorter one's last character (its loop's last index)."""
    shortest = min(len(chosen), len(rejected))
    cut = next((k for k in range(shortest) if chosen[k] != rejected[k]), shortest - 1)
    if cut < shortest and chosen[cut] != rejected[cut] and chosen[cut - 1] == " ":
        cut -= 1
    return cut


class PairRenderer:
    """A split's rows -> for each pair, its two texts (prompt + answer) and where each answer starts."""

    def __init__(self, form: str, tokenizer, source: str, split: str):
        self.form, self.tokenizer, self.source, self.split = form, tokenizer, source, split

    def __call__(self, row: dict, index: int) -> list[tuple[str, int]]:
        where = f"--dataset: row {index} of the {self.split} split of {self.source}"
        chosen = answer_text(row[CHOSEN], CHOSEN, where)
        rejected = answer_text(row[REJECTED], REJECTED, where)
        if chosen == rejected:
            raise ConfigError(f"{where}: the chosen and rejected answers are the same")
        if self.form == "implicit":
            prompt, chosen, rejected = implicit_prompt(chosen, rejected, where)
        else:
            prompt = row[PROMPT]
        if isinstance(prompt, str) and isinstance(chosen, str) and isinstance(rejected, str):
            if not prompt.strip():
                raise ConfigError(f"{where}: the prompt is empty")
            end = self.tokenizer.eos_token or ""
            return [(prompt + answer + end, len(prompt)) for answer in (chosen, rejected)]
        if not all(isinstance(part, list) for part in (prompt, chosen, rejected)):
            raise ConfigError(f"{where}: prompt, chosen and rejected must all be text or all be lists of messages")
        return [self.chat(prompt, answer, where) for answer in (chosen, rejected)]

    def chat(self, prompt: list, answer: list, where: str) -> tuple[str, int]:
        check_messages(prompt + answer, f"{where}, prompt + answer")
        before, through = render(self.tokenizer, prompt, True), render(self.tokenizer, prompt + answer)
        if not through.startswith(before):
            raise ConfigError(
                f"{where}: the model's chat template does not render the answer as a continuation of the prompt's "
                "generation prompt"
            )
        return through, len(before)


@dataclass(frozen=True)
class PairBatch:
    """A batch of B pairs (dpo's, reward's): the model's inputs for its 2B sequences (the chosen first) and the pairs'
    reference log-probabilities (B, 2: chosen, rejected; NaN where they are not cached)."""

    inputs: dict
    reference: torch.Tensor

    def __len__(self) -> int:
        return len(self.reference)  # pairs

    def to(self, device, non_blocking: bool = False) -> PairBatch:
        """On `device` (accelerate's send_to_device calls this, as the prepared loader and the start-up check do)."""
        from accelerate.utils import send_to_device

        inputs = send_to_device(self.inputs, device, non_blocking=non_blocking)
        return PairBatch(inputs, self.reference.to(device, non_blocking=non_blocking))

    def counts(self) -> tuple[int, int]:
        """(pairs, tokens of their sequences, padding included): what the batch counts for in the throughput."""
        return len(self), self.inputs["input_ids"].numel()


class PairRows(Rows):
    """Tokenised pairs, each two sequences (chosen, rejected) held as flat int32 arrays with offsets. A batch of
    B pairs is 2B sequences, the B chosen first: padded one a row (input_ids, attention_mask), or with `packed`
    (the --max-length of a row) as few rows as hold them, position ids restarting at each (no attention across). Inputs
    also hold `labels` (the answer's ids, -100 elsewhere) and `sequence_ids` (each token's sequence); the targets
    are the pairs' cached reference log-probabilities (B, 2), NaN where there are none."""

    def __init__(self, ids: list[list[int]], answers: list[list[bool]], pad_id: int, multiple, packed: int = 0):
        self.pad_id, self.multiple, self.packed, self.max_length = pad_id, multiple, bool(packed), packed
        self.lengths = np.array([len(seq) for seq in ids], dtype=np.int64)  # 2 per pair: chosen, rejected
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.ids = np.fromiter((t for seq in ids for t in seq), dtype=np.int32, count=int(self.starts[-1]))
        self.answer = np.fromiter((a for seq in answers for a in seq), dtype=bool, count=int(self.starts[-1]))
        self.reference: torch.Tensor | None = None  # (pairs, 2): set by the task when it caches them
        self.answers_in_inputs = True  # labels and sequence_ids in the inputs (a reward model reads the texts only)
        self.mask = ""  # packed: "mask" or "additive mask" where the model needs one (packed.keep_apart)

    def __len__(self) -> int:
        return len(self.lengths) // 2

    @property
    def targets_per_row(self) -> np.ndarray:
        """One a row: the loss is a mean over pairs."""
        return np.ones(len(self), dtype=np.int64)

    def sequence(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        start, n = self.starts[k], self.lengths[k]
        ids = torch.from_numpy(self.ids[start : start + n].astype(np.int64))
        return ids, ids.masked_fill(~torch.from_numpy(self.answer[start : start + n]), IGNORE)

    def sequences(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The pairs' sequences in a batch's order: the chosen ones, then the rejected ones."""
        return [self.sequence(k) for k in [2 * i for i in indices] + [2 * i + 1 for i in indices]]

    def __getitems__(self, indices: list[int]):
        seqs = self.sequences(indices)
        inputs = self.packed_batch(seqs) if self.packed else self.padded_batch(seqs)
        if not self.answers_in_inputs:
            inputs = {k: inputs[k] for k in ("input_ids", "attention_mask")}
        reference = torch.full((len(indices), 2), float("nan"))
        if self.reference is not None:
            reference = self.reference[torch.as_tensor(indices)]
        return PairBatch(inputs, reference)

    def width(self, longest: int) -> int:
        return -(-longest // self.multiple) * self.multiple if self.multiple else longest

    def padded_batch(self, seqs: list) -> dict:
        width = self.width(max(len(ids) for ids, _ in seqs))
        input_ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask, labels = torch.zeros_like(input_ids), torch.full_like(input_ids, IGNORE)
        for k, (ids, answer) in enumerate(seqs):
            input_ids[k, : len(ids)], labels[k, : len(ids)], mask[k, : len(ids)] = ids, answer, 1
        sequence_ids = torch.arange(len(seqs))[:, None].expand(-1, width).contiguous()
        return {"input_ids": input_ids, "attention_mask": mask, "labels": labels, "sequence_ids": sequence_ids}

    def packed_batch(self, seqs: list) -> dict:
        """The batch's sequences in rows of at most --max-length tokens (next fit, in order), position ids
        restarting at each; the rows padded to the fullest one (padding: a sequence of its own, learned nowhere).
        Rows rather than one long row: attention's cost grows with the square of a row's length."""
        from ...data.packing import row_layout, with_mask

        lengths = np.array([len(ids) for ids, _ in seqs], dtype=np.int64)
        rows = row_layout(lengths, self.max_length)
        count = int(rows[-1]) + 1
        used = np.bincount(rows, weights=lengths, minlength=count).astype(np.int64)
        width = self.width(int(used.max()))
        input_ids = torch.full((count, width), self.pad_id, dtype=torch.long)
        labels = torch.full_like(input_ids, IGNORE)
        positions = torch.arange(width).repeat(count, 1)
        sequence_ids = torch.zeros_like(input_ids)
        at = np.zeros(count, dtype=np.int64)
        for k, ((ids, answer), row) in enumerate(zip(seqs, rows.tolist())):
            a, n = int(at[row]), len(ids)
            input_ids[row, a : a + n], labels[row, a : a + n] = ids, answer
            positions[row, a : a + n], sequence_ids[row, a : a + n] = torch.arange(n), k
            at[row] += n
        tail = torch.arange(width) >= torch.as_tensor(used)[:, None]
        positions[tail] = (torch.arange(width) - torch.as_tensor(used)[:, None])[tail]
        inputs = {"input_ids": input_ids, "position_ids": positions, "labels": labels, "sequence_ids": sequence_ids}
        return with_mask(inputs, self.mask)

    def set_epoch(self, epoch: int) -> None:
        """Nothing is random in a pair's tokens."""


def check_prompt(tokens: int, max_length: int, name: str, where: str) -> None:
    """A prompt of `tokens` tokens must leave room for the answer, and hold a token of its own: the sequence's first
    token is predicted by nothing, so an answer starting there would lose it."""
    if not tokens:
        raise ConfigError(
            f"{where}: its prompt has no token of its own (the tokenizer joins it to the start of the {name} answer), "
            "so the answer's first token could not be scored; lengthen the prompt"
        )
    if tokens >= max_length:
        raise ConfigError(
            f"{where}: its prompt is {tokens} tokens, which leaves no room for the {name} answer at --max-length "
            f"{max_length} (the answer would be cut entirely; raise --max-length or shorten the prompt)"
        )


def split_pair(tokenizer, texts: list[tuple[str, int]], plain: bool) -> list[tuple[list[int], list[bool]]]:
    """A pair's two sequences (each text and where its answer starts) as TRL 1.16 splits them (DPOTrainer's
    tokenize_fn): the prompt tokenised alone and each sequence whole; both answers start where the prompt's tokens and
    the first sequence to leave them part (the shorter trl.data_utils.common_prefix_length). So a token that the
    prompt's end shares with one answer counts in both: "... A: wh" is " w" "h" alone and " w" "hat" before "at.",
    and the rejected answer of "wh." is "h" ".". A first token that straddles the prompt's end (a byte-level BPE's
    " word" after a prompt ending in a space) is the answer's. Returns each sequence's ids and answer flags."""
    text, start = texts[0]
    prompt = tokenizer(text[:start], add_special_tokens=plain)["input_ids"]
    sequences = [tokenizer(text, add_special_tokens=plain)["input_ids"] for text, _ in texts]
    shared = min(common_prefix(prompt, ids) for ids in sequences)
    return [(ids, [k >= shared for k in range(len(ids))]) for ids in sequences]


def common_prefix(ids: list[int], other: list[int]) -> int:
    return next((k for k, (a, b) in enumerate(zip(ids, other)) if a != b), min(len(ids), len(other)))


def encode(ds, renderer: PairRenderer, max_length: int):
    """The split as a datasets.Dataset of each pair's two sequences (token ids, answer flags: split_pair), cut at
    --max-length, and how many answers were cut. ConfigError naming the row (as read) when a prompt leaves no room for
    an answer or has no token of its own."""
    import datasets

    if len(ds) == 0:
        raise ConfigError(f"--dataset: the {renderer.split} split of {renderer.source} is empty")
    ids, answers, cut = [], [], 0
    for index, row in enumerate(ds):
        where = f"--dataset: row {index} of the {renderer.split} split of {renderer.source}"
        plain = not isinstance(row[CHOSEN], list)  # text: the tokenizer's own special tokens; a chat: its template's
        pair = split_pair(renderer.tokenizer, renderer(row, index), plain)
        for (tokens, answer), name in zip(pair, (CHOSEN, REJECTED)):
            check_prompt(answer.index(True) if True in answer else len(answer), max_length, name, where)
            cut += len(tokens) > max_length
            ids.append(tokens[:max_length])
            answers.append(answer[:max_length])
    return datasets.Dataset.from_dict(
        {
            "ids": [ids[k : k + 2] for k in range(0, len(ids), 2)],
            "answers": [answers[k : k + 2] for k in range(0, len(ids), 2)],
        }
    ), cut


def pair_rows(cfg: TrainConfig, tokenizer, given, multiple) -> tuple[dict, str, str, list[str]]:
    """({split: PairRows}, the pair format, the source, notes): read, checked, carved, tokenised."""
    splits, source = opened(cfg, given)
    train = splits["train"]
    form = pair_format(train.column_names)
    if form is None:
        raise ConfigError(
            f"--task {cfg.data.task}: {source} has no chosen and rejected columns (columns: "
            f"{', '.join(train.column_names)})"
        )
    if not tokenizer.is_fast:
        raise ConfigError(f"--model {cfg.model.name}: --task {cfg.data.task} needs a fast tokenizer (tokenizer.json)")
    first = train[0]
    chat = isinstance(first[CHOSEN], list)
    if chat and not tokenizer.chat_template:
        raise ConfigError(
            f"--model {cfg.model.name}: its tokenizer has no chat template, which chats (lists of messages) need"
        )
    encoded, cut = {}, 0
    for name, ds in splits.items():
        encoded[name], dropped = encode(ds, PairRenderer(form, tokenizer, source, name), cfg.data.max_length)
        cut += dropped
    rows, seen = {}, 0
    for name, ds in carve_rows(encoded, cfg, source).items():
        ids = [seq for pair in ds["ids"] for seq in pair]
        answers = [seq for pair in ds["answers"] for seq in pair]
        seen += len(ids)
        packed = cfg.data.max_length if cfg.data.packing and name == "train" else 0  # rows of --max-length
        rows[name] = PairRows(ids, answers, tokenizer.pad_token_id, multiple, packed)
    notes = []
    if cut:
        notes.append(f"--max-length {cfg.data.max_length} cuts {cut:,} of {seen:,} answers short (their ends)")
    return rows, form + (" chats" if chat else " text"), source, notes


def pair_splits(cfg: TrainConfig, tokenizer, given, multiple) -> tuple[Splits, str]:
    """What dpo and reward read the same way: the pairs (pair_rows) as the task's Splits, and their format ("explicit
    chats", "implicit text", ...)."""
    rows, form, source, notes = pair_rows(cfg, tokenizer, given, multiple)
    train = rows["train"]
    facts = {
        "tokenizer": f"{type(tokenizer).__name__} (the model's own)",
        "vocab_size": len(tokenizer),
        "pair_format": form,
        "train_pairs": len(train),
        "train_tokens": int(train.lengths.sum()),
        "train_answer_tokens": int(train.answer.sum()),
        "data_path": "rendered and tokenised, "
        + ("each batch's sequences packed into rows of --max-length" if cfg.data.packing else "padded per batch"),
    }
    shape = DataShape(
        "tokens", vocab_size=len(tokenizer), max_length=cfg.data.max_length, pad_id=tokenizer.pad_token_id
    )
    data = Splits.of(
        rows,
        shape,
        source,
        input_columns=["prompt"],
        facts=facts,
        tokenizer=tokenizer,
        tokens_per_sample=float(train.lengths.sum() / max(len(train), 1)),
    )
    data.notes.extend(notes)
    return data, form
