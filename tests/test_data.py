"""Data: the bundled datasets (every name of the registry opens, an unknown one is refused), local files in every
supported format, synthetic data, splits, column options, fast batched loading, and a clear error for every kind of
bad data."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from anytrain.config import ConfigError, TrainConfig
from anytrain.data.bundled import BUNDLED, NAMES, SHAKESPEARE_PATH, listed
from anytrain.data.sources import DIGITS_PATH, bundled, is_text_dataset, read_dataset
from anytrain.data.splits import make_loader
from anytrain.tasks.settle import load


def load_data(cfg, given=None):
    """The data a run of this config trains on (its task settled first)."""
    return load(cfg, given)[2]


def test_bundled_digits_load_offline_with_a_seeded_split():
    data = load_data(TrainConfig())
    assert (data.num_features, data.num_classes) == (64, 10)
    assert (len(data.train), len(data.validation), len(data.test)) == (1259, 179, 359)
    assert data.train.inputs.dtype == torch.float32 and data.train.inputs.max() == 16
    assert (DIGITS_PATH.parent / "DIGITS_SOURCE.md").read_text().count("CC BY 4.0") >= 1
    again = load_data(TrainConfig())
    assert torch.equal(again.test.inputs, data.test.inputs)  # same seed, same split
    other = load_data(TrainConfig(seed=1))
    assert not torch.equal(other.test.targets, data.test.targets)


def _table(n=120, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return {"a": rng.normal(size=n).tolist(), "b": rng.normal(size=n).tolist(), "y": (np.arange(n) % classes).tolist()}


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json", "disk"])
def test_local_files_in_every_format(tmp_path, fmt):
    import datasets

    ds = datasets.Dataset.from_dict(_table())
    path = tmp_path / ("data" if fmt == "disk" else f"data.{fmt}")
    {"parquet": ds.to_parquet, "csv": ds.to_csv, "json": ds.to_json, "disk": ds.save_to_disk}[fmt](str(path))
    data = load_data(TrainConfig(dataset=str(path), label_column="y"))
    assert (data.num_features, data.num_classes) == (2, 3)
    assert len(data.train) + len(data.validation) + len(data.test) == 120


def test_named_splits_are_used_and_columns_chosen(tmp_path):
    import datasets

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(_table(100)),
            "validation": datasets.Dataset.from_dict(_table(30, seed=1)),
            "test": datasets.Dataset.from_dict(_table(20, seed=2)),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    data = load_data(TrainConfig(dataset=str(tmp_path / "dd"), label_column="y", input_columns=["b"]))
    assert (len(data.train), len(data.validation), len(data.test)) == (100, 30, 20)
    assert data.num_features == 1
    assert torch.allclose(data.test.inputs[:, 0], torch.tensor(_table(20, seed=2)["b"], dtype=torch.float32))


def test_string_labels_map_to_sorted_class_ids(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("x,kind\n" + "".join(f"{i},{'cat' if i % 2 else 'dog'}\n" for i in range(50)))
    data = load_data(TrainConfig(dataset=str(path), label_column="kind", val_fraction=0.2, test_fraction=0.2))
    assert data.num_classes == 2
    rows = torch.cat([data.train.inputs, data.validation.inputs, data.test.inputs])[:, 0]
    labels = torch.cat([data.train.targets, data.validation.targets, data.test.targets])
    assert torch.equal(labels, (rows.long() % 2 == 0).long())  # 'cat' = 0, 'dog' = 1
    assert data.class_names == ["cat", "dog"]  # saved with the weights, so a prediction can say the name
    _, task, data = load(TrainConfig(dataset=str(path), label_column="kind", val_fraction=0.2, test_fraction=0.2))
    assert task.weights_metadata()["class_names"] == ["cat", "dog"]


def test_synthetic_is_learnable_and_sized_by_options():
    data = load_data(
        TrainConfig(dataset="synthetic", synthetic_samples=1000, synthetic_features=12, synthetic_classes=4)
    )
    assert (data.num_features, data.num_classes) == (12, 4)
    assert len(data.train) + len(data.validation) + len(data.test) == 1000
    # nearest class mean on train already separates the classes well: there is signal to learn
    means = torch.stack([data.train.inputs[data.train.targets == c].mean(0) for c in range(4)])
    predicted = torch.cdist(data.test.inputs, means).argmin(1)
    assert (predicted == data.test.targets).float().mean() > 0.9


def test_loader_fetches_whole_batches_in_the_seeded_sampler_order():
    data = load_data(TrainConfig())
    loader = make_loader(data.train, TrainConfig(batch_size=100), shuffle=False)
    x, y = next(iter(loader))
    assert x.shape == (100, 64) and torch.equal(y, data.train.targets[:100])


def _error(**kwargs) -> str:
    with pytest.raises(ConfigError) as exc:
        load_data(TrainConfig(**kwargs))
    return str(exc.value)


def test_bad_data_gets_a_clear_message(tmp_path):
    assert "file not found" in _error(dataset=str(tmp_path / "nope.parquet"))
    (tmp_path / "empty.csv").write_text("")
    assert "empty.csv is empty" in _error(dataset=str(tmp_path / "empty.csv"))
    (tmp_path / "header.csv").write_text("x,label\n")
    assert "header.csv has no rows" in _error(dataset=str(tmp_path / "header.csv"))
    (tmp_path / "junk.parquet").write_bytes(b"not a parquet file at all")
    assert "cannot read" in _error(dataset=str(tmp_path / "junk.parquet"))
    (tmp_path / "data.txt").write_text("1,2\n")
    assert "unsupported file type" in _error(dataset=str(tmp_path / "data.txt"), task="classify")  # a .txt is text
    assert "column 'target' not in" in _error(label_column="target")
    assert "--input-columns: column 'pix' not in" in _error(input_columns=["pix"])
    assert "outside the 5 classes" in _error(num_classes=5)


def test_an_empty_split_is_named(tmp_path):
    folder = tmp_path / "splits"
    folder.mkdir()
    (folder / "train.csv").write_text("x,label\n" + "1,0\n2,1\n" * 20)
    (folder / "test.csv").write_text("x,label\n")
    err = _error(dataset=str(folder))
    assert "splits" in err and ("no rows" in err or "test split" in err and "is empty" in err)
    err = _error(dataset="synthetic", synthetic_samples=20, test_fraction=0.01)
    assert "has no test split" in err and "leaves it empty" in err


def test_nan_and_non_numeric_features_and_bad_labels(tmp_path):
    (tmp_path / "nan.csv").write_text("x,label\n1.0,0\nnan,1\n" + "2.0,1\n" * 20)
    assert "NaN or infinite" in _error(dataset=str(tmp_path / "nan.csv"))
    (tmp_path / "text.csv").write_text("x,label\n" + "abc,0\n" * 20 + "def,1\n" * 20)
    assert "is not numeric" in _error(dataset=str(tmp_path / "text.csv"))
    (tmp_path / "neg.csv").write_text("x,label\n" + "1,-1\n" * 10 + "2,1\n" * 20)
    assert "outside the" in _error(dataset=str(tmp_path / "neg.csv"))
    (tmp_path / "frac.json").write_text("\n".join(json.dumps({"x": i, "label": i / 3}) for i in range(30)))
    assert "integer class ids or strings" in _error(dataset=str(tmp_path / "frac.json"), task="classify")
    assert (
        load(TrainConfig(dataset=str(tmp_path / "frac.json")))[0].cfg.data.task == "regress"
    )  # --task auto: a quantity


def test_hub_name_goes_through_datasets_and_fails_clearly_offline():
    assert "loading it from the hub failed" in _error(dataset="someone/no-such-dataset")


@pytest.mark.parametrize("name", NAMES)
def test_every_bundled_name_opens_the_rows_it_says(name):
    data, said = read_dataset(name)
    rows = {split: len(part) for split, part in data.items()} if isinstance(data, dict) else {"train": len(data)}
    assert said.startswith(f"{name} (bundled") and said.endswith(")") and "{" not in said, said
    assert rows["train"] > 0 and bundled(name)[1] == said
    assert BUNDLED[name].text == (name == "shakespeare")  # the only plain text: --task auto models it (lm)


def test_the_bundled_shakespeare_is_the_whole_text_as_one_document():
    assert NAMES[:2] == ("digits", "shakespeare") and "shakespeare-speakers" in NAMES
    data, said = read_dataset("shakespeare")
    assert said == "shakespeare (bundled Tiny Shakespeare)" and list(data) == ["train"]
    assert data["train"]["text"] == [SHAKESPEARE_PATH.read_text(encoding="utf-8")]
    assert is_text_dataset("shakespeare", "") and not is_text_dataset("shakespeare-speakers", "")


def test_an_unknown_name_is_refused_in_one_line_listing_the_bundled_names():
    assert bundled("shakespear") is None  # not bundled: read as a path, then from the hub
    err = _error(dataset="shakespear")
    assert len(err.splitlines()) == 1 and "is not a bundled dataset (" in err and "the hub failed" in err, err
    assert f"({listed()})" in err and listed() == ", ".join(NAMES)


def test_help_lists_the_bundled_names():
    from anytrain.config.sections import DataConfig

    said = DataConfig.__dataclass_fields__["dataset"].metadata["help"]
    assert tuple(said.split("(", 1)[1].split(":", 1)[0].split(", ")) == NAMES  # --help's list is the registry's


def test_list_columns_become_rows_of_features_and_ragged_lists_are_refused(tmp_path):
    # an image-shaped column (a 3 x 2 nested list per row) beside a scalar one, with string labels
    rows = [
        {"image": [[i, i + 1], [i + 2, i + 3], [i + 4, i + 5]], "bias": -i, "label": "even" if i % 2 == 0 else "odd"}
        for i in range(40)
    ]
    (tmp_path / "images.json").write_text("\n".join(json.dumps(r) for r in rows))
    data = load_data(TrainConfig(dataset=str(tmp_path / "images.json")))
    assert data.num_features == 7 and data.num_classes == 2
    for x, y in zip(data.train.inputs.tolist(), data.train.targets.tolist()):
        i = int(x[0])  # row i: the image's values i..i+5 in row-major order, then the scalar column
        assert x == [i, i + 1, i + 2, i + 3, i + 4, i + 5, -i] and y == i % 2  # labels: "even" -> 0, "odd" -> 1
    rows[3]["image"] = [[1, 2], [3]]
    (tmp_path / "ragged.json").write_text("\n".join(json.dumps(r) for r in rows))
    assert "lists differ in length" in _error(dataset=str(tmp_path / "ragged.json"))


def _diabetes_like(path, rows=442, distinct=214, seed=0):
    """Shaped like scikit-learn's diabetes table: 10 float features and a float target holding
    integers, `distinct` different values between 25 and 346."""
    import datasets

    rng = np.random.default_rng(seed)
    values = np.concatenate([[25, 346], rng.choice(np.arange(26, 346), size=distinct - 2, replace=False)])
    target = np.concatenate([values, rng.choice(values, size=rows - distinct)]).astype(np.float64)
    rng.shuffle(target)
    table = {f"x{i}": rng.normal(size=rows).tolist() for i in range(10)}
    datasets.Dataset.from_dict({**table, "target": target.tolist()}).to_parquet(str(path))
    return path


def test_a_label_that_looks_like_a_quantity_gets_a_warning_naming_task_regress(tmp_path, capsys):
    from anytrain.cli import main

    path = _diabetes_like(tmp_path / "diabetes.parquet")
    for max_mb in (1024, 0):  # tensors in memory, and rows read per batch from Arrow
        data = load_data(TrainConfig(dataset=str(path), label_column="target", max_in_memory_mb=max_mb))
        distinct, rows = len(torch.unique(data.train.targets)), len(data.train)
        assert data.num_classes == 347 and rows == 442 - 44 - 88 and distinct > 0.1 * rows
        warning = (
            f"WARNING: --label-column 'target' looks like a quantity ({distinct} distinct values over {rows} rows): "
            "for regression use --task regress"
        )
        assert data.notes == [warning]
    args = f"--label-column target --epochs 1 --hidden-sizes 16 --no-progress --no-plot --dataset {path}".split()
    main([*args, "--output-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert out.splitlines().count(f"anytrain: {warning}") == 1, out
    # integer ids spread thin: 3 distinct values but 101 classes
    (tmp_path / "codes.csv").write_text("x,code\n" + "".join(f"{i},{(i % 3) * 50}\n" for i in range(300)))
    assert load_data(TrainConfig(dataset=str(tmp_path / "codes.csv"), label_column="code")).notes == [
        "WARNING: --label-column 'code' looks like a quantity (3 distinct values up to 100, so 101 classes): "
        "for regression use --task regress"
    ]


def test_class_labels_do_not_get_the_quantity_warning(tmp_path):
    assert load_data(TrainConfig()).notes == []  # digits: 10 classes over 1,259 rows
    path = _diabetes_like(tmp_path / "diabetes.parquet")
    assert load_data(TrainConfig(dataset=str(path), label_column="target", num_classes=400)).notes == []  # told
    many = tmp_path / "many.csv"  # 30 classes over 2,000 rows: below 10 % of the training rows
    many.write_text("x,label\n" + "".join(f"{i},{i % 30}\n" for i in range(2000)))
    assert load_data(TrainConfig(dataset=str(many))).notes == []
    named = tmp_path / "named.csv"  # string labels are names, whatever their number
    named.write_text("x,label\n" + "".join(f"{i},class{i % 100}\n" for i in range(300)))
    assert load_data(TrainConfig(dataset=str(named))).notes == []


@pytest.mark.parametrize("kind", ["table", "text"])
def test_a_run_opens_its_dataset_once(tmp_path, monkeypatch, kind):
    """--task auto looks at the training split (tasks/settle.py) and the task then loads it: one opening."""
    import datasets

    from anytrain.trainer import train

    opened = []
    real = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: opened.append(a) or real(*a, **k))
    path = tmp_path / f"{kind}.csv"
    if kind == "table":
        path.write_text("x,y,label\n" + "".join(f"{i},{i % 7},{i % 2}\n" for i in range(60)))
        options = {}
    else:
        path.write_text("text,label\n" + "".join(f"word{i} and more {'ab'[i % 2]},{'ab'[i % 2]}\n" for i in range(60)))
        options = {"text_column": "text", "label_column": "label"}
    summary = train(
        TrainConfig(dataset=str(path), epochs=1, progress=False, output_dir=str(tmp_path / "run"), **options)
    )
    assert summary["task"] == "classify" and len(opened) == 1, opened
