"""--final-weights: by default a run ends with the weights of its best validation by the task's headline
metric (--best-metric auto: accuracy for a classifier, R² for a regression, ...): the test split is
evaluated on them, model.safetensors holds them and summary.json and the last line say which step and
metric; --best-metric loss picks the lowest validation loss instead; --final-weights last keeps the last
step's. Early stopping watches the same metric. The copy survives a resume (best_weights.safetensors in
every checkpoint after it). On scikit-learn's diabetes table, a regression with every option at its
default reaches a cross-validated ridge regression's test R² (minus 0.03) on the same split.

Data: the bundled digits, trained 8 epochs at lr 0.02 so that the best validation comes before the end,
and the validation loss and accuracy disagree on which (measured: accuracy at step 200, loss at step 240,
of 320); the diabetes table (442 rows) from scikit-learn, written as a CSV."""

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


def validations(run_dir) -> list[dict]:
    return [m for m in read_metrics(run_dir) if m["kind"] == "eval" and m["split"] == "validation"]


def first_best(run_dir, metric: str, higher: bool) -> dict:
    """The validation with the best value of `metric`, of those alike in it the one with the lowest loss."""
    found = validations(run_dir)
    best = (max if higher else min)(m[metric] for m in found)
    return min((m for m in found if m[metric] == best), key=lambda m: m["loss"])


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


def test_the_run_ends_with_its_best_validations_weights_unless_told_last(runs, capsys):
    root, best, last = runs
    highest = first_best(root / "best", "accuracy", higher=True)
    assert highest["step"] < best["optimizer_steps"] == 320  # the run overfits: the case this default is for
    assert (best["final_weights"], best["final_weights_step"], best["best_metric"]) == (
        "best",
        highest["step"],
        "accuracy",
    )
    assert best["val_accuracy"] == best["best_val_accuracy"] == highest["accuracy"]  # val_* are those weights'
    assert best["val_loss"] == highest["loss"]
    checkpoints = root / "best" / "checkpoints"
    assert same(saved(root / "best"), saved(checkpoints / checkpoint_name(highest["step"])))
    assert (checkpoints / "best").read_text().strip() == checkpoint_name(highest["step"])
    # the test metrics are those of the saved weights, computed here again
    assert best["test_loss"] == pytest.approx(split_loss(root / "best"), abs=1e-5)
    # the same training (the last step's weights agree), ended with the last step's weights
    assert best["last_weights_sha256"] == last["last_weights_sha256"] == last["weights_sha256_per_rank"][0]
    assert (last["final_weights"], last["final_weights_step"]) == ("last", 320)
    assert same(saved(root / "last"), saved(root / "last" / "checkpoints" / checkpoint_name(320)))
    assert last["test_loss"] == pytest.approx(split_loss(root / "last"), abs=1e-5)
    assert best["weights_sha256_per_rank"][0] != last["weights_sha256_per_rank"][0]
    assert best["test_loss"] != last["test_loss"]
    # checkpoints after the best step hold its weights; the best step's own checkpoint is them
    assert not (checkpoints / checkpoint_name(highest["step"]) / FILE).exists()
    later = load_file(str(checkpoints / checkpoint_name(320) / FILE))
    assert (
        all(torch.equal(later[k], saved(root / "best")[k]) for k in later)
        and later.keys() == saved(root / "best").keys()
    )


def test_the_best_metric_loss_keeps_the_lowest_loss_where_accuracy_disagrees(runs, tmp_path, capsys):
    root, best, _ = runs
    by_loss = fresh_train(TrainConfig(**OVERFIT, best_metric="loss", output_dir=str(tmp_path / "loss")))
    out = capsys.readouterr().out
    assert "the best weights and early stopping follow the validation loss (lower is better) (--best-metric)" in out
    lowest = first_best(tmp_path / "loss", "loss", higher=False)
    assert (by_loss["final_weights_step"], by_loss["best_metric"], by_loss["best_val_loss"]) == (
        lowest["step"],
        "loss",
        lowest["loss"],
    )
    # the same training; loss and accuracy disagree on the best validation (measured: steps 240 and 200)
    assert by_loss["last_weights_sha256"] == best["last_weights_sha256"]
    assert lowest["step"] != best["final_weights_step"]
    assert by_loss["val_accuracy"] < best["val_accuracy"] and by_loss["val_loss"] < best["val_loss"]


def test_early_stopping_watches_the_best_metric(tmp_path):
    """Patience 2: validation accuracy peaks at step 200 and does not improve at 240 and 280, so the run stops
    there (at step 160 it equals step 80's at a lower loss: that counts); the validation loss, lowest at step
    240, lets the run go on to the end."""
    summary = fresh_train(TrainConfig(**OVERFIT, early_stopping_patience=2, output_dir=str(tmp_path / "stop")))
    assert (summary["stopped_early_at_epoch"], summary["optimizer_steps"], summary["final_weights_step"]) == (
        6,
        280,
        200,
    )
    by_loss = fresh_train(
        TrainConfig(**OVERFIT, early_stopping_patience=2, best_metric="loss", output_dir=str(tmp_path / "loss"))
    )
    assert (by_loss["optimizer_steps"], by_loss["final_weights_step"]) == (320, 240)


def test_a_best_metric_the_task_does_not_log_is_one_line(capsys, tmp_path):
    from conftest import run_cli_error

    err = run_cli_error(capsys, ["--best-metric", "f1", "--output-dir", str(tmp_path / "run")])
    assert "--best-metric: --task classify logs loss, accuracy on validation, not 'f1'" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("cut", [200, 280])
def test_a_run_resumed_after_its_best_validation_ends_with_the_same_weights(runs, tmp_path, capsys, cut):
    """Resumed from the best step's checkpoint (the copy is its weights) or a later one (the copy is in it)."""
    root, best, _ = runs
    assert best["final_weights_step"] == 200
    shutil.copytree(root / "best", tmp_path / "run")
    for step in range(cut + 40, 321, 40):  # the checkpoints after the cut (the newest two and the best are kept)
        shutil.rmtree(tmp_path / "run" / "checkpoints" / checkpoint_name(step), ignore_errors=True)
    for name in ("model.safetensors", "summary.json"):
        (tmp_path / "run" / name).unlink()
    write_pointer(tmp_path / "run", "latest", tmp_path / "run" / "checkpoints" / checkpoint_name(cut))
    resumed = fresh_train(TrainConfig(**OVERFIT, output_dir=str(tmp_path / "run"), resume="latest"))
    assert resumed["resumed_from"].endswith(checkpoint_name(cut))
    assert (resumed["final_weights_step"], resumed["last_weights_sha256"]) == (200, best["last_weights_sha256"])
    assert same(saved(tmp_path / "run"), saved(root / "best"))
    assert resumed["test_loss"] == best["test_loss"] and resumed["best_val_accuracy"] == best["best_val_accuracy"]
    out = capsys.readouterr().out
    assert "(the weights of the best validation accuracy, step 200 of 320; --final-weights last for the last)" in out


def test_validations_between_epoch_ends_count_and_their_weights_are_kept_without_a_checkpoint(tmp_path):
    """--eval-every-steps 10: the best of 32 validations wins, also between checkpoints (every 40 steps)."""
    summary = fresh_train(TrainConfig(**OVERFIT, eval_every_steps=10, output_dir=str(tmp_path / "r")))
    assert len(validations(tmp_path / "r")) == 32
    highest = first_best(tmp_path / "r", "accuracy", higher=True)
    print(f"highest validation accuracy first at step {highest['step']}")
    assert (summary["final_weights"], summary["final_weights_step"]) == ("best", highest["step"])
    assert summary["val_accuracy"] == highest["accuracy"] and summary["final_weights_step"] < 320
    assert summary["final_weights_step"] % 40  # between checkpoints
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
