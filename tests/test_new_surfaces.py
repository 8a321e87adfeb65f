"""Reliability III (issue 27): the surfaces added last (regression, multi-label, text classification, your
own loss, transformers models) tried as a new user would, with malformed data and models. Each fault class
ends in one line naming the option or file, exit 2 and nothing written that blocks the next correct run,
or, where training is the right answer, in the right task with the start-up line saying why.
docs/reliability.md's catalogue names the test of each class."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import read_summary, run_cli_error
from textdata import texts, write_jsonl

import anytrain


def table(tmp_path, name: str, y, n: int = 60) -> str:
    rng = np.random.default_rng(0)
    path = tmp_path / name
    pq.write_table(pa.table({"a": rng.normal(size=n), "b": rng.normal(size=n), "y": y}), path)
    return str(path)


def error(capsys, tmp_path, *argv: str) -> str:
    """The one line, and that nothing was written."""
    out = tmp_path / "out"
    err = run_cli_error(capsys, [*argv, "--output-dir", str(out), "--epochs", "1"])
    assert not out.exists(), err
    return err


# --------------------------------------------------------------------------- targets and the automatic choice


def test_targets_that_defeat_the_automatic_choice(tmp_path, capsys):
    fractions = np.linspace(0.5, 30.5, 60)
    fractions[17] = np.nan  # one missing value among fractional numbers: regression, and the NaN is named
    err = error(capsys, tmp_path, "--dataset", table(tmp_path, "nan.parquet", fractions), "--label-column", "y")
    assert "'y'" in err and "NaN or infinite targets (first at row 17" in err, err
    huge = np.arange(60, dtype=np.float64) * 1e18  # whole numbers, far beyond any class count
    huge_table = table(tmp_path, "huge.parquet", huge)
    summary = anytrain.train(
        dataset=huge_table, label_column="y", epochs=1, progress=False, output_dir=str(tmp_path / "r1")
    )
    assert summary["task"] == "regress" and "too large to be class ids" in summary["task_reason"]
    err = error(capsys, tmp_path, "--dataset", huge_table, "--label-column", "y", "--task", "classify")
    assert "holds values up to 59000000000000000000: not class ids (for regression use --task regress)" in err
    cells = [str(v) for v in np.linspace(1, 60, 60)]
    cells[33] = "unknown"  # one text cell makes the whole CSV column text
    csv = tmp_path / "cells.csv"
    csv.write_text("a,y\n" + "".join(f"{i},{v}\n" for i, v in enumerate(cells)))
    err = error(capsys, tmp_path, "--dataset", str(csv), "--label-column", "y")
    assert "'y' holds numbers and 1 value(s) that are not (row 33 of the training split: 'unknown')" in err, err
    cells[33] = ""  # an empty cell: pandas reads it as missing, in a column of whole numbers (class ids)
    csv.write_text("a,y\n" + "".join(f"{i},{v}\n" for i, v in enumerate(cells)))
    err = error(capsys, tmp_path, "--dataset", str(csv), "--label-column", "y")
    assert "has 1 missing value(s) (NaN, first at row 33): fill or drop them" in err, err


def test_degenerate_targets_are_refused_instead_of_scoring_nonsense(tmp_path, capsys):
    const = table(tmp_path, "const.parquet", [2.5] * 60)
    err = error(capsys, tmp_path, "--dataset", const, "--label-column", "y", "--task", "regress")
    assert "is 2.5 in every training row: a constant has nothing to regress" in err
    path = tmp_path / "empty.json"
    path.write_text("".join(json.dumps({"a": i, "y": []}) + "\n" for i in range(40)))
    assert "every list in 'y'" in error(
        capsys, tmp_path, "--dataset", str(path), "--label-column", "y", "--task", "multilabel"
    )
    path = tmp_path / "mixed.json"
    rows = [{"a": i, "y": ["red", "blue"][: 1 + i % 2]} for i in range(40)]
    rows[5]["y"] = ["red", 3]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    err = error(capsys, tmp_path, "--dataset", str(path), "--label-column", "y", "--task", "multilabel")
    assert "mixes class names and numbers" in err or "changed from" in err or "cannot read" in err, err


def test_text_paths_follow_the_task(tmp_path, capsys):
    rows = texts(60)
    lists = write_jsonl(tmp_path / "lists.jsonl", [{"text": r["text"], "tags": [r["label"]]} for r in rows])
    err = error(capsys, tmp_path, "--dataset", str(lists), "--text-column", "text", "--label-column", "tags")
    assert "'tags' holds lists (several labels a row)" in err
    good = write_jsonl(tmp_path / "good.jsonl", rows)
    for task in ("regress", "multilabel"):
        err = error(
            capsys, tmp_path, "--dataset", str(good), "--text-column", "text", "--label-column", "label", "--task", task
        )
        assert f"--task {task} learns from tables of numbers" in err
    run = tmp_path / "run"
    anytrain.train(
        dataset=str(good), text_column="text", label_column="label", task="classify", epochs=1, output_dir=str(run)
    )
    assert "anytrain: task classify (--task classify)" in capsys.readouterr().out  # a task the user set is said so
    assert read_summary(run)["task_reason"] == "--task classify"


def test_files_that_are_not_utf8_are_one_line_naming_the_file_and_the_byte(tmp_path, capsys):
    ok = [json.dumps({"text": f"row {i}", "label": "ab"[i % 2]}) for i in range(30)]
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(("\n".join(ok[:4]) + "\n").encode() + '{"text": "café", "label": "a"}\n'.encode("latin-1"))
    err = error(capsys, tmp_path, "--dataset", str(path), "--text-column", "text", "--label-column", "label")
    assert f"{path} is not UTF-8 text: byte 0xe9 at line 5, column 14" in err, err
    csv = tmp_path / "latin1.csv"
    csv.write_bytes(
        "x,label\n".encode() + "".join(f"{i},{'ab'[i % 2]}\n" for i in range(30)).encode() + "é,a\n".encode("latin-1")
    )
    assert f"{csv} is not UTF-8 text: byte 0xe9 at line 32, column 1" in error(capsys, tmp_path, "--dataset", str(csv))
    txt = tmp_path / "book.txt"
    txt.write_bytes(("to be or not " * 50).encode() + b"\xff")
    assert f"{txt} is not UTF-8 text: byte 0xff" in error(capsys, tmp_path, "--dataset", str(txt))


# --------------------------------------------------------------------------- losses


MODELS = """
import torch
from torch import nn


class Vector(nn.Module):  # its own loss, per sample, and no labels= in its forward
    def __init__(self, shape):
        super().__init__()
        self.net = nn.Linear(shape.num_features, shape.num_classes)

    def forward(self, x):
        logits = self.net(x)
        return {"logits": logits, "loss": logits.square().mean(1)}


def vector(model, shape):
    return Vector(shape)


def constant(outputs, targets):
    return torch.tensor(1.0)  # depends on no weight


def explode(outputs, targets):
    return outputs.sum() * 0 + float("inf") if outputs.requires_grad and outputs.shape[0] > 2 else outputs.sum() * 0
"""


def test_losses_are_checked_before_the_first_step(tmp_path, capsys):
    module = tmp_path / "models.py"
    module.write_text(MODELS)
    err = error(capsys, tmp_path, "--model", f"{module}:vector")
    assert f"--model {module}:vector: the loss must be a scalar float tensor; got (2,)" in err
    err = error(capsys, tmp_path, "--loss", f"{module}:constant")
    assert "--loss: the loss does not require grad: it is not computed from the model's weights" in err
    out = tmp_path / "nan"
    with pytest.raises(SystemExit) as stop:
        anytrain.cli.main(
            ["--loss", f"{module}:explode", "--output-dir", str(out), "--no-progress", "--log-every-steps", "1"]
        )
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "No checkpoint was saved before it: start again with a lower --lr (and --overwrite)" in err, err


# --------------------------------------------------------------------------- transformers folders


@pytest.fixture(scope="module")
def hf_folders(tmp_path_factory):
    pytest.importorskip("transformers")
    from hfmodels import tiny_bert, tiny_gpt2

    root = tmp_path_factory.mktemp("hf27")
    return {
        "data": write_jsonl(root / "t.jsonl", texts(80)),
        "bert": tiny_bert(root / "bert"),
        "gpt2": tiny_gpt2(root / "gpt2"),
    }


def test_transformers_folders_that_do_not_fit_are_one_line(hf_folders, tmp_path, capsys):
    labelled = ["--dataset", str(hf_folders["data"]), "--text-column", "text", "--label-column", "label"]
    odd = shutil.copytree(hf_folders["bert"], tmp_path / "odd")
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))  # the weights say 128
    err = error(capsys, tmp_path, "--model", f"hf:{odd}", *labelled)
    assert "its weights do not fit its config (bert.encoder.layer." in err, err
    assert "only the task's head may be replaced" in err
    small = shutil.copytree(hf_folders["bert"], tmp_path / "small")
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 100}))
    err = error(capsys, tmp_path, "--model", f"hf:{small}", *labelled)
    assert "more than the 100 rows of the model's embeddings (vocab_size)" in err
    alien = shutil.copytree(hf_folders["bert"], tmp_path / "alien")
    (alien / "config.json").write_text(json.dumps({**config, "model_type": "bert-from-the-future"}))
    err = error(capsys, tmp_path, "--model", f"hf:{alien}", *labelled)
    assert "names model_type 'bert-from-the-future', which transformers" in err
    # the correct run then starts in the same folder: the refused ones left nothing behind
    run = tmp_path / "out"
    anytrain.train(
        model=f"hf:{hf_folders['bert']}",
        **dict(zip(["dataset", "text_column", "label_column"], labelled[1::2])),
        epochs=1,
        progress=False,
        output_dir=str(run),
    )
    shutil.rmtree(run / "hf")
    err = run_cli_error(capsys, ["predict", str(run), "--dataset", str(hf_folders["data"])])
    assert "holds no tokenizer: the run's save_pretrained folder is missing or damaged" in err


def test_max_length_left_at_its_default_fits_the_models_positions(hf_folders, tmp_path, capsys):
    run = tmp_path / "run"
    summary = anytrain.train(
        progress=False,
        model=f"hf:{hf_folders['gpt2']}",
        dataset=str(hf_folders["data"]),
        text_column="text",
        task="lm",
        epochs=1,
        output_dir=str(run),
    )
    out = capsys.readouterr().out
    assert "anytrain: --max-length 128: the positions of hf:" in out and "(the default 256 exceeds them)" in out
    assert summary["optimizer_steps"] > 0 and read_summary(run)["task"] == "lm"
    err = error(
        capsys,
        tmp_path,
        "--model",
        f"hf:{hf_folders['gpt2']}",
        "--dataset",
        str(hf_folders["data"]),
        "--text-column",
        "text",
        "--task",
        "lm",
        "--max-length",
        "512",
    )
    assert "--max-length 512 exceeds the 128 positions" in err  # given: refused, not changed
