"""Any task through the same loop: regression, multi-label, models that return their own loss, and a
loss of your own. Small generated tables; in-process runs, one launch module-scoped for the scenarios."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import read_metrics

import anytrain
from anytrain.cli import main
from anytrain.config import ConfigError
from anytrain.predict import predict
from anytrain.reload import read_weights_metadata
from anytrain.tasks.settle import load

FAST = {"epochs": 12, "progress": False, "hidden_sizes": [32], "dropout": 0.0, "lr": 3e-3, "log_every_steps": 5}
PRICE = np.array([3.0, -2.0, 0.5, 1.5])


def load_data(cfg, given=None):
    """The data a run of this config trains on (its task settled first)."""
    return load(cfg, given)[2]


def house_prices(path, rows: int = 800, seed: int = 0, targets: int = 1):
    """Features x (rows, 4); price = 100 + 20 * (x . PRICE) + noise: float targets that are not integers."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    columns = {f"x{i}": x[:, i] for i in range(4)}
    columns["price"] = 100 + 20 * (x @ PRICE) + rng.normal(scale=2.0, size=rows)
    if targets > 1:
        columns["rent"] = 5 - 0.5 * (x @ PRICE[::-1]) + rng.normal(scale=0.1, size=rows)
    pq.write_table(pa.table(columns), path)
    return path


def tags(path, rows: int = 900, seed: int = 0):
    """A label column of lists of names: 'big' when x0 > 0, 'odd' when x1 > 0.3, 'red' when x2 + x3 > 0."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    labels = [
        [name for name, on in (("big", a > 0), ("odd", b > 0.3), ("red", c + d > 0)) if on] for a, b, c, d in x.tolist()
    ]
    pq.write_table(pa.table({**{f"x{i}": x[:, i] for i in range(4)}, "label": labels}), path)
    return path


def cli_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# --------------------------------------------------------------------------- regression


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    from accelerate.state import AcceleratorState

    root = tmp_path_factory.mktemp("regress")
    AcceleratorState._reset_state(True)
    summary = anytrain.train(
        FAST, dataset=str(house_prices(root / "houses.parquet")), label_column="price", output_dir=str(root / "run")
    )
    AcceleratorState._reset_state(True)
    return root, summary


def test_a_float_label_is_regression_reaching_the_noise_floor(regression, capsys):
    root, summary = regression
    assert summary["task"] == "regress" and "not all integers" in summary["task_reason"]
    # price has std ~ 20 * |PRICE| = 77 and noise 2: R² of the true function is 0.9993
    assert summary["test_r2"] > 0.98 and summary["test_rmse"] < 10 and summary["test_mae"] < 8
    assert summary["test_rmse"] >= summary["test_mae"] > 0
    evals = [m for m in read_metrics(root / "run") if m["kind"] == "eval"]
    assert {"loss", "rmse", "mae", "r2"} <= set(evals[0]) and evals[0]["rmse"] > evals[-1]["rmse"]


def test_metrics_are_in_original_units_and_predict_prints_values(regression):
    """The run's test RMSE and R² equal those recomputed from `anytrain predict` on the same rows."""
    root, summary = regression
    from anytrain.config import TrainConfig

    data = load_data(TrainConfig(dataset=str(root / "houses.parquet"), label_column="price"))
    stats = data.target_stats  # the training split's, saved with the weights
    truth = data.test.targets * torch.tensor(stats.std) + torch.tensor(stats.mean)  # back to dollars
    table = {f"x{i}": data.test.inputs[:, i].numpy() for i in range(4)}
    pq.write_table(pa.table({**table, "price": truth[:, 0].numpy()}), root / "test.parquet")
    rows = predict(str(root / "run"), str(root / "test.parquet"))
    predicted = torch.tensor([row["price"] for row in rows])
    assert [row["label"] for row in rows] == pytest.approx(truth[:, 0].tolist(), rel=1e-6)
    errors = predicted - truth[:, 0]
    assert math.sqrt(errors.square().mean().item()) == pytest.approx(summary["test_rmse"], rel=1e-4)
    r2 = 1 - errors.square().sum() / (truth[:, 0] - truth[:, 0].mean()).square().sum()
    assert r2.item() == pytest.approx(summary["test_r2"], rel=1e-4)
    stats = read_weights_metadata(root / "run")[2]["targets"]  # a TargetStats (weights_meta.decode)
    assert stats.names == ["price"] and stats.std[0] == pytest.approx(truth[:, 0].std().item(), rel=0.1)


def test_several_target_columns_and_the_huber_loss(tmp_path):
    path = house_prices(tmp_path / "two.parquet", targets=2)
    summary = anytrain.train(
        FAST, dataset=str(path), label_column="price,rent", loss="huber", output_dir=str(tmp_path / "run")
    )
    assert summary["task"] == "regress" and summary["num_classes"] == 2  # two outputs
    assert summary["test_r2"] > 0.95  # the mean over both targets
    rows = predict(str(tmp_path / "run"), str(path))
    assert set(rows[0]) >= {"row", "price", "rent", "label_price", "label_rent"}


@pytest.mark.parametrize(
    "table, argv, expected",
    [
        ({"x": [1.0, 2.0] * 20, "label": ["a", "b"] * 20}, ["--task", "regress"], "holds text (or lists), not numbers"),
        (
            {"x": [1.0, 2.0] * 20, "label": [0.5, float("nan")] * 20},
            ["--task", "regress"],
            "has NaN or infinite targets",
        ),
        (
            {"train": {"x": [1.0] * 40, "label": [["a"], ["b"]] * 20}, "test": {"x": [1.0], "label": [["a", "zz"]]}},
            ["--task", "multilabel"],
            "the test split of",
        ),
        ({"x": [1.0, 2.0] * 20, "label": [0, 1] * 20}, ["--loss", "huber"], "--loss huber is a loss of --task regress"),
        (
            {"x": [1.0, 2.0] * 20, "label": [0.5, 1.5] * 20},
            ["--task", "regress", "--loss", "l1"],
            "--loss: unknown loss 'l1' (choose auto, mse, huber, or your own as module:fn)",
        ),
    ],
)
def test_bad_targets_are_one_line_and_write_nothing(capsys, tmp_path, table, argv, expected):
    if "train" in table:  # a folder with its own splits
        (tmp_path / "bad").mkdir()
        for split, rows in table.items():
            pq.write_table(pa.table(rows), tmp_path / "bad" / f"{split}.parquet")
    else:
        pq.write_table(pa.table(table), tmp_path / "bad.parquet")
    dataset = str(tmp_path / ("bad" if "train" in table else "bad.parquet"))
    err = cli_error(capsys, ["--dataset", dataset, *argv, "--output-dir", str(tmp_path / "run")])
    assert expected in err and ("'zz'" in err if "train" in table else True)
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- multi-label


def test_multilabel_learns_tags_and_predicts_the_labels_above_the_threshold(tmp_path, capsys):
    path = tags(tmp_path / "tags.parquet")
    summary = anytrain.train(FAST, dataset=str(path), threshold=0.4, output_dir=str(tmp_path / "run"))
    assert summary["task"] == "multilabel" and summary["task_reason"] == "auto: the label column holds lists"
    assert summary["num_classes"] == 3 and summary["test_micro_f1"] > 0.9 and summary["test_macro_f1"] > 0.85
    assert 0.7 < summary["test_exact_match"] <= 1
    rows = predict(str(tmp_path / "run"), str(path))
    assert all(set(r["labels"]) <= {"big", "odd", "red"} and all(p > 0.4 for p in r["probabilities"]) for r in rows)
    agree = sum(sorted(r["labels"]) == sorted(r["label"]) for r in rows) / len(rows)
    assert agree > 0.7
    assert read_weights_metadata(tmp_path / "run")[2]["threshold"] == 0.4


# --------------------------------------------------------------------------- the model's own loss, your own loss


class OwnLoss(torch.nn.Module):
    """nanoGPT's and transformers' convention: given the targets, it returns its loss beside its logits."""

    def __init__(self, shape, logits: bool = True):
        super().__init__()
        self.linear, self.logits = torch.nn.Linear(shape.num_features, shape.num_classes), logits

    def forward(self, x, labels=None):
        logits = self.linear((x - 8) / 8)
        out = {"logits": logits} if self.logits else {}
        if labels is not None:
            out["loss"] = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)
        return out


@pytest.mark.parametrize("logits", [True, False])
def test_a_model_that_returns_its_own_loss_trains_on_it(tmp_path, logits):
    summary = anytrain.train(
        FAST, epochs=4, lr=0.05, model=lambda model, shape: OwnLoss(shape, logits), output_dir=str(tmp_path / "run")
    )
    train_losses = [m["loss"] for m in read_metrics(tmp_path / "run") if m["kind"] == "train"]
    assert train_losses[0] > 1.5 > train_losses[-1] > 0.3  # label smoothing keeps the model's own loss above ~0.5
    if logits:
        assert summary["test_accuracy"] > 0.9  # metrics from its logits
    else:
        assert "test_accuracy" not in summary and summary["test_loss"] < 1.2  # only its loss to report
        assert summary["best_metric"] == "loss"  # accuracy, classify's headline metric, cannot be scored


class Hidden(torch.nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.linear = torch.nn.Linear(shape.num_features, 8)

    def forward(self, x):
        return {"hidden": self.linear(x)}


def test_a_model_output_without_logits_or_loss_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="the model's output has neither logits nor a loss"):
        anytrain.train(FAST, model=lambda model, shape: Hidden(shape), output_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # nothing written, not even the folder


LOSSES = """import torch
def mae(outputs, targets):
    return (outputs - targets).abs().mean()
def per_sample(outputs, targets):
    return (outputs - targets).abs()
"""


def test_your_own_loss_from_a_file_and_from_python(tmp_path, regression, capsys):
    root, mse_run = regression
    (tmp_path / "losses.py").write_text(LOSSES)
    data = str(root / "houses.parquet")
    summary = anytrain.train(
        FAST,
        dataset=data,
        label_column="price",
        loss=f"{tmp_path / 'losses.py'}:mae",
        output_dir=str(tmp_path / "file"),
    )
    assert summary["test_r2"] > 0.98  # trained on the mean absolute error of standardised targets
    first = [m["loss"] for m in read_metrics(tmp_path / "file") if m["kind"] == "train"][0]
    assert first < [m["loss"] for m in read_metrics(root / "run") if m["kind"] == "train"][0]  # |e| < e² early on
    python = anytrain.train(
        FAST,
        dataset=data,
        label_column="price",
        loss_fn=lambda o, t: (o - t).abs().mean(),
        output_dir=str(tmp_path / "python"),
    )
    assert python["test_mae"] == pytest.approx(summary["test_mae"], rel=1e-6)  # the same loss, the same run
    err = cli_error(
        capsys,
        [
            "--dataset",
            data,
            "--label-column",
            "price",
            "--loss",
            f"{tmp_path / 'losses.py'}:per_sample",
            "--output-dir",
            str(tmp_path / "bad"),
        ],
    )
    assert "--loss: the loss must be a scalar float tensor; got (2, 1)" in err
    err = cli_error(capsys, ["--dataset", data, "--loss", "no_such_module:fn", "--output-dir", str(tmp_path / "bad")])
    assert err.startswith("train.py: error: --loss no_such_module:fn: cannot import no_such_module")


# --------------------------------------------------------------------------- every scenario holds for regression

SCENARIO = ["--hidden-sizes", "32", "--epochs", "3", "--lr", "3e-3", "--log-every-steps", "1"]


@pytest.fixture(scope="module")
def prices640(tmp_path_factory):
    """640 rows: 448 train = 14 global batches of 32, so no rank gets a padded batch."""
    return house_prices(tmp_path_factory.mktemp("prices") / "houses.parquet", rows=640)


def regression_args(path, *extra: str) -> list[str]:
    return ["--dataset", str(path), "--label-column", "price", *SCENARIO, *extra]


def weights(run_dir):
    from anytrain import load_model

    return load_model(run_dir).state_dict()


@pytest.mark.launch
def test_regression_on_two_ranks_equals_one_rank_and_accumulation_equals_the_big_batch(tmp_path, prices640):
    from conftest import launch, max_abs_diff

    two_ranks = regression_args(prices640, "--batch-size", "16", "--dropout", "0")  # each rank draws its own dropout
    out = launch("multi_cpu.yaml", *two_ranks, "--output-dir", str(tmp_path / "two"))
    assert out.returncode == 0, out.stderr[-3000:]
    one = dict(
        FAST, hidden_sizes=[32], dropout=0.0, epochs=3, log_every_steps=1, dataset=str(prices640), label_column="price"
    )
    big = anytrain.train(one, batch_size=32, output_dir=str(tmp_path / "one"))
    accumulated = anytrain.train(one, batch_size=16, grad_accum_steps=2, output_dir=str(tmp_path / "accum"))
    assert big["task"] == "regress" and big["optimizer_steps"] == 3 * 14
    assert max_abs_diff(weights(tmp_path / "two"), weights(tmp_path / "one")) < 1e-6
    assert max_abs_diff(weights(tmp_path / "accum"), weights(tmp_path / "one")) < 1e-6
    two = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert two["test_r2"] == pytest.approx(big["test_r2"], abs=1e-6)
    assert accumulated["test_r2"] == pytest.approx(big["test_r2"], abs=1e-6)


@pytest.mark.launch
def test_a_killed_regression_run_resumes_bit_identical(tmp_path, prices640):
    from conftest import kill_and_resume

    args = regression_args(prices640, "--batch-size", "16", "--dropout", "0.1", "--checkpoint-every-steps", "5")
    kill_and_resume(tmp_path, args, 33)
    a, b = weights(tmp_path / "reference"), weights(tmp_path / "victim")
    assert all(torch.equal(a[k], b[k]) for k in a)
