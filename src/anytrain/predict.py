"""Use a trained classifier, regressor or multi-label model on new data:

    anytrain predict runs/default --dataset new_rows.csv --output preds.jsonl
    python -m anytrain.predict runs/default --dataset new_rows.parquet

One JSON line per row: the row index, then what the run's task predicts: a classifier's class id,
its name when the training labels had names (strings or a ClassLabel) and its probability; a
regressor's values in the targets' own units, by column name; a multi-label model's labels above its
threshold with their probabilities. The true label follows when the file has the run's label column.
The file is read like training data (`datasets`: parquet, csv, json/jsonl, a save_to_disk folder);
it must hold the run's input columns, saved with the weights. A text run's texts are tokenised by
the run's own tokenizer (a BPE's tokenizer.json beside the weights) and truncated to its --max-length.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from .config import ConfigError, OneLineParser
from .files import write_atomically
from .outputs import load_model, read_weights_metadata, weights_file
from .shape import DataShape


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="anytrain predict", description="Predict for new rows with a trained classify, regress or multilabel run."
    )
    parser.add_argument("run_dir", help="run folder (or its model.safetensors) of a classification run")
    parser.add_argument(
        "--dataset", required=True, help="rows to classify: a parquet/csv/json file or a save_to_disk folder"
    )
    parser.add_argument("--output", default="", help="write the predictions to this JSONL file (default: print them)")
    parser.add_argument("--batch-size", type=int, default=1024, help="rows per forward pass (default: %(default)s)")
    return parser


def read_rows(dataset: str, columns: list[str]) -> tuple[torch.Tensor, np.ndarray | None, object]:
    """(features in the run's column order, the file's split, its columns) or ConfigError."""
    from .data import _load_raw, _named_splits, _numeric_rows

    raw, source = _load_raw(dataset)
    splits = _named_splits(raw)
    ds = splits.get("test", splits["train"]) if len(splits) > 1 else splits["train"]
    missing = [c for c in columns if c not in ds.column_names]
    if missing:
        raise ConfigError(
            f"--dataset: {source} lacks the run's input columns {', '.join(missing)} (it has "
            f"{', '.join(ds.column_names)})"
        )
    table = ds.with_format("arrow")
    try:
        features = np.concatenate([_numeric_rows(table[c]) for c in columns], axis=1)
    except (ValueError, TypeError) as e:
        raise ConfigError(
            f"--dataset: the input columns of {source} are not numeric like the training data's ({e})"
        ) from None
    return torch.from_numpy(features), ds, source


def read_images(dataset: str, columns: list[str], meta: dict) -> tuple[torch.Tensor, object, str]:
    """The images of the run's image column, prepared as in training without augmentation: converted, resized and
    normalised."""
    from .data import _load_raw, _named_splits
    from .data.images import ImageLook, ImageRows

    raw, source = _load_raw(dataset)
    splits = _named_splits(raw)
    ds = splits.get("test", splits["train"]) if len(splits) > 1 else splits["train"]
    if columns[0] not in ds.column_names:
        raise ConfigError(
            f"--dataset: {source} lacks the run's image column {columns[0]} (it has {', '.join(ds.column_names)})"
        )
    look = json.loads(meta["image_look"])
    look = ImageLook(look["mode"], look["size"], torch.tensor(look["mean"]), torch.tensor(look["std"]))
    rows = ImageRows(ds, columns[0], torch.zeros(len(ds), dtype=torch.long), "predict", look)
    return (
        torch.cat([rows.__getitems__(list(range(i, min(i + 256, len(ds)))))[0] for i in range(0, len(ds), 256)]),
        ds,
        source,
    )


def read_texts(dataset: str, columns: list[str], meta: dict, folder: Path, max_length: int):
    """The run's text column, tokenised as in training (the run's tokenizer, its --max-length), as rows
    whose batches are padded to their longest text."""
    from .data import _load_raw, _named_splits
    from .data.textcls import TokenRows, check_texts, encode_texts, texts_of
    from .tasks import vocab_of

    raw, source = _load_raw(dataset)
    splits = _named_splits(raw)
    ds = splits.get("test", splits["train"]) if len(splits) > 1 else splits["train"]
    check_texts(ds, columns[0], source, "predict")
    tokens, offsets, _ = encode_texts(vocab_of(meta, folder), texts_of(ds, columns[0]), max_length)
    return TokenRows(tokens, offsets, torch.zeros(len(ds), dtype=torch.long)), ds, source


def read_hf_texts(dataset: str, columns: list[str], folder: Path, max_length: int):
    """The text column tokenised by a transformers run's own tokenizer (run_dir/hf), as in training."""
    from .data import _load_raw, _named_splits
    from .data.hftext import HFRows
    from .data.textcls import check_texts
    from .hf import tokenizer_of_run

    raw, source = _load_raw(dataset)
    splits = _named_splits(raw)
    ds = splits.get("test", splits["train"]) if len(splits) > 1 else splits["train"]
    check_texts(ds, columns[0], source, "predict")
    tokenizer = tokenizer_of_run(folder)
    encoded = ds.map(
        lambda b: tokenizer(b[columns[0]], truncation=True, max_length=max_length),
        batched=True,
        remove_columns=ds.column_names,
    )
    return HFRows(encoded, torch.zeros(len(ds), dtype=torch.long), tokenizer, None), ds, source


def read_inputs(dataset: str, meta: dict, weights: Path):
    """(inputs to classify, the file's split, its name): rows of numbers, images or texts, as the run was trained on."""
    columns = json.loads(meta["input_columns"])
    if "image_look" in meta:
        return read_images(dataset, columns, meta)
    shape = DataShape.from_json(meta["data_shape"]) if "data_shape" in meta else None
    if "hf" in meta:
        return read_hf_texts(dataset, columns, weights.parent, shape.max_length)
    if shape is not None and shape.kind == "tokens":
        return read_texts(dataset, columns, meta, weights.parent, shape.max_length)
    features, ds, source = read_rows(dataset, columns)
    if "num_features" in meta and features.shape[1] != int(meta["num_features"]):
        raise ConfigError(
            f"--dataset: {source} gives {features.shape[1]} features per row; the run was trained on "
            f"{meta['num_features']}"
        )
    return features, ds, source


def in_batches(inputs, batch_size: int):
    """Tensors sliced; texts (TokenRows) padded per batch."""
    for i in range(0, len(inputs), batch_size):
        if isinstance(inputs, torch.Tensor):
            yield inputs[i : i + batch_size]
        else:
            yield inputs.__getitems__(list(range(i, min(i + batch_size, len(inputs)))))[0]


def predict(run_dir: str, dataset: str, batch_size: int = 1024) -> list[dict]:
    """One dict per row: its index, what the run's task predicts (tasks.py `predictions`: a class and its
    probability, values in the targets' units, or the labels above the threshold), and the true label."""
    from .data.targets import label_columns
    from .tasks import get_task, logits_of
    from .usermodel import forward_for

    weights = weights_file(run_dir)
    _, cfg, meta = read_weights_metadata(weights)
    if cfg.data.task == "lm":
        raise ConfigError(f"run_dir: {run_dir} is a language-model run; use `anytrain sample {run_dir}`")
    if "input_columns" not in meta:
        raise ConfigError(
            f"run_dir: no input columns were saved with {run_dir} (trained on generated data, or by an older anytrain)"
        )
    inputs, ds, _ = read_inputs(dataset, meta, weights)
    model = load_model(weights)
    with torch.no_grad():
        forward = forward_for(model)  # a dict of inputs (a transformers run's batches) as keyword arguments
        outputs = torch.cat([logits_of(forward(model, batch, None)) for batch in in_batches(inputs, batch_size)])
    rows = [{"row": i, **row} for i, row in enumerate(get_task(cfg).predictions(outputs, meta))]
    labels = [c for c in label_columns(cfg) if c in ds.column_names]
    for label in labels:
        for i, value in enumerate(ds[label]):
            rows[i]["label" if len(labels) == 1 else f"label_{label}"] = value
    return rows


def main(argv: list[str] | None = None) -> None:
    try:
        args = build_parser().parse_args(argv)
        if args.batch_size <= 0:
            raise ConfigError(f"--batch-size must be positive, got {args.batch_size}")
        text = "".join(json.dumps(row) + "\n" for row in predict(args.run_dir, args.dataset, args.batch_size))
    except ConfigError as err:
        print(f"anytrain predict: error: {err}", file=sys.stderr)
        sys.exit(2)
    if args.output:
        out = Path(args.output)
        write_atomically(out, text)
        print(f"anytrain predict: {text.count(chr(10))} predictions written to {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
