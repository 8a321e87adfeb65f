"""Classical baselines to measure anytrain against, on the same rows (`python benchmarks/baselines.py
[--out bench_out/baselines]`, needs the `baselines` extra, scikit-learn): TF-IDF + logistic regression
on shakespeare-speakers (who speaks, 8 classes: features and C chosen on the validation split, then
validation and test accuracy), and Ridge regression on scikit-learn's bundled diabetes table, which is
written to OUT/diabetes.parquet (target column `target`) and split exactly as anytrain splits a table
without splits: `anytrain.data.carve` itself, with anytrain's default seed and fractions (validation 0.1,
test 0.2 of the rows by a seeded permutation), so the test R² is on the rows anytrain's test split holds
(alpha chosen on validation). Prints a Markdown table and writes OUT/baselines.json. It imports anytrain
only for the speakers set and the split.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_diabetes
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.metrics import accuracy_score, r2_score
from sklearn.pipeline import make_pipeline, make_union
from sklearn.preprocessing import StandardScaler

from anytrain.config import TrainConfig
from anytrain.data.sources import carve
from anytrain.data.speakers import LABEL_COLUMN, NAME, TEXT_COLUMN, load_speakers

SPLITS = ("train", "validation", "test")
C_GRID = (1.0, 10.0, 100.0)
ALPHA_GRID = tuple(float(a) for a in np.logspace(-3, 3, 13))


def tfidf(kind: str):
    """Sublinear TF-IDF of word 1-2-grams, of character 2-5-grams within words, or of both side by side."""
    word = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    char = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True)
    return {"word 1-2": word, "char 2-5": char, "word 1-2 + char 2-5": make_union(word, char)}[kind]


def speakers_baseline() -> dict:
    """TF-IDF + logistic regression fitted on the train split; features and C by validation accuracy."""
    data = load_speakers()
    text = {name: data[name][TEXT_COLUMN] for name in SPLITS}
    label = {name: data[name][LABEL_COLUMN] for name in SPLITS}
    grid, best = [], None
    for kind in ("word 1-2", "char 2-5", "word 1-2 + char 2-5"):
        for c in C_GRID:
            model = make_pipeline(tfidf(kind), LogisticRegression(C=c, max_iter=5000))
            model.fit(text["train"], label["train"])
            accuracy = accuracy_score(label["validation"], model.predict(text["validation"]))
            grid.append({"features": kind, "C": c, "validation_accuracy": accuracy})
            if best is None or accuracy > best[0]:  # ties keep the earlier, simpler candidate
                best = (accuracy, kind, c, model)
    accuracy, kind, c, model = best
    majority = max(set(label["train"]), key=label["train"].count)
    return {
        "dataset": NAME,
        "rows": {name: len(text[name]) for name in SPLITS},
        "classes": sorted(set(label["train"])),
        "model": f"TF-IDF ({kind}) + LogisticRegression(C={c:g})",
        "validation_accuracy": accuracy,
        "test_accuracy": accuracy_score(label["test"], model.predict(text["test"])),
        "majority_class": majority,
        "majority_test_accuracy": label["test"].count(majority) / len(label["test"]),
        "grid": grid,
    }


def anytrain_rows(path: Path, rows: int, seed: int) -> dict[str, np.ndarray]:
    """Which rows of a table without splits land in anytrain's train/validation/test: its own `carve`,
    given row numbers as the inputs, with anytrain's defaults (val_fraction 0.1, test_fraction 0.2)."""
    cfg = TrainConfig(dataset=str(path), seed=seed)
    parts = carve({"train": (torch.arange(rows), torch.zeros(rows))}, cfg, str(path))
    return {name: parts[name][0].numpy() for name in SPLITS}


def diabetes_baseline(out: Path, seed: int) -> dict:
    """Ridge (on standardised features) fitted on anytrain's training rows; alpha by validation R²."""
    frame = load_diabetes(as_frame=True).frame  # 442 rows: 10 feature columns and `target`
    path = out / "diabetes.parquet"
    frame.to_parquet(path, index=False)
    rows = anytrain_rows(path, len(frame), seed)
    x = {name: frame.drop(columns="target").iloc[rows[name]].to_numpy() for name in SPLITS}
    y = {name: frame["target"].iloc[rows[name]].to_numpy() for name in SPLITS}
    grid, best = [], None
    for alpha in ALPHA_GRID:
        model = make_pipeline(StandardScaler(), Ridge(alpha=alpha)).fit(x["train"], y["train"])
        r2 = r2_score(y["validation"], model.predict(x["validation"]))
        grid.append({"alpha": alpha, "validation_r2": r2})
        if best is None or r2 > best[0]:
            best = (r2, alpha, model)
    r2, alpha, model = best
    return {
        "dataset": str(path),
        "target_column": "target",
        "seed": seed,
        "rows": {name: len(rows[name]) for name in SPLITS},
        "test_rows": rows["test"].tolist(),  # row numbers of the parquet file, in anytrain's test order
        "model": f"StandardScaler + Ridge(alpha={alpha:g})",
        "validation_r2": r2,
        "test_r2": r2_score(y["test"], model.predict(x["test"])),
        "train_mean_test_r2": r2_score(y["test"], np.full(len(y["test"]), y["train"].mean())),
        "anytrain": f"accelerate launch src/train.py --dataset {path} --label-column target --task regress "
        f"--seed {seed} --val-fraction 0.1 --test-fraction 0.2",
        "grid": grid,
    }


def table(speakers: dict, diabetes: dict) -> str:
    """The figures as a small Markdown table."""
    s, d = speakers, diabetes
    sizes = "/".join(str(n) for n in s["rows"].values()), "/".join(str(n) for n in d["rows"].values())
    return "\n".join(
        [
            "| data (train/validation/test rows) | model, chosen on validation | metric | validation | test |",
            "|---|---|---|---|---|",
            f"| {s['dataset']} ({sizes[0]}), {len(s['classes'])} classes | {s['model']} | accuracy "
            f"| {s['validation_accuracy']:.3f} | {s['test_accuracy']:.3f} |",
            f"| same | always {s['majority_class']} (the most frequent) | accuracy | | "
            f"{s['majority_test_accuracy']:.3f} |",
            f"| diabetes ({sizes[1]}), target `target` | {d['model']} | R² | {d['validation_r2']:.3f} "
            f"| {d['test_r2']:.3f} |",
            f"| same | the training mean | R² | | {d['train_mean_test_r2']:.3f} |",
        ]
    )


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out/baselines", help="folder for baselines.json and diabetes.parquet")
    p.add_argument("--seed", type=int, default=TrainConfig().run.seed, help="anytrain's --seed for the diabetes split")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"speakers": speakers_baseline(), "diabetes": diabetes_baseline(out, args.seed)}
    (out / "baselines.json").write_text(json.dumps(result, indent=1) + "\n")
    print(table(result["speakers"], result["diabetes"]))
    print(f"\ndiabetes table: {result['diabetes']['dataset']} (target column 'target'); the same rows in anytrain:")
    print(f"  {result['diabetes']['anytrain']}")
    print(f"figures: {out / 'baselines.json'}")
    return result


if __name__ == "__main__":
    main()
