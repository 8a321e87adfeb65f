"""`anytrain predict`: a trained classifier on new rows, with class names, and one-line errors."""

from __future__ import annotations

import json

import pytest

from anytrain import TrainConfig
from anytrain.cli import main
from anytrain.data.sources import DIGITS_PATH
from anytrain.trainer import train


def rows(n: int, offset: int = 0) -> str:
    # "big" when x + y > 50: learnable by a small MLP; z is noise
    return "".join(
        f"{x},{y},{(x * 7) % 5},{'big' if x + y > 50 else 'small'}\n"
        for x, y in ((i % 50 + offset, (i * 3) % 50) for i in range(n))
    )


@pytest.fixture(scope="module")
def named_run(tmp_path_factory):
    from accelerate.state import AcceleratorState

    folder = tmp_path_factory.mktemp("predict")
    (folder / "train.csv").write_text("x,y,z,size\n" + rows(600))
    AcceleratorState._reset_state(True)
    summary = train(
        TrainConfig(
            dataset=str(folder / "train.csv"),
            label_column="size",
            epochs=25,
            hidden_sizes=[32],
            dropout=0.0,
            progress=False,
            output_dir=str(folder / "run"),
        )
    )
    AcceleratorState._reset_state(True)
    return folder, summary


def test_predictions_name_the_class_and_match_the_labels(named_run, capsys):
    folder, summary = named_run
    assert summary["test_accuracy"] > 0.9
    (folder / "new.csv").write_text(
        "z,y,x,size\n" + "".join(",".join(r.split(",")[i] for i in (2, 1, 0, 3)) for r in rows(200, 1).splitlines(True))
    )
    main(
        ["predict", str(folder / "run"), "--dataset", str(folder / "new.csv"), "--output", str(folder / "preds.jsonl")]
    )
    preds = [json.loads(line) for line in (folder / "preds.jsonl").read_text().splitlines()]
    assert len(preds) == 200 and [p["row"] for p in preds] == list(range(200))
    assert {p["class_name"] for p in preds} <= {"big", "small"} and all(0.5 <= p["probability"] <= 1 for p in preds)
    assert all(p["class_name"] == ["big", "small"][p["class_id"]] for p in preds)  # string labels map to sorted ids
    accuracy = sum(p["class_name"] == p["label"] for p in preds) / len(preds)
    assert accuracy > 0.85, accuracy  # columns found by name, not position
    assert "200 predictions written to" in capsys.readouterr().err


def test_the_metadata_is_strings_on_disk_and_python_values_in_memory(named_run):
    from safetensors import safe_open

    from anytrain.reload import read_weights_metadata
    from anytrain.shape import DataShape

    folder, _ = named_run
    with safe_open(str(folder / "run" / "model.safetensors"), framework="pt") as f:
        raw = f.metadata()
    meta = read_weights_metadata(folder / "run")[2]
    # on disk: the strings runs have always written (JSON text, numbers as text)
    assert raw["input_columns"] == '["x", "y", "z"]' and raw["class_names"] == '["big", "small"]'
    assert (
        raw["num_features"] == "3" and raw["num_classes"] == "2" and raw["data_shape"] == meta["data_shape"].to_json()
    )
    assert all(isinstance(v, str) for v in raw.values())
    # in memory: Python values, decoded once by read_weights_metadata
    assert meta["input_columns"] == ["x", "y", "z"] and meta["class_names"] == ["big", "small"]
    assert meta["num_features"] == 3 and meta["num_classes"] == 2 and isinstance(meta["data_shape"], DataShape)
    assert meta["anytrain_config"]["data"]["label_column"] == "size"  # the config's sections


def test_saved_metadata_reads_back_as_values_and_writes_back_unchanged():
    """What runs saved before the metadata was typed hold reads into Python values, and writing those
    values gives the very same strings: the format on disk did not change."""
    from anytrain.data.splits import TargetStats
    from anytrain.shape import DataShape
    from anytrain.weights_meta import decode, encode

    raw = {
        "anytrain_config": json.dumps({"epochs": 3, "hidden_sizes": [32]}),
        "data_shape": DataShape("tabular", num_classes=2, num_features=3).to_json(),
        "num_classes": "2",
        "num_features": "3",
        "class_names": json.dumps(["big", "small"]),
        "input_columns": json.dumps(["x", "y", "z"]),
        "targets": TargetStats([1.5], [0.25], ["price"]).to_json(),
        "threshold": str(0.4),
        "beta": str(0.1),
        "max_length": str(128),
        "stop_ids": str([0, 7]),  # grpo wrote str(list)
        "vocab": json.dumps({"kind": "char", "chars": "ab\n"}),
        "image_look": json.dumps({"mode": "L", "size": 16, "mean": [0.5], "std": [0.25]}),
        "lora": json.dumps({"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "targets": "all-linear"}),
        "hf_config": '{\n  "model_type": "gpt2"\n}\n',  # transformers' own JSON, kept as text
        "chat_template": "yes",
        "dpo_loss": "sigmoid",
        "task_module": "classify",
    }
    meta = decode(raw)
    assert encode(meta) == raw
    assert meta["num_features"] == 3 and meta["threshold"] == 0.4 and meta["stop_ids"] == [0, 7]
    assert isinstance(meta["data_shape"], DataShape) and meta["targets"].names == ["price"]
    assert meta["vocab"]["chars"] == "ab\n" and meta["hf_config"] == raw["hf_config"]


def test_predicting_the_bundled_digits_with_a_digits_run(tmp_path, capsys):
    train(TrainConfig(epochs=10, hidden_sizes=[64], progress=False, output_dir=str(tmp_path / "run")))
    capsys.readouterr()
    main(["predict", str(tmp_path / "run"), "--dataset", str(DIGITS_PATH)])
    preds = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(preds) == 1797 and preds[0]["class_name"] is None  # integer labels carry no names
    assert sum(p["class_id"] == p["label"] for p in preds) / 1797 > 0.9


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda folder: (folder / "bad.csv").write_text("x,w\n1,2\n"), "lacks the run's input columns y, z"),
        (
            lambda folder: (folder / "bad.csv").write_text("x,y,z\n1,2,three\n"),
            "are not numeric like the training data's",
        ),
    ],
)
def test_rows_that_do_not_match_the_run_are_one_line_and_exit_2(named_run, capsys, make, expected):
    folder, _ = named_run
    make(folder)
    with pytest.raises(SystemExit) as exc:
        main(["predict", str(folder / "run"), "--dataset", str(folder / "bad.csv")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and expected in err, err


def test_a_language_model_run_points_to_sample(tmp_path, capsys):
    train(
        TrainConfig(
            dataset="shakespeare",
            n_layer=1,
            n_head=2,
            n_embd=16,
            block_size=16,
            batch_size=8,
            max_steps=3,
            eval_windows=5,
            progress=False,
            output_dir=str(tmp_path / "lm"),
        )
    )
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["predict", str(tmp_path / "lm"), "--dataset", str(tmp_path / "not_there.csv")])
    err = capsys.readouterr().err  # refused from the task's declaration, before the file is looked for
    assert exc.value.code == 2 and err.strip() == (
        "anytrain predict: error: run_dir: --task lm has no predictions for rows; use `anytrain sample RUN`"
    )


def test_the_help_names_every_task_that_predicts():
    """predict's description names the tasks whose classes offer predict, every one and none else."""
    import re

    from anytrain.predict import PREDICTING
    from anytrain.tasks import REGISTRY, task_class
    from anytrain.tasks.contract import offered

    classes = [task_class(key) for key in REGISTRY]
    offering = {cls.name for cls in classes if offered(cls, "predict")}
    said = set(re.findall(r"[a-z0-9]+", PREDICTING)) & {cls.name for cls in classes}
    assert said == offering, (said, offering)
