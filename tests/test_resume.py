"""Checkpoints, exact resume after SIGKILL, graceful SIGTERM/SIGINT, non-finite loss, and bad input
that must leave earlier work untouched."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import check_fingerprint, finish_run, read_metrics, read_summary, start_run, wait_for_step

from anytrain import TrainConfig, load_model
from anytrain.trainer import NonFiniteLoss, train

TIMEOUT = 240
# Slow enough per step (a 256-wide MLP on 2 cores) that a kill lands mid-run; dropout on, so the
# RNG state must be restored too; 3 epochs of 40 steps.
RUN = (
    "--dataset synthetic --synthetic-samples 2600 --hidden-sizes 256 256 --dropout 0.2 --batch-size 16 --epochs 3 "
    "--checkpoint-every-steps 7 --log-every-steps 1 --no-progress"
).split()


def start(run_dir: Path, *extra: str, ranks: int = 1) -> subprocess.Popen:
    return start_run(run_dir, RUN, *extra, ranks=ranks)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    return finish_run(proc, TIMEOUT)


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_model(a).state_dict(), load_model(b).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "weights differ"


@pytest.mark.launch
@pytest.mark.parametrize("ranks, accum", [(1, 1), (1, 3), (2, 2)])
def test_sigkill_at_a_random_step_then_resume_is_bit_identical(tmp_path, ranks, accum):
    extra = ["--grad-accum-steps", str(accum)]
    steps_total = 3 * -(-(2080 // (16 * ranks)) // accum)
    kill_step = random.Random(f"{ranks}-{accum}").randint(8, steps_total - 5)
    print(f"kill step {kill_step} of {steps_total} ({ranks} rank(s), grad_accum_steps {accum})")
    reference = start(tmp_path / "reference", *extra, ranks=ranks)
    victim = start(tmp_path / "victim", *extra, ranks=ranks)
    wait_for_step(tmp_path / "victim", kill_step, victim)
    os.killpg(victim.pid, signal.SIGKILL)  # no chance to save anything
    victim.wait(timeout=60)
    code, err = finish(reference)
    assert code == 0, err[-2000:]
    latest = (tmp_path / "victim" / "checkpoints" / "latest").read_text().strip()
    resumed = start(tmp_path / "victim", "--resume", *extra, ranks=ranks)
    code, err = finish(resumed)
    assert code == 0, err[-2000:]
    assert_same_weights(tmp_path / "reference", tmp_path / "victim")
    # the metrics log reads as if the run had never stopped
    ref_log, res_log = read_metrics(tmp_path / "reference"), read_metrics(tmp_path / "victim")
    assert [(m["step"], m["loss"]) for m in ref_log] == [(m["step"], m["loss"]) for m in res_log]
    assert read_summary(tmp_path / "victim")["resumed_from"].endswith(latest)
    check_fingerprint(f"resumed_{ranks}x{accum}", tmp_path / "victim")


@pytest.mark.launch
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_sigint_save_then_exit_with_the_conventional_code(tmp_path, signum, code):
    proc = start(tmp_path / "run", "--checkpoint-every-steps", "0")  # only the signal will save mid-epoch
    wait_for_step(tmp_path / "run", 12, proc)
    os.killpg(proc.pid, signum)
    returncode, err = finish(proc)
    assert returncode == code, err[-2000:]
    assert "checkpoint saved in" in err and "--resume" in err
    latest = (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    assert int(latest.split("-")[1]) >= 12
    resumed = start(tmp_path / "run", "--resume", "--checkpoint-every-steps", "0")
    assert finish(resumed)[0] == 0
    reference = start(tmp_path / "reference", "--checkpoint-every-steps", "0")
    assert finish(reference)[0] == 0
    assert_same_weights(tmp_path / "reference", tmp_path / "run")


def _cfg(tmp_path, name="run", **kw) -> TrainConfig:
    base = {"epochs": 2, "hidden_sizes": [16], "batch_size": 64, "progress": False, "output_dir": str(tmp_path / name)}
    return TrainConfig(**{**base, **kw})


def test_checkpoints_kept_last_k_plus_best_with_pointers(tmp_path):
    train(_cfg(tmp_path, epochs=6, checkpoint_every_steps=5, keep_checkpoints=2, lr=0.05))
    folder = tmp_path / "run" / "checkpoints"
    kept = sorted(p.name for p in folder.glob("step-*"))
    latest, best = (folder / "latest").read_text().strip(), (folder / "best").read_text().strip()
    assert latest == "step-000120" and latest in kept
    assert best in kept and set(kept) <= {best, "step-000115", "step-000120"}
    assert not list(folder.glob(".tmp-*"))
    # the best pointer names the checkpoint saved right after the best validation: the highest accuracy (the
    # headline metric of classify), of equal ones the lowest loss
    evals = [m for m in read_metrics(tmp_path / "run") if m.get("split") == "validation"]
    assert int(best.split("-")[1]) == max(evals, key=lambda m: (m["accuracy"], -m["loss"]))["step"]


def test_a_kill_during_save_leaves_the_previous_checkpoint_usable(tmp_path):
    train(_cfg(tmp_path, epochs=2))
    folder = tmp_path / "run" / "checkpoints"
    (folder / ".tmp-step-000099").mkdir()  # what a save killed before its rename leaves behind
    (folder / ".tmp-step-000099" / "model.safetensors").write_bytes(b"half")
    assert (folder / "latest").read_text().strip() == "step-000040"
    (tmp_path / "run" / "summary.json").unlink()  # pretend the run did not finish
    summary = train(_cfg(tmp_path, epochs=3, resume="latest"))
    assert summary["optimizer_steps"] == 60 and summary["resumed_from"].endswith("step-000040")


def test_resume_continues_training_after_more_epochs_are_asked_for(tmp_path):
    # log every 7 steps: checkpoints at epoch ends (every 20 steps) fall mid logging window
    train(_cfg(tmp_path, "short", epochs=2, schedule="constant", log_every_steps=7))
    train(_cfg(tmp_path, "short", epochs=3, schedule="constant", log_every_steps=7, resume="latest"))
    train(_cfg(tmp_path, "long", epochs=3, schedule="constant", log_every_steps=7))
    assert_same_weights(tmp_path / "short", tmp_path / "long")

    def train_log(name):
        return [(m["step"], m["loss"]) for m in read_metrics(tmp_path / name) if m["kind"] == "train"]

    assert train_log("short") == train_log("long")


def test_non_finite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    with pytest.raises(NonFiniteLoss, match=r"non-finite .* at optimizer step \d+"):
        train(
            _cfg(
                tmp_path,
                epochs=4,
                lr=1e6,
                max_grad_norm=0.0,
                optimizer="sgd",
                momentum=0.0,
                warmup_steps=0,
                schedule="constant",
            )
        )
    folder = tmp_path / "run" / "checkpoints"
    if (folder / "latest").exists():  # any checkpoint that was written holds finite weights
        from safetensors.torch import load_file

        latest = folder / (folder / "latest").read_text().strip()
        assert all(torch.isfinite(t).all() for t in load_file(str(latest / "model.safetensors")).values())


def _snapshot(folder: Path) -> dict:
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.rglob("*") if p.is_file()}


def _refused(tmp_path, capsys, argv, expected):
    from anytrain.cli import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code != 0 and expected in err, err
    assert len(err.splitlines()) == 1, err


def test_bad_input_is_refused_and_touches_nothing(tmp_path, capsys):
    train(_cfg(tmp_path, epochs=1))
    run = tmp_path / "run"
    before = _snapshot(run)
    base = ["--output-dir", str(run), "--epochs", "1", "--hidden-sizes", "16", "--batch-size", "64", "--no-progress"]
    _refused(tmp_path, capsys, base + ["--lr", "0.1"], "holds a run with a different config (lr)")
    _refused(
        tmp_path,
        capsys,
        base + ["--resume", "--hidden-sizes", "32"],
        "was made with a different config (hidden_sizes: [16] -> [32])",
    )
    _refused(tmp_path, capsys, base + ["--resume", str(tmp_path / "nowhere")], "checkpoint folder not found")
    _refused(
        tmp_path, capsys, ["--output-dir", str(tmp_path / "empty"), "--resume", "--no-progress"], "no checkpoint in"
    )
    _refused(tmp_path, capsys, base + ["--dataset", str(tmp_path / "gone.csv"), "--overwrite"], "file not found")
    (tmp_path / "nan.csv").write_text("x,label\n1,0\nnan,1\n" + "2,1\n3,0\n" * 20)
    _refused(tmp_path, capsys, base + ["--dataset", str(tmp_path / "nan.csv"), "--overwrite"], "NaN or infinite")
    (tmp_path / "a_file").write_text("")
    _refused(
        tmp_path,
        capsys,
        ["--output-dir", str(tmp_path / "a_file" / "run"), "--no-progress"],
        "--output-dir: cannot write to",
    )
    assert _snapshot(run) == before
    # a truncated checkpoint: refused with a clear line
    latest = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    (latest / "optimizer.bin").write_bytes(b"")
    before = _snapshot(run)
    _refused(tmp_path, capsys, base + ["--resume"], "is incomplete or corrupt")
    (latest / "optimizer.bin").write_bytes(b"garbage, not a torch file")
    before = _snapshot(run)
    _refused(tmp_path, capsys, base + ["--resume"], "cannot load checkpoint")
    assert _snapshot(run) == before  # nothing earlier was overwritten or deleted


def test_an_unfinished_run_is_not_restarted_by_accident(tmp_path, capsys):
    train(_cfg(tmp_path, epochs=1))
    (tmp_path / "run" / "summary.json").unlink()
    _refused(
        tmp_path,
        capsys,
        [
            "--output-dir",
            str(tmp_path / "run"),
            "--epochs",
            "1",
            "--hidden-sizes",
            "16",
            "--batch-size",
            "64",
            "--no-progress",
        ],
        "holds an unfinished run",
    )
    summary = train(_cfg(tmp_path, epochs=1, overwrite=True))  # asked for explicitly
    assert summary["resumed_from"] is None


@pytest.mark.launch
def test_one_rank_dying_ends_the_whole_job_quickly(tmp_path):
    import psutil

    proc = start(tmp_path / "run", "--epochs", "50", ranks=2)
    wait_for_step(tmp_path / "run", 3, proc)
    ranks = [p for p in psutil.Process(proc.pid).children(recursive=True) if "train.py" in " ".join(p.cmdline())]
    assert len(ranks) == 2
    killed_at = time.monotonic()
    ranks[1].kill()
    code, _err = finish(proc)
    elapsed = time.monotonic() - killed_at
    print(f"job exited with {code} {elapsed:.1f}s after one rank was SIGKILLed")
    assert code != 0 and elapsed < 60
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks)
