"""`anytrain plot`: PNGs of training curves drawn from real run folders (trained in-process, once per module)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from anytrain import TrainConfig
from anytrain.plot import main, plot_runs, read_metrics  # imports matplotlib only when plotting

pytest.importorskip("matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A classification run and a tiny language-model run, trained once for the whole module."""
    import torch
    from accelerate.state import AcceleratorState

    from anytrain.trainer import train

    root = tmp_path_factory.mktemp("runs")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        AcceleratorState._reset_state(True)
        train(TrainConfig(epochs=2, hidden_sizes=[16], progress=False, log_every_steps=5, output_dir=str(root / "clf")))
        AcceleratorState._reset_state(True)
        train(
            TrainConfig(
                dataset="shakespeare",
                n_layer=1,
                n_head=2,
                n_embd=16,
                block_size=16,
                batch_size=8,
                max_steps=30,
                eval_every_steps=10,
                eval_windows=20,
                dropout=0.0,
                log_every_steps=5,
                progress=False,
                output_dir=str(root / "lm"),
            )
        )
    finally:
        AcceleratorState._reset_state(True)
        torch.set_num_threads(threads)
    return {"clf": root / "clf", "lm": root / "lm"}


def assert_png(path: Path, min_width: int = 400, min_height: int = 300) -> None:
    from matplotlib.image import imread

    assert path.is_file(), path
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width = imread(str(path)).shape[:2]
    assert width >= min_width and height >= min_height, (width, height)


def copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    shutil.copy(src / "metrics.jsonl", dst / "metrics.jsonl")
    return dst


def test_read_metrics_has_train_and_eval_lines(runs):
    clf, lm = read_metrics(runs["clf"]), read_metrics(runs["lm"])
    assert {r["kind"] for r in clf} == {"train", "eval"}
    assert any("tokens_per_s" in r for r in lm) and any("perplexity" in r for r in lm)
    for name, records in (("clf", clf), ("lm", lm)):  # a task with an evaluation loss logs it (grpo has none)
        summary = json.loads((runs[name] / "summary.json").read_text())
        best = [r for r in records if r.get("split") == "validation" and r["step"] == summary["final_weights_step"]]
        assert summary["val_loss"] == best[-1]["loss"] > 0, name
        assert all(r["loss"] > 0 for r in records if r["kind"] == "eval"), name


def test_the_loss_panel_says_validation_only_where_a_run_has_a_validation_loss():
    """A task without an evaluation loss (grpo's eval rows hold rewards): its loss panel's legend is the training
    line alone; beside a run with a validation loss, both styles."""
    from matplotlib.figure import Figure

    from anytrain.plot import _draw_panel

    train = [{"kind": "train", "step": s, "loss": 1.0 / s} for s in (1, 2)]
    rewards = [*train, {"kind": "eval", "split": "validation", "step": 2, "reward": 0.5, "greedy_reward": 0.7}]
    losses = [*train, {"kind": "eval", "split": "validation", "step": 2, "loss": 0.4}]

    def legend(runs):
        ax = Figure().subplots()
        _draw_panel(ax, ("loss", "Loss", "loss"), runs, ["C0", "C1"], ["a", "b"])
        return [t.get_text() for t in ax.get_legend().get_texts()], [len(line.get_xdata()) for line in ax.lines]

    assert legend([rewards]) == (["train"], [2, 0])  # the training curve; no validation points
    assert legend([rewards, losses]) == (["train", "validation"], [2, 0, 2, 1])


def test_one_run_default_output_in_run_folder(runs, tmp_path, capsys):
    run = copy_run(runs["clf"], tmp_path / "clf")
    main([str(run)])
    written = capsys.readouterr().out.strip()
    assert Path(written) == run / "curves.png"
    assert_png(run / "curves.png")


def test_two_runs_overlaid_in_one_file(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main([str(runs["clf"]), str(runs["lm"])])  # several runs: curves.png in the current folder
    assert capsys.readouterr().out.strip() == "curves.png"
    assert_png(tmp_path / "curves.png")
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["curves.png"]
    assert not (runs["clf"] / "curves.png").exists() and not (runs["lm"] / "curves.png").exists()


def test_language_model_run_and_explicit_output(runs, tmp_path):
    out = plot_runs([runs["lm"]], tmp_path / "sub" / "lm.png")
    assert out == tmp_path / "sub" / "lm.png"
    assert_png(out)


def test_same_folder_names_and_torn_last_line(runs, tmp_path):
    a = copy_run(runs["clf"], tmp_path / "x" / "run")
    b = copy_run(runs["lm"], tmp_path / "y" / "run")
    with open(b / "metrics.jsonl", "a") as f:
        f.write('\n{"kind": "train", "step": 35}\n')  # a line missing most keys
        f.write('{"kind": "train", "ste')  # torn by a kill mid-write
    lines = (b / "metrics.jsonl").read_text().splitlines()
    assert len(read_metrics(b)) == len(lines) - 2  # the blank line and the torn one are skipped
    assert_png(plot_runs([a, b], tmp_path / "both.png"))


def test_missing_metrics_is_one_line_and_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit) as stop:
        main([str(empty)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("anytrain plot: error: ") and "metrics.jsonl" in err
    assert not (empty / "curves.png").exists()


def test_missing_folder_and_unusable_metrics_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path / "nowhere")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1

    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "metrics.jsonl").write_text('\n{"kind": "tr\n[1, 2]\n' + json.dumps({"kind": "note"}) + "\n")
    with pytest.raises(ValueError, match="no usable"):
        plot_runs([junk], tmp_path / "junk.png")
    with pytest.raises(SystemExit) as stop:
        main([str(junk), "-o", str(tmp_path / "junk.png")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no usable" in err


def test_a_finished_run_draws_its_curves_into_the_run_folder(tmp_path, draws_curves):
    from anytrain.trainer import train

    train(TrainConfig(epochs=1, hidden_sizes=[8], progress=False, output_dir=str(tmp_path / "run")))
    png = tmp_path / "run" / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    train(TrainConfig(epochs=1, hidden_sizes=[8], progress=False, plot=False, output_dir=str(tmp_path / "quiet")))
    assert not (tmp_path / "quiet" / "curves.png").exists()  # --no-plot
