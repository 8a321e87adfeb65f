"""--final-weights: by default a run ends with the weights of its best validation (the lowest validation
loss): the test split is evaluated on them, model.safetensors holds them and summary.json and the last
line say which step; --final-weights last keeps the last step's. The copy survives a resume
(best_weights.safetensors in every checkpoint after it). On scikit-learn's diabetes table, a regression
with every option at its default reaches a cross-validated ridge regression's test R² (minus 0.03) on the
same split.

Data: the bundled digits, trained 8 epochs at lr 0.02 so that the validation loss is lowest before the
end (measured: step 240 of 320); the diabetes table (442 rows) from scikit-learn, written as a CSV."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from accelerate.state import AcceleratorState
from conftest import read_metrics
from safetensors.torch import load_file

from anytrain import TrainConfig, load_model
from anytrain.best import FILE
from anytrain.checkpoint import checkpoint_name, write_pointer
from anytrain.tasks.settle import load
from anytrain.trainer import train

OVERFIT = {"epochs": 8, "lr": 0.02, "hidden_sizes": [64], "progress": False, "plot": False}


def fresh_train(cfg: TrainConfig) -> dict:
    AcceleratorState._reset_state(True)
    try:
        return train(cfg)
    finally:
        AcceleratorState._reset_state(True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("final")
    best = fresh_train(TrainConfig(**OVERFIT, output_dir=str(root / "best")))
    last = fresh_train(TrainConfig(**OVERFIT, final_weights="last", output_dir=str(root / "last")))
    return root, best, last


def saved(path) -> dict:
    return load_file(str(path / "model.safetensors"))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def split_loss(run_dir) -> float:
    """The test split's mean cross-entropy, computed here from the saved model."""
    test = load(TrainConfig(**OVERFIT))[2].test
    model = load_model(run_dir).eval()
    with torch.no_grad():
        return F.cross_entropy(model(test.inputs), test.targets).item()


def test_the_run_ends_with_its_best_validations_weights_unless_told_last(runs):
    root, best, last = runs
    validations = [m for m in read_metrics(root / "best") if m["kind"] == "eval" and m["split"] == "validation"]
    lowest = min(validations, key=lambda m: m["loss"])
    assert lowest["step"] < best["optimizer_steps"] == 320  # the run overfits: the case this default is for
    assert (best["final_weights"], best["final_weights_step"]) == ("best", lowest["step"])
    assert best["val_loss"] == best["best_val_loss"] == lowest["loss"]  # the summary's val_* are those weights'
    checkpoints = root / "best" / "checkpoints"
    assert same(saved(root / "best"), saved(checkpoints / checkpoint_name(lowest["step"])))
    # the test metrics are those of the saved weights, computed here again
    assert best["test_loss"] == pytest.approx(split_loss(root / "best"), abs=1e-5)
    # the same training (the last step's weights agree), ended with the last step's weights
    assert best["last_weights_sha256"] == last["last_weights_sha256"] == last["weights_sha256_per_rank"][0]
    assert (last["final_weights"], last["final_weights_step"]) == ("last", 320)
    assert same(saved(root / "last"), saved(root / "last" / "checkpoints" / checkpoint_name(320)))
    assert last["test_loss"] == pytest.approx(split_loss(root / "last"), abs=1e-5)
    assert best["weights_sha256_per_rank"][0] != last["weights_sha256_per_rank"][0]
    assert best["test_loss"] != last["test_loss"]  # measured 0.0842 and 0.0819: on this split, no better
    # checkpoints after the best step hold its weights; the best step's own checkpoint is them
    assert not (checkpoints / checkpoint_name(lowest["step"]) / FILE).exists()
    later = load_file(str(checkpoints / checkpoint_name(320) / FILE))
    assert (
        all(torch.equal(later[k], saved(root / "best")[k]) for k in later)
        and later.keys() == saved(root / "best").keys()
    )


@pytest.mark.parametrize("cut", [240, 280])
def test_a_run_resumed_after_its_best_validation_ends_with_the_same_weights(runs, tmp_path, capsys, cut):
    """Resumed from the best step's checkpoint (the copy is its weights) or a later one (the copy is in it)."""
    root, best, _ = runs
    assert best["final_weights_step"] == 240
    shutil.copytree(root / "best", tmp_path / "run")
    for step in range(cut + 40, 321, 40):
        shutil.rmtree(tmp_path / "run" / "checkpoints" / checkpoint_name(step))
    for name in ("model.safetensors", "summary.json"):
        (tmp_path / "run" / name).unlink()
    write_pointer(tmp_path / "run", "latest", tmp_path / "run" / "checkpoints" / checkpoint_name(cut))
    resumed = fresh_train(TrainConfig(**OVERFIT, output_dir=str(tmp_path / "run"), resume="latest"))
    assert resumed["resumed_from"].endswith(checkpoint_name(cut))
    assert (resumed["final_weights_step"], resumed["last_weights_sha256"]) == (240, best["last_weights_sha256"])
    assert same(saved(tmp_path / "run"), saved(root / "best"))
    assert resumed["test_loss"] == best["test_loss"]
    assert (
        "(the best validation's weights, step 240 of 320; --final-weights last for the last)" in capsys.readouterr().out
    )


def test_validations_between_epoch_ends_count_and_their_weights_are_kept_without_a_checkpoint(tmp_path):
    """--eval-every-steps 10: the lowest of 32 validations wins, also between checkpoints (every 40 steps;
    measured: step 180)."""
    summary = fresh_train(TrainConfig(**OVERFIT, eval_every_steps=10, output_dir=str(tmp_path / "r")))
    validations = [m for m in read_metrics(tmp_path / "r") if m["kind"] == "eval" and m["split"] == "validation"]
    assert len(validations) == 32
    lowest = min(validations, key=lambda m: m["loss"])
    print(f"lowest validation loss at step {lowest['step']}")
    assert (summary["final_weights"], summary["final_weights_step"]) == ("best", lowest["step"])
    assert summary["val_loss"] == lowest["loss"] and summary["final_weights_step"] < 320
    assert summary["test_loss"] == pytest.approx(split_loss(tmp_path / "r"), abs=1e-5)


@pytest.fixture(scope="module")
def diabetes(tmp_path_factory):
    datasets = pytest.importorskip("sklearn.datasets")
    path = tmp_path_factory.mktemp("diabetes") / "diabetes.csv"
    datasets.load_diabetes(as_frame=True).frame.to_csv(path, index=False)  # ten features and 'target'
    return path


def test_a_default_regression_on_the_diabetes_table_reaches_a_ridge_regression(diabetes, tmp_path, capsys):
    from sklearn.linear_model import RidgeCV
    from sklearn.metrics import r2_score

    flags = {"dataset": str(diabetes), "task": "regress", "progress": False, "plot": False}
    summary = fresh_train(TrainConfig(**flags, output_dir=str(tmp_path / "run")))
    assert "--label-column target: the table has no 'label' column" in capsys.readouterr().out
    data = load(TrainConfig(**flags).replace(label_column="target"))[2]  # the run's own split
    ridge = RidgeCV(alphas=torch.logspace(-3, 3, 25).tolist()).fit(data.train.inputs, data.train.targets)
    baseline = r2_score(data.test.targets, ridge.predict(data.test.inputs))
    print(f"diabetes test R²: anytrain {summary['test_r2']:.4f} ({summary['final_weights']}), ridge {baseline:.4f}")
    assert summary["final_weights"] == "best" and summary["final_weights_step"] < summary["optimizer_steps"]
    assert summary["test_r2"] >= baseline - 0.03  # measured 0.4076 and 0.4166 (the last step's weights: 0.2984)
