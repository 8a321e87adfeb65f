"""Experiment trackers through accelerate: TensorBoard event files written by a real run and read
back hold the same values as metrics.jsonl at the same steps; a tracker that is not installed is
one line naming the extra to install."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import read_metrics

from anytrain import TrainConfig
from anytrain.cli import main
from anytrain.trainer import train


@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed (the test extra brings it)"
)
def test_tensorboard_gets_the_metrics_log_values_at_the_same_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    train(
        TrainConfig(
            epochs=2,
            hidden_sizes=[16],
            log_every_steps=5,
            progress=False,
            report_to="tensorboard",
            run_name="digits-small",
            output_dir=str(run),
        )
    )
    folders = [p for p in (run / "trackers" / "digits-small").rglob("events.out.tfevents.*")]
    assert folders, list(run.rglob("*"))
    events = EventAccumulator(str(folders[0].parent))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "train/loss",
        "train/lr",
        "train/samples_per_s",
        "validation/loss",
        "validation/accuracy",
        "test/accuracy",
    } <= tags, tags
    logged = read_metrics(run)
    for tag, kind, key in (
        ("train/loss", "train", "loss"),
        ("train/lr", "train", "lr"),
        ("validation/accuracy", "eval", "accuracy"),
    ):
        expected = [
            (m["step"], m[key]) for m in logged if m["kind"] == kind and m.get("split", "validation") == "validation"
        ]
        got = [(e.step, e.value) for e in events.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in expected]
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6)  # TensorBoard stores float32
    # the config went in as the run's hyper-parameters too
    assert list((run / "trackers" / "digits-small").rglob("hparams.yml"))


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_a_tracker_that_is_not_installed_is_one_line_naming_the_extra(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--report-to", "wandb", "--no-progress", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1
    assert "--report-to wandb: the wandb package is not installed (pip install 'anytrain[wandb]')" in err
    assert not (tmp_path / "run").exists()
