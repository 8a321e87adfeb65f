"""Clusters: `--resume auto` under torchrun's restarts (a rank killed once, the job restarted in
place, the same weights as an uninterrupted run) and the SLURM example run end to end on this
machine with `srun`/`scontrol` stand-ins (one node, 2 CPU ranks), then re-queued."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from conftest import LAUNCH_TIMEOUT, ROOT, TRAIN, free_port, launch, read_metrics, read_summary, wait_for_step

from anytrain import load_model

pytestmark = pytest.mark.launch

RUN = (
    "--dataset synthetic --synthetic-samples 2600 --hidden-sizes 256 256 --dropout 0.2 --batch-size 16 --epochs 2 "
    "--checkpoint-every-steps 5 --log-every-steps 1 --resume auto"
).split()


def test_a_rank_killed_once_under_max_restarts_resumes_to_the_same_weights(tmp_path):
    reference = launch("multi_cpu.yaml", *RUN, "--output-dir", str(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr[-2000:]
    run = tmp_path / "restarted"
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "accelerate_configs" / "multi_cpu.yaml"),
        "--main_process_port",
        str(free_port()),
        "--max_restarts",
        "1",
        "--monitor_interval",
        "0.5",
        "--rdzv_backend",
        "c10d",  # restarts need the dynamic rendezvous: under `static` the new ranks reach stale addresses
        str(TRAIN),
        "--no-progress",
        *RUN,
        "--output-dir",
        str(run),
    ]
    env = {
        **os.environ,
        # A fresh store for each attempt: in the launcher's shared one, a restarted rank can read the killed
        # attempt's gloo address (Connection refused, or a hang in connectFullMesh). See scenario.restart_problem.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        # On one machine the c10d rendezvous ignores --main_process_port and would share localhost:29400 with others.
        "PET_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}",
    }
    job = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        wait_for_step(run, 23, job)
        victim = next(
            c
            for c in psutil.Process(job.pid).children(recursive=True)
            if c.environ().get("RANK") == "1" and str(TRAIN) in " ".join(c.cmdline())
        )
        victim.send_signal(
            signal.SIGKILL
        )  # once: torchrun restarts both ranks, which continue from the latest checkpoint
        out, err = job.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 0, err[-3000:]
    assert "resuming from" in out  # the restarted ranks found the checkpoint by themselves
    summary = read_summary(run)
    assert summary["resumed_from"] is not None and summary["epochs_completed"] == 2
    assert summary["scenario"]["warnings"] == []  # no restart_problem with a store per attempt
    ref, res = load_model(tmp_path / "reference").state_dict(), load_model(run).state_dict()
    assert all(torch.equal(ref[k], res[k]) for k in ref), "weights differ"
    assert [(m["step"], m["loss"]) for m in read_metrics(tmp_path / "reference")] == [
        (m["step"], m["loss"]) for m in read_metrics(run)
    ]


def test_restarts_on_the_launchers_shared_store_are_warned_about(monkeypatch):
    from anytrain.scenario import restart_problem

    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    monkeypatch.setenv(
        "TORCHELASTIC_USE_AGENT_STORE", "True"
    )  # what torchrun exports unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in restart_problem()
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert restart_problem() is None
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    assert restart_problem() is None


def stand_in(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_the_slurm_example_runs_on_one_node_and_a_requeued_job_resumes(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # srun: drop its own options, run the command once (one node, one task); scontrol: the node list
    stand_in(bin_dir, "srun", 'while [[ "$1" == --* ]]; do shift; done; exec "$@"')
    stand_in(bin_dir, "scontrol", "echo localhost")
    run = tmp_path / "run"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NAME": "anytrain-test",
        "GPUS_PER_NODE": "2",
        "MAIN_PORT": str(free_port()),
        "RUN_DIR": str(run),
    }
    tiny = ["--dataset", "synthetic", "--synthetic-samples", "600", "--hidden-sizes", "16", "--no-progress"]
    script = str(ROOT / "examples" / "slurm" / "train.sbatch")
    first = subprocess.run(
        ["bash", script, *tiny, "--epochs", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    summary = read_summary(run)
    assert summary["scenario"]["num_processes"] == 2 and summary["resumed_from"] is None
    env["MAIN_PORT"] = str(free_port())
    requeued = subprocess.run(
        ["bash", script, *tiny, "--epochs", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
    )
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    summary = read_summary(run)
    assert summary["resumed_from"] is not None and summary["epochs_completed"] == 2
