"""Tables bigger than --max-in-memory-mb stay in memory-mapped Arrow and are read per batch: the
same training as the in-memory tensors (up to the float64-vs-float32 statistics), the same checks."""

from __future__ import annotations

import pytest
import torch
from conftest import max_abs_diff

import anytrain
from anytrain.cli import main
from anytrain.config import TrainConfig
from anytrain.tasks.settle import load

FAST = {"epochs": 3, "hidden_sizes": [64], "progress": False}


def load_data(cfg, given=None):
    """The data a run of this config trains on (its task settled first)."""
    return load(cfg, given)[2]


def test_arrow_rows_train_like_in_memory_tensors(tmp_path, one_thread):
    memory = anytrain.train(FAST, output_dir=str(tmp_path / "memory"))
    arrow = anytrain.train(FAST, max_in_memory_mb=0, output_dir=str(tmp_path / "arrow"))
    assert memory["data_path"] == "in-memory tensors" and arrow["data_path"] == "arrow (memory-mapped), read per batch"
    assert memory["num_workers"] == arrow["num_workers"] == 0  # --num-workers auto: tables load in the training process
    a, b = anytrain.load_model(tmp_path / "memory").state_dict(), anytrain.load_model(tmp_path / "arrow").state_dict()
    assert torch.allclose(a["0.mean"], b["0.mean"], atol=1e-5) and torch.allclose(a["0.std"], b["0.std"], rtol=1e-5)
    assert max_abs_diff(a, b) < 1e-3  # the same batches; only the statistics differ in the last bits (measured 2e-5)
    assert abs(memory["test_accuracy"] - arrow["test_accuracy"]) <= 2 / 359


def test_the_same_rows_come_back_per_batch():
    memory = load_data(TrainConfig())
    arrow = load_data(TrainConfig(max_in_memory_mb=0))
    indices = [5, 0, 17, 3]
    x, y = arrow.train.__getitems__(indices)
    assert torch.equal(x, memory.train.inputs[indices]) and torch.equal(y, memory.train.targets[indices])
    assert len(arrow.test) == len(memory.test) and torch.equal(arrow.test.targets, memory.test.targets)


def test_non_finite_values_are_found_in_the_chunked_pass(tmp_path, capsys):
    import datasets

    rows = {"x": [[0.0, 1.0]] * 50 + [[float("nan"), 0.0]] + [[1.0, 0.0]] * 49, "label": [0, 1] * 50}
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "nan.parquet"))
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "--dataset",
                str(tmp_path / "nan.parquet"),
                "--max-in-memory-mb",
                "0",
                "--no-progress",
                "--output-dir",
                str(tmp_path / "run"),
            ]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("train.py: error: --dataset:")
        and "has NaN or infinite values" in err
        and len(err.splitlines()) == 1
    )
