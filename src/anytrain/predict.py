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

import torch

from .config import ConfigError, OneLineParser
from .files import write_atomically
from .reload import load_model, read_weights_metadata, weights_file

# The tasks that offer predict (tests/test_predict.py keeps this true to the registry).
PREDICTING = "classify, regress, multilabel, or transformers classify, lm (each text's loss), tag, seq2seq or reward"


def build_parser() -> argparse.ArgumentParser:
    what = f"Predict for new rows with a trained {PREDICTING} run."
    parser = OneLineParser(prog="anytrain predict", description=what)
    parser.add_argument("run_dir", help="run folder (or its model.safetensors) of a run whose task predicts")
    parser.add_argument(
        "--dataset", required=True, help="rows to predict for: a parquet/csv/json file or a save_to_disk folder"
    )
    parser.add_argument("--output", default="", help="write the predictions to this JSONL file (default: print them)")
    parser.add_argument("--batch-size", type=int, default=1024, help="rows per forward pass (default: %(default)s)")
    return parser


def in_batches(inputs, batch_size: int):
    """Tensors sliced; texts (TokenRows) padded per batch."""
    for i in range(0, len(inputs), batch_size):
        if isinstance(inputs, torch.Tensor):
            yield inputs[i : i + batch_size]
        else:
            yield inputs.__getitems__(list(range(i, min(i + batch_size, len(inputs)))))[0]


def predict(run_dir: str, dataset: str, batch_size: int = 1024) -> list[dict]:
    """One dict per row: its index, what the run's task predicts (its `predictions`: a class and its
    probability, values in the targets' units, or the labels above the threshold), and the true label.
    The run's task reads the file as it read its training data (its `predict_inputs`)."""
    from .data.targets import label_columns
    from .tasks import task_of_run
    from .tasks.contract import predictor

    weights = weights_file(run_dir)
    _, cfg, meta = read_weights_metadata(weights)
    task = predictor(task_of_run(cfg, meta), "run_dir")  # a task that cannot predict says so before any reading
    inputs, ds, _ = task.predict_inputs(dataset, meta, weights.parent)
    model = load_model(weights)
    with torch.no_grad():
        predicted = [row for batch in in_batches(inputs, batch_size) for row in task.predict_batch(model, batch, meta)]
    rows = [{"row": i, **row} for i, row in enumerate(predicted)]
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
