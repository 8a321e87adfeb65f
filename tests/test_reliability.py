"""Faults, for real: a second launch into a running run folder, a SIGKILLed run with a torn log line
and a damaged `latest` pointer, resuming on another process count, and a checkpoint carrying a
pickle that would run code."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, TRAIN, finish_run, free_port, launch, read_metrics, read_summary, start_run, wait_for_step

from anytrain import TrainConfig, load_model
from anytrain.cli import main
from anytrain.trainer import train

# Slow enough per step (a 256-wide MLP) that the first run is still going when the second comes.
RUN = (
    "--dataset synthetic --synthetic-samples 2600 --hidden-sizes 256 256 --dropout 0.2 --batch-size 16 --epochs 2 "
    "--checkpoint-every-steps 7 --log-every-steps 1 --no-progress"
).split()
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # two runs side by side on 2 cores


@pytest.mark.launch
def test_a_second_launch_into_a_running_folder_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    long_run = [*RUN, "--epochs", "200"]  # still training when the second launch comes; stopped by SIGTERM below
    first = start_run(run, long_run, env=ONE_THREAD)
    wait_for_step(run, 8, first)  # a checkpoint exists, so the second launch gets as far as the lock
    second = subprocess.run(
        [sys.executable, str(TRAIN), *long_run, "--output-dir", str(run), "--resume"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **ONE_THREAD},
    )
    assert first.poll() is None, "the first run ended before the second launch"
    assert second.returncode == 2, second.stdout[-1000:]
    line = second.stderr.strip()
    assert (
        len(line.splitlines()) == 1 and f"--output-dir: {run} is in use by another run (pid {first.pid} on " in line
    ), line
    # a 2-rank job is refused as a whole: its main process asks, both ranks stop
    job = launch("multi_cpu.yaml", *long_run, "--output-dir", str(run), "--resume", env=ONE_THREAD)
    assert job.returncode != 0 and f"is in use by another run (pid {first.pid} on " in job.stderr
    assert first.poll() is None, "the first run ended before the 2-rank launch"
    os.killpg(first.pid, signal.SIGTERM)  # the holder saves and exits; its lock goes with it
    code, err = finish_run(first)
    assert code == 143, err[-2000:]
    assert not (run / ".lock").exists()  # released on the way out
    steps = [m["step"] for m in read_metrics(run) if m["kind"] == "train"]
    assert steps == list(range(1, len(steps) + 1))  # one run's log, nothing from the refused one


@pytest.mark.launch
def test_a_killed_run_with_a_torn_log_and_a_damaged_pointer_resumes_exactly(tmp_path):
    reference = start_run(tmp_path / "reference", RUN, env=ONE_THREAD)
    victim_dir = tmp_path / "victim"
    victim = start_run(victim_dir, RUN, env=ONE_THREAD)
    wait_for_step(victim_dir, 30, victim)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=60)
    assert finish_run(reference)[0] == 0
    with open(victim_dir / "metrics.jsonl", "a") as log:
        log.write('{"kind": "train", "step": 31, "epo')  # what a kill in the middle of a write leaves
    (victim_dir / "checkpoints" / "latest").write_text("step-999999\n")  # points at nothing
    resumed = start_run(victim_dir, RUN, "--resume", env=ONE_THREAD)
    out, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err[-2000:]
    assert f"took over the lock of a run that ended without releasing it (pid {victim.pid} on " in out
    assert "dropped an incomplete line" in out and "resuming from the newest complete checkpoint" in out
    ref, res = load_model(tmp_path / "reference").state_dict(), load_model(victim_dir).state_dict()
    assert all(torch.equal(ref[k], res[k]) for k in ref), "weights differ"
    assert [(m["step"], m["loss"]) for m in read_metrics(tmp_path / "reference")] == [
        (m["step"], m["loss"]) for m in read_metrics(victim_dir)
    ]


FAST = {
    "dataset": "synthetic",
    "synthetic_samples": 400,
    "hidden_sizes": [16],
    "batch_size": 64,
    "epochs": 1,
    "progress": False,
}


def flags(options: dict) -> list[str]:
    out = []
    for key, value in options.items():
        if key == "progress":
            continue
        out += [f"--{key.replace('_', '-')}", *map(str, value if isinstance(value, list) else [value])]
    return out


@pytest.mark.launch
def test_resuming_on_another_process_count_is_refused_both_ways(tmp_path, capsys):
    train(TrainConfig(**FAST, output_dir=str(tmp_path / "one")))
    two = launch("multi_cpu.yaml", *flags(FAST), "--output-dir", str(tmp_path / "one"), "--resume", "--epochs", "2")
    assert two.returncode != 0
    assert "was made by 1 process(es) and this launch has 2" in two.stderr and "resume with 1 process(es)" in two.stderr
    assert read_summary(tmp_path / "one")["optimizer_steps"] == 5  # untouched

    made = launch("multi_cpu.yaml", *flags(FAST), "--output-dir", str(tmp_path / "two"))
    assert made.returncode == 0, made.stderr[-2000:]
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    with pytest.raises(SystemExit) as exc:
        main([*flags(FAST), "--no-progress", "--output-dir", str(tmp_path / "two"), "--resume", "--epochs", "2"])
    err = capsys.readouterr().err.strip()
    assert (
        exc.value.code == 2 and "was made by 2 process(es) and this launch has 1" in err and len(err.splitlines()) == 1
    )


class RunsCode:
    """Unpickling this calls open(marker, 'w'): what a hostile checkpoint could do with any callable."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoints_hold_json_and_tensors_and_a_pickle_that_runs_code_is_refused(tmp_path, capsys):
    train(TrainConfig(**FAST, output_dir=str(tmp_path / "run")))
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000005"
    assert not list(checkpoint.glob("custom_checkpoint_*"))  # the loop's state is no longer pickled
    state = json.loads((checkpoint / "progress.json").read_text())
    assert state["progress"]["step"] == 5 and state["scheduler"]["last_epoch"] == 5 and state["num_processes"] == 1
    marker = tmp_path / "pwned"
    (checkpoint / "random_states_0.pkl").write_bytes(pickle.dumps({"random_state": RunsCode(marker)}))
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    with pytest.raises(SystemExit) as exc:
        main(
            [
                *flags(FAST),
                "--no-progress",
                "--output-dir",
                str(tmp_path / "run"),
                "--resume",
                str(checkpoint),
                "--epochs",
                "2",
            ]
        )
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "random_states_0.pkl does not load as plain tensors without running code" in err, err
    assert not marker.exists()  # nothing ran


@pytest.mark.launch
def test_a_file_size_limit_during_a_checkpoint_is_one_line_and_keeps_the_previous_one(tmp_path):
    run = tmp_path / "run"
    short = [*RUN, "--synthetic-samples", "800", "--epochs", "1", "--checkpoint-every-steps", "0"]
    assert finish_run(start_run(run, short))[0] == 0
    checkpoints = run / "checkpoints"
    before = {p: p.read_bytes() for p in checkpoints.rglob("*") if p.is_file()}
    # a real `ulimit -f`: 200 KiB per file; the weights file of the next checkpoint (~340 KB) cannot be written
    cmd = " ".join([sys.executable, str(TRAIN), *short, "--epochs", "2", "--output-dir", str(run), "--resume"])
    limited = subprocess.run(
        ["bash", "-c", f"ulimit -f 200; exec {cmd}"], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert limited.returncode == 1
    line = limited.stderr.strip()
    assert (
        len(line.splitlines()) == 1
        and "could not write checkpoint step-" in line
        and "disk full or a file-size limit?" in line
        and "The previous checkpoint and checkpoints/latest are intact" in line
    ), line
    assert {
        p: p.read_bytes() for p in checkpoints.rglob("*") if p.is_file()
    } == before  # nothing half-written left, nothing lost
    code, err = finish_run(start_run(run, short, "--epochs", "2", "--resume"))
    assert code == 0, err[-2000:]
    assert read_summary(run)["epochs_completed"] == 2


@pytest.mark.launch
def test_a_stopped_rank_ends_the_job_with_a_clear_error_after_the_collective_timeout(tmp_path):
    import time

    import psutil

    run = tmp_path / "run"
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ROOT / "accelerate_configs" / "multi_cpu.yaml"),
            "--main_process_port",
            str(free_port()),
            str(TRAIN),
            *RUN,
            "--epochs",
            "200",
            "--collective-timeout",
            "8",
            "--output-dir",
            str(run),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_step(run, 10, job)
        ranks = [c for c in psutil.Process(job.pid).children(recursive=True) if str(TRAIN) in " ".join(c.cmdline())]
        stopped = next(c for c in ranks if c.environ().get("RANK") == "1")
        first = next(c for c in ranks if c.environ().get("RANK") == "0")
        stopped.suspend()  # SIGSTOP: alive, holding its sockets, answering nothing
        started = time.monotonic()
        psutil.wait_procs([first], timeout=8 + 60)
        waited = time.monotonic() - started
        # rank 0 gave up; torchrun now stops the job, giving the stopped rank 30 s to react to its SIGTERM before a
        # SIGKILL: woken, it takes the SIGTERM at once (torch's 30 s of grace are not what this test is about)
        stopped.resume()
        _, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode != 0
    assert "train.py: error: rank 0 waited more than --collective-timeout 8 s for the other ranks" in err, err[-3000:]
    assert 8 <= waited < 8 + 30  # rank 0 ended itself after the timeout, not on torchrun's signal
    assert not stopped.is_running() or stopped.status() == psutil.STATUS_ZOMBIE


def test_a_checkpoint_that_fails_for_another_reason_is_not_blamed_on_the_disk(tmp_path):
    """An FSDP2 checkpoint once failed inside safetensors (a sharded tensor it could not read) and the line said
    "disk full or a file-size limit?": only storage errors say that now; others are named as they are."""
    from anytrain.checkpoint import write_failure

    other = write_failure(
        RuntimeError("Attempted to access the data pointer on an invalid python storage."), "step-1", tmp_path
    )
    assert "disk full" not in other and "RuntimeError: Attempted to access the data pointer" in other
    assert other.endswith("The previous checkpoint and checkpoints/latest are intact")
    for storage in (
        OSError(28, "No space left on device"),
        RuntimeError("Error while serializing: IoError(Os { code: 27 })"),
    ):
        assert "disk full or a file-size limit?" in write_failure(storage, "step-1", tmp_path)
