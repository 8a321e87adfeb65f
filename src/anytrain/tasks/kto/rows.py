"""kto's data: unpaired preference rows in TRL's formats, tokenised as TRL 1.16's KTOTrainer tokenises them, each with
its KL pair fixed when the data is read, and the training rows' own order and step layout.

    prompt, completion, label     unpaired: text, or lists of {"role", "content"} messages; label true (desirable)
                                  or false (undesirable), a bool
    prompt, chosen, rejected      preference pairs (or chosen and rejected alone: the implicit prompt of
                                  causal_lm/pairs.py), unpaired as TRL's unpair_preference_dataset: a pair becomes
                                  its desirable row (the chosen answer), then its undesirable one (the rejected)

A row is tokenised as TRL's `_prepare_dataset` does (causal_lm/pairs.py: split_pair): the prompt alone and the prompt
followed by the completion (text: with the end-of-text token, unless it ends with it already), the completion's tokens
from where the two part. The sequence is the prompt's tokens then the completion's, cut at --max-length (TRL's
collator cuts it there too).

The KL pair (TRL: the KL completions, `add_kl_completion_ids`): row i's prompt followed by the completion of its
partner p(i), cut at --max-length. TRL rotates the completions by one within each batch of the data as it stands
(row i gets row i - 1's), and so must read the rows in order (sequential sampling) on every rank. Here the partner
is fixed by the data instead: the split's rows are put in a cycle, a permutation drawn from numpy's
default_rng([--seed, split]) (train 0, validation 1, test 2), and each row's partner is the row after it. So a
row's KL pair is the same whatever the batch, the shuffle, the number of ranks or of accumulation steps, its
reference log-probability is cached with the completion's, and every row's completion is some other row's KL
completion (a cycle: each completion is used once per split). `--kl-pairs trl` takes TRL's pairs instead (each
--batch-size rows rotated by one) and reads the training rows in order, as TRL does.

The training rows order themselves (`shuffled = False`): epoch e reads them in the order of numpy's
default_rng([--seed, 3, e]).permutation(rows), the same on every rank. A batch knows its optimizer step (`Layout`:
the loader hands global batch p to rank p % P, and batches p // P // A of a rank make step s), so its step's first
micro-batch can carry this rank's rows of the whole step: the KL estimate is the mean over the step's rows, as one
big batch's would be (tasks/kto/task.py).
"""

from __future__ import annotations

import numpy as np

from ...config import ConfigError, TrainConfig
from ...data.sources import carve_rows, opened
from ...data.splits import Splits
from ...shape import DataShape
from ..causal_lm.pairs import CHOSEN, REJECTED, PairRenderer, check_prompt, implicit_prompt, split_pair
from .batches import KTORows, Layout

PROMPT, COMPLETION, LABEL = "prompt", "completion", "label"
SPLIT_KEYS = {"train": 0, "validation": 1, "test": 2}


def data_format(columns: list[str]) -> str | None:
    """'unpaired' (prompt, completion, label), 'explicit' or 'implicit' pairs (chosen, rejected), else None."""
    if PROMPT in columns and COMPLETION in columns and LABEL in columns:
        return "unpaired"
    if CHOSEN in columns and REJECTED in columns:
        return "explicit" if PROMPT in columns else "implicit"
    return None


def partners(n: int, seed: int, split: str, batch: int = 0) -> np.ndarray:
    """Each row's KL partner: the next row in a cycle through a permutation of the split's n rows drawn from
    default_rng([seed, split's key]), so every row's partner is another row (n > 1). `batch` (--kl-pairs trl): TRL's
    instead, each `batch` consecutive rows' completions rotated by one (row i gets row i - 1's, the first the last;
    a last batch of one row is its own partner, as in TRL)."""
    if batch:
        rows = np.arange(n)
        start = rows // batch * batch
        size = np.minimum(start + batch, n) - start
        return start + (rows - start - 1) % size
    order = np.random.default_rng([seed, SPLIT_KEYS[split]]).permutation(n)
    partner = np.empty(n, dtype=np.int64)
    partner[order] = np.roll(order, -1)
    return partner


# --------------------------------------------------------------------------- reading a row


def label_of(value, where: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ConfigError(
        f"{where}: its label is {value!r}, not true or false (a bool: whether the completion is desirable)"
    )


def filled(value, name: str, where: str):
    """A completion (or chosen, rejected answer) as given, refused when missing or empty."""
    empty = value is None or (isinstance(value, str) and not value.strip()) or (isinstance(value, list) and not value)
    if isinstance(value, list) and value and all(isinstance(t, dict) for t in value):
        empty = not any(str(t.get("content") or "").strip() for t in value if t.get("role") == "assistant")
    if empty:
        raise ConfigError(f"{where}: the {name} is missing or empty")
    return value


def unpaired(row: dict, form: str, where: str) -> list[tuple]:
    """A source row as (prompt, completion, desirable) rows: itself, or a pair's desirable then undesirable row."""
    if form == "unpaired":
        return [(row[PROMPT], filled(row[COMPLETION], COMPLETION, where), label_of(row[LABEL], where))]
    chosen, rejected = filled(row[CHOSEN], "chosen answer", where), filled(row[REJECTED], "rejected answer", where)
    if chosen == rejected:
        raise ConfigError(f"{where}: the chosen and rejected answers are the same")
    if form == "implicit":
        prompt, chosen, rejected = implicit_prompt(chosen, rejected, where)
    else:
        prompt = row[PROMPT]
    return [(prompt, chosen, True), (prompt, rejected, False)]


class Renderer:
    """A row's prompt and completion -> its text and where the completion starts (TRL's rendering)."""

    def __init__(self, tokenizer, source: str, split: str):
        self.tokenizer, self.chats = tokenizer, PairRenderer("explicit", tokenizer, source, split)

    def __call__(self, prompt, completion, where: str) -> tuple[str, int]:
        if isinstance(prompt, str) and isinstance(completion, str):
            if not prompt.strip():
                raise ConfigError(f"{where}: the prompt is empty")
            end = self.tokenizer.eos_token or ""
            return prompt + completion + ("" if end and completion.endswith(end) else end), len(prompt)
        if not (isinstance(prompt, list) and isinstance(completion, list)):
            raise ConfigError(f"{where}: the prompt and the completion must both be text or both be lists of messages")
        return self.chats.chat(prompt, completion, where)


def tokenised(tokenizer, text: str, start: int, plain: bool, max_length: int, name: str, where: str):
    """(prompt ids, completion ids) as TRL splits them; refused when the prompt leaves no room for the completion."""
    ids, flags = split_pair(tokenizer, [(text, start)], plain)[0]
    cut = flags.index(True) if True in flags else len(ids)
    check_prompt(cut, max_length, name, where)
    if cut >= len(ids):
        raise ConfigError(f"{where}: the {name} completion has no token of its own")
    return ids[:cut], ids[cut:]


def encode(ds, form: str, tokenizer, source: str, split: str, max_length: int):
    """The split as a datasets.Dataset of each source row's unpaired rows (prompt ids, completion ids, label)."""
    import datasets

    if len(ds) == 0:
        raise ConfigError(f"--dataset: the {split} split of {source} is empty")
    render = Renderer(tokenizer, source, split)
    out: dict[str, list] = {"prompts": [], "completions": [], "labels": []}
    for index, row in enumerate(ds):
        where = f"--dataset: row {index} of the {split} split of {source}"
        parts = []
        for prompt, completion, desirable in unpaired(row, form, where):
            text, start = render(prompt, completion, where)
            name = "desirable" if desirable else "undesirable"
            parts.append((*tokenised(tokenizer, text, start, isinstance(prompt, str), max_length, name, where),
                          desirable))  # fmt: skip
        for key, values in zip(out, zip(*parts)):
            out[key].append(list(values))
    return datasets.Dataset.from_dict(out)


# --------------------------------------------------------------------------- a dataset's splits


def read_splits(cfg: TrainConfig, tokenizer, given) -> tuple[dict, str, str]:
    """({split: (prompt ids, completion ids, labels)}, the format, the source): read, checked, carved (a pair's two
    rows stay in one split), tokenised, unpaired."""
    splits, source = opened(cfg, given)
    train = splits["train"]
    form = data_format(train.column_names)
    if form is None:
        missing = "no label column" if PROMPT in train.column_names and COMPLETION in train.column_names else (
            "neither prompt, completion and label columns nor chosen and rejected ones")  # fmt: skip
        raise ConfigError(
            f"--task {cfg.data.task}: {source} has {missing} (columns: {', '.join(train.column_names)}); kto reads "
            "prompt, completion and label (true: desirable, false: undesirable), or preference pairs"
        )
    first = train[0]
    chats = isinstance(first[COMPLETION if form == "unpaired" else CHOSEN], list)
    if chats and not tokenizer.chat_template:
        raise ConfigError(
            f"--model {cfg.model.name}: its tokenizer has no chat template, which chats (lists of messages) need"
        )
    encoded = {name: encode(ds, form, tokenizer, source, name, cfg.data.max_length) for name, ds in splits.items()}
    out = {}
    for name, ds in carve_rows(encoded, cfg, source).items():
        flat = [[value for row in ds[column] for value in row] for column in ("prompts", "completions", "labels")]
        out[name] = tuple(flat)
    labels = out["train"][2]
    if all(labels) or not any(labels):
        only = "desirable (label true)" if labels[0] else "undesirable (label false)"
        raise ConfigError(
            f"--dataset: every row of the train split of {source} is {only}; kto needs both desirable and "
            "undesirable completions"
        )
    return out, form + (" chats" if chats else " text"), source


def weight_note(labels: list[bool], desirable_weight: float, undesirable_weight: float) -> str | None:
    """TRL's advice where the classes' counts differ and neither weight is in the range that evens them out
    (KTO paper, Eq. 8: desirable_weight x desirable rows / (undesirable_weight x undesirable rows) in [1, 4/3])."""
    good = max(sum(labels), 1)
    bad = max(len(labels) - good, 1)
    if good == bad:
        return None
    lo_d, hi_d = round(bad * undesirable_weight / good, 2), round(bad * undesirable_weight / good * 1.33, 2)
    lo_u, hi_u = round(good * desirable_weight / bad / 1.33, 2), round(good * desirable_weight / bad, 2)
    if lo_d <= desirable_weight <= hi_d or lo_u <= undesirable_weight <= hi_u:
        return None
    return (
        f"{good:,} desirable and {bad:,} undesirable training rows: TRL recommends EITHER --desirable-weight in "
        f"[{lo_d}, {hi_d}] OR --undesirable-weight in [{lo_u}, {hi_u}] (not both)"
    )


def kto_splits(cfg: TrainConfig, tokenizer, given, multiple, processes: int) -> tuple[Splits, str]:
    """The task's Splits (tasks/kto/batches.py: KTORows) and the data's format ("unpaired chats", ...)."""
    o = cfg.section("kto")
    read, form, source = read_splits(cfg, tokenizer, given)
    rows, cut, seen = {}, 0, 0
    for name, (prompts, completions, labels) in read.items():
        partner = partners(len(labels), cfg.run.seed, name, cfg.optim.batch_size if o.kl_pairs == "trl" else 0)
        packed = cfg.data.max_length if cfg.data.packing and name == "train" else 0
        layout = Layout(len(labels), cfg.optim.batch_size, processes, cfg.optim.grad_accum_steps, cfg.run.seed,
                        o.kl_pairs == "cycle")  # fmt: skip
        rows[name] = KTORows.of(prompts, completions, labels, partner, cfg.data.max_length, tokenizer.pad_token_id,
                                multiple, packed, name, layout if name == "train" else None)  # fmt: skip
        cut += sum(len(p) + len(c) > cfg.data.max_length for p, c in zip(prompts, completions))
        seen += len(labels)
    train = rows["train"]
    desirable = int(train.labels.sum())
    facts = {
        "tokenizer": f"{type(tokenizer).__name__} (the model's own)",
        "vocab_size": len(tokenizer),
        "kto_format": form,
        "train_rows": len(train),
        "train_desirable": desirable,
        "train_undesirable": len(train) - desirable,
        "train_tokens": int(train.lengths[::2].sum()),
        "kl_pairs": o.kl_pairs,
        "data_path": "rendered and tokenised, "
        + ("each batch's sequences packed into rows of --max-length" if cfg.data.packing else "padded per batch"),
    }
    pad = tokenizer.pad_token_id
    shape = DataShape("tokens", vocab_size=len(tokenizer), max_length=cfg.data.max_length, pad_id=pad)
    data = Splits.of(rows, shape, source, input_columns=["prompt"], facts=facts, tokenizer=tokenizer,
                     tokens_per_sample=float(train.lengths[::2].sum() / max(len(train), 1)))  # fmt: skip
    if cut:
        data.notes.append(f"--max-length {cfg.data.max_length} cuts {cut:,} of {seen:,} completions short (their ends)")
    note = weight_note(read["train"][2], o.desirable_weight, o.undesirable_weight)
    if note:
        data.notes.append(note)
    return data, form
