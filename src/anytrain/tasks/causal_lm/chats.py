"""Chats and instructions for a transformers causal LM (`--task sft`), in the two forms TRL reads:

    messages            a list of {"role": system|user|assistant|tool, "content": text} per row (the column's
                        name: --text-column, default `messages`); rendered by the model's chat template
    prompt, completion  text (the completion follows the prompt, then the end-of-text token), or lists of
                        messages (the prompt's rendered with the template's generation prompt)
    tools               (optional, with chats) the row's tools: a list of JSON schemas (transformers'
                        `get_json_schema`), or that list as JSON text; the template renders them (`tools=`)

Tool-calling chats, as TRL writes them: an assistant turn may call tools (`tool_calls`: [{"type": "function",
"function": {"name": ..., "arguments": {...}}}], its content "" or absent) and a `tool` message brings a result
back ({"role": "tool", "name": ..., "content": text}). Every rendering of such a row passes its tools, so the
template's tools block is part of every prompt; a template that cannot render tools (causal_lm/tools.py) is refused
in one line. The calls are the assistant's turn, so they are learned; a tool's result is context, never a target.

The loss is on the assistant's (or the completion's) tokens only: a conversation is rendered once, each
assistant turn's characters found by rendering the turns before it (with the generation prompt) and the
turns through it, and a token is a target when it holds any character of such a span, so the turn's
end-of-turn token is learned too (the model learns to stop), and so is a first token that straddles the span's
start (a byte-level BPE's " word" after a prompt ending in a space). Every other token's target is -100.
An assistant turn's span is everything the template renders for it after the generation prompt (its text, its
rendered tool calls, its end of turn); tool messages, the tools block and the generation prompts lie outside.

The training split is packed (--packing, data/packing.py: conversations whole into rows, long ones split)
or truncated at --max-length; validation and test keep one conversation a row, truncated at --max-length,
so that evaluation can generate each one's last answer from what precedes it (tasks/hf_sft/).
"""

from __future__ import annotations

import json

import numpy as np
import torch

from ...config import ConfigError, TrainConfig, first_line
from ...data.packing import PackedRows
from ...data.sources import carve_rows, opened
from ...data.splits import Rows, Splits
from ...shape import IGNORE, DataShape
from .prompts import check_messages, render
from .tools import check_renders_tools

MESSAGES, PROMPT, COMPLETION, TOOLS = "messages", "prompt", "completion", "tools"


def chat_format(columns: list[str], features, text_column: str = "") -> str | None:
    """'messages' for a column of message lists (--text-column, default `messages`), 'prompt-completion' for
    prompt and completion columns, else None (not chat data)."""
    import datasets

    name = text_column or MESSAGES
    if name in columns and not isinstance(features[name], datasets.Value):
        return MESSAGES
    if PROMPT in columns and COMPLETION in columns:
        return "prompt-completion"
    return None


Piece = tuple[str, list[tuple[int, int]]]  # a text to train on and the character spans of its answers


def chat_pieces(tokenizer, messages: list, learn_from: int, where: str, tools: list | None = None) -> list[Piece]:
    """The conversation as the texts to train on, with the character spans of its assistant turns from index
    `learn_from` on: one text, the conversation rendered once, where the template renders every answer there as
    it does when the answer is the last turn; else (a template that rewrites earlier turns, such as one that
    drops their reasoning) one text per answer: the turns through it, as the template renders them then. Every
    rendering is given the row's `tools`."""
    try:
        text = render(tokenizer, messages, tools=tools)
        turns = [k for k, turn in enumerate(messages) if turn["role"] == "assistant" and k >= learn_from]
        alone = [answer_alone(tokenizer, messages, k, where, tools) for k in turns]
        spans = [span_in(tokenizer, text, through, start) for through, start in alone]
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - a template raises what its author chose (roles out of order, ...)
        raise ConfigError(f"{where}: the model's chat template cannot render it ({first_line(e)})") from None
    if all(span is not None for span in spans):
        return [(text, [span for span in spans if span is not None])]
    return [(through, [(start, len(through))]) for through, start in alone]


def answer_alone(tokenizer, messages: list, k: int, where: str, tools: list | None = None) -> tuple[str, int]:
    """(the turns through answer k as the template renders them, where the answer starts): after the turns
    before it rendered with the generation prompt (both with the row's tools)."""
    before, through = render(tokenizer, messages[:k], True, tools), render(tokenizer, messages[: k + 1], tools=tools)
    if not through.startswith(before):
        raise ConfigError(
            f"{where}: the model's chat template does not render turn {k} as a continuation of its generation "
            "prompt (the prompt asks for text the answer does not start with), so the answer cannot be trained as "
            "the model would generate it"
        )
    return through, len(before)


def span_in(tokenizer, text: str, through: str, start: int) -> tuple[int, int] | None:
    """Where the answer of `through` (from `start` on) lies in the conversation's text, None where the template
    renders it otherwise there. Through its end when `through` begins the text; else up to the last whole token
    the two share, when what `through` has after it closes the whole text too (a template that ends a
    conversation with its end-of-text token, but not each turn)."""
    if text.startswith(through):
        return start, len(through)
    if not text.startswith(through[:start]):
        return None
    shared = next((n for n, (a, b) in enumerate(zip(through, text)) if a != b), min(len(through), len(text)))
    offsets = tokenizer(through, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    end = max((b for _, b in offsets if b <= shared), default=0)
    if end <= start or not text.endswith(through[end:]):
        return None
    return start, end


def row_tools(row: dict, where: str) -> list | None:
    """The row's tools (the `tools` column, as TRL's SFTTrainer reads it): a list of JSON schemas, or that list as
    JSON text; None where it has none (no column, null, empty)."""
    tools = row.get(TOOLS)
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}, column '{TOOLS}': not JSON ({first_line(e)})") from None
    if not tools:
        return None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise ConfigError(
            f"{where}, column '{TOOLS}': expected a list of JSON schemas (dicts, as transformers' get_json_schema "
            f"makes them) or that list as JSON text, got {tools!r:.80}"
        )
    return tools


def uses_tools(messages: list) -> bool:
    """Whether a chat calls tools: a tool message, or an assistant turn with tool_calls."""
    return any(turn["role"] == "tool" or turn.get("tool_calls") for turn in messages)


class Renderer:
    """A split's rows -> the texts to train on with their learned character spans (chat_pieces), one format,
    checked row by row; counts the answers, and the empty ones; refuses a template that cannot render tools at the
    first row that brings tools (module docstring)."""

    def __init__(self, form: str, column: str, tokenizer, source: str, split: str):
        self.form, self.column, self.tokenizer, self.source, self.split = form, column, tokenizer, source, split
        self.answers = self.empty = self.calls = 0  # answers, empty ones, ones that call tools
        self.tools_checked = False  # whether the template was seen to render tools

    def __call__(self, row: dict, index: int) -> list[Piece]:
        where = f"--dataset: row {index} of the {self.split} split of {self.source}"
        tools = row_tools(row, where)
        if self.form == MESSAGES:
            check_messages(row[self.column], f"{where}, column '{self.column}'", tools=True)
            return self.chat(row[self.column], 0, where, tools)
        prompt, completion = row[PROMPT], row[COMPLETION]
        if isinstance(prompt, str) and isinstance(completion, str):
            if not prompt.strip() or not completion.strip():
                raise ConfigError(f"{where}: an empty prompt or completion")
            if tools:
                raise ConfigError(f"{where}: tools (column '{TOOLS}') need chats, lists of messages: text is not "
                                  "rendered by the chat template")  # fmt: skip
            self.answers += 1
            text = prompt + completion + (self.tokenizer.eos_token or "")
            return [(text, [(len(prompt), len(text))])]
        if isinstance(prompt, list) and isinstance(completion, list):
            check_messages(prompt + completion, f"{where}, columns prompt + completion", tools=True)
            return self.chat(prompt + completion, len(prompt), where, tools)
        raise ConfigError(f"{where}: prompt and completion must both be text or both be lists of messages")

    def chat(self, messages: list, learn_from: int, where: str, tools: list | None) -> list[Piece]:
        if not self.tools_checked and (tools or uses_tools(messages)):
            check_renders_tools(self.tokenizer, f"{where}, " + (f"column '{TOOLS}'" if tools else "its tool calls"))
            self.tools_checked = True
        answers = [turn for turn in messages[learn_from:] if turn["role"] == "assistant"]
        self.answers += len(answers)  # an answer that only calls tools is not empty
        self.calls += sum(bool(turn.get("tool_calls")) for turn in answers)
        self.empty += sum(not (turn.get("content") or "").strip() and not turn.get("tool_calls") for turn in answers)
        return chat_pieces(self.tokenizer, messages, learn_from, where, tools)


def tokenise(tokenizer, text: str, spans: list[tuple[int, int]], plain: bool) -> tuple[list[int], list[int]]:
    """The text's ids and labels: a token's own id where it holds any character of a span, else -100. A token that
    straddles a span's start is the span's: a byte-level BPE joins a word to the space before it (" 42" one token),
    so a prompt ending in a space would otherwise keep the answer's first token."""
    enc = tokenizer(text, add_special_tokens=plain, return_offsets_mapping=True)
    labels = [
        token if end > start and any(start < b and a < end for a, b in spans) else IGNORE
        for token, (start, end) in zip(enc["input_ids"], enc["offset_mapping"])
    ]
    return enc["input_ids"], labels


def encode_split(ds, renderer: Renderer):
    """The split's rows as a datasets.Dataset of input_ids and labels, a list of each per conversation (its
    pieces: chat_pieces), so that carving a validation split keeps a conversation whole (errors name the row as
    read)."""
    import datasets

    if len(ds) == 0:
        raise ConfigError(f"--dataset: the {renderer.split} split of {renderer.source} is empty")
    plain = not templated(renderer.form, ds)
    ids, labels = [], []
    for index, row in enumerate(ds):
        pieces = [tokenise(renderer.tokenizer, text, spans, plain) for text, spans in renderer(row, index)]
        ids.append([piece_ids for piece_ids, _ in pieces])
        labels.append([piece_labels for _, piece_labels in pieces])
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": labels})


def check_answers(renderers: list[Renderer], source: str) -> list[str]:
    """Empty assistant answers teach only the end of a turn: counted, said at start, refused when all are. The
    answers that call tools are said too."""
    answers, empty = sum(r.answers for r in renderers), sum(r.empty for r in renderers)
    calls = sum(r.calls for r in renderers)
    if answers and empty == answers:
        raise ConfigError(f"--dataset: every assistant answer in {source} is empty: there is nothing to learn")
    notes = [f"{calls:,} of {answers:,} assistant answers in {source} call tools: the calls are learned as the chat "
             "template renders them, the tools' results are not"] if calls else []  # fmt: skip
    if empty:
        notes.append(
            f"{empty:,} of {answers:,} assistant answers in {source} are empty: only their end of turn is learned"
        )
    return notes


class ChatRows(Rows):
    """Tokenised conversations, one a row, held as two flat int32 arrays and row offsets (compact: no Python
    list per row); `__getitems__` pads a batch on the right (input_ids with the pad id, attention_mask,
    targets -100), to a multiple of `multiple` when given."""

    def __init__(self, ids: list[list[int]], labels: list[list[int]], pad_id: int, multiple: int | None):
        self.pad_id, self.multiple = pad_id, multiple
        self.lengths = np.array([len(row) for row in ids], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)])
        self.ids = np.fromiter((t for row in ids for t in row), dtype=np.int32, count=int(self.starts[-1]))
        self.labels = np.fromiter((t for row in labels for t in row), dtype=np.int32, count=int(self.starts[-1]))
        learned = np.add.reduceat(self.labels != IGNORE, self.starts[:-1]) if len(ids) else np.zeros(0, np.int64)
        firsts = self.labels[self.starts[:-1][self.lengths > 0]] != IGNORE  # a row's first token is no target
        self.targets_per_row = learned.astype(np.int64)
        self.targets_per_row[self.lengths > 0] -= firsts

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitems__(self, indices: list[int]):
        width = int(self.lengths[indices].max())
        if self.multiple:
            width = -(-width // self.multiple) * self.multiple
        input_ids = torch.full((len(indices), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(indices), width), dtype=torch.long)
        targets = torch.full((len(indices), width), IGNORE, dtype=torch.long)
        for k, index in enumerate(indices):
            start, n = self.starts[index], self.lengths[index]
            input_ids[k, :n] = torch.from_numpy(self.ids[start : start + n])
            targets[k, :n] = torch.from_numpy(self.labels[start : start + n])
            mask[k, :n] = 1
        return {"input_ids": input_ids, "attention_mask": mask}, targets

    def set_epoch(self, epoch: int) -> None:
        """Nothing is random in a conversation's tokens."""


def templated(form: str, ds) -> bool:
    """Whether the rows are chats, rendered by the chat template (prompt/completion text is not)."""
    return form == MESSAGES or not isinstance(ds[0][PROMPT], str)


def check_tokenizer(cfg: TrainConfig, tokenizer, form: str, ds) -> None:
    if not tokenizer.is_fast:
        raise ConfigError(f"--model {cfg.model.name}: --task sft needs a fast tokenizer (tokenizer.json)")
    if templated(form, ds) and not tokenizer.chat_template:
        raise ConfigError(
            f"--model {cfg.model.name}: its tokenizer has no chat template, which chats (lists of messages) need: "
            "save one with the tokenizer (tokenizer.chat_template), or give prompt/completion text columns"
        )


def chat_splits(cfg: TrainConfig, tokenizer, given=None, multiple: int | None = None) -> Splits:
    """The chats read, checked, carved and tokenised: Splits whose batches are (model inputs, target ids)."""
    splits, source = opened(cfg, given)
    train = splits["train"]
    form = chat_format(train.column_names, train.features, cfg.data.text_column)
    if form is None:
        raise ConfigError(
            f"--task sft: {source} has neither a '{cfg.data.text_column or MESSAGES}' column of messages nor prompt "
            f"and completion columns (columns: {', '.join(train.column_names)})"
        )
    column = (cfg.data.text_column or MESSAGES) if form == MESSAGES else PROMPT
    check_tokenizer(cfg, tokenizer, form, train)
    max_length = cfg.data.max_length
    renderers = {name: Renderer(form, column, tokenizer, source, name) for name in splits}
    encoded = {name: encode_split(ds, renderers[name]) for name, ds in splits.items()}
    notes = check_answers(list(renderers.values()), source)
    rows: dict[str, Rows] = {}
    dropped = 0
    for name, ds in carve_rows(encoded, cfg, source).items():
        ids = [piece for row in ds["input_ids"] for piece in row]  # a conversation's pieces, in order
        labels = [piece for row in ds["labels"] for piece in row]
        if name == "train":
            dropped = sum(t != IGNORE for row in labels for t in row[max_length:])
            if cfg.data.packing:
                rows[name] = PackedRows(ids, max_length, tokenizer.pad_token_id, labels)
                continue
        cut = [r[:max_length] for r in ids], [r[:max_length] for r in labels]
        rows[name] = ChatRows(*cut, tokenizer.pad_token_id, multiple)
    meta = {"chat_format": form, "chat_template": "yes" if templated(form, train) else "no"}
    data = splits_of(rows, cfg, tokenizer, source, (form, column, meta), dropped)
    data.notes.extend(notes)
    return data


def splits_of(rows: dict, cfg: TrainConfig, tokenizer, source: str, chats: tuple, dropped: int) -> Splits:
    """Splits of tokenised chats (`chats`: their format, column and the metadata saved with the weights)."""
    (form, column, meta), train = chats, rows["train"]
    packed = cfg.data.packing
    facts = {
        "tokenizer": f"{type(tokenizer).__name__} (the model's own)",
        "vocab_size": len(tokenizer),
        "chat_format": form,
        "chat_template": "the model's own" if meta["chat_template"] == "yes" else None,
        "train_samples": len(train),
        "train_tokens": int(train.lengths.sum()),
        "train_target_tokens": int(train.targets_per_row.sum()),
        "truncated_train_tokens": 0 if packed else dropped,
        "data_path": "rendered and tokenised, "
        + ("packed into rows of --max-length" if packed else "padded per batch"),
    }
    if packed:
        facts.update(packed_rows=len(train), packed_sequences=train.sequences)
    shape = DataShape(
        "tokens", vocab_size=len(tokenizer), max_length=cfg.data.max_length, pad_id=tokenizer.pad_token_id
    )
    splits = Splits.of(
        rows,
        shape,
        source,
        input_columns=[column],
        facts=facts,
        metadata=meta,
        tokenizer=tokenizer,
        tokens_per_sample=float(train.lengths.mean()),
    )
    if dropped and not packed:
        total = int(sum(train.targets_per_row)) + dropped
        splits.notes.append(
            f"--max-length {cfg.data.max_length} truncates the training chats: {dropped:,} of {total:,} answer tokens "
            f"({dropped / total:.1%}) are dropped (--packing splits long chats instead)"
        )
    return splits
