"""Data-parallel equivalence, two "machines" on loopback, and configs users write themselves (issue 3),
with real `accelerate launch` runs. Tolerances and why: docs/equivalence.md.

Seven `accelerate launch` commands, six trainings: two single-machine 2-rank runs, one 2-machine run
(two commands), a machine whose partner never starts (no training; it runs beside the 2-machine
pair), a 1-process run with `accelerate config default`'s file, and the wizard's MULTI_CPU answer.
The 1-rank references train in-process.

Data: `--dataset synthetic` with 716 rows split 512 train / 101 validation / 103 test. 512 divides by
every global batch used here (32 = 2 ranks x 16 = 2 ranks x 2 accumulated x 8), so no rank gets a
padded or partial training batch; 101 and 103 divide by neither the batch size nor the world size.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    CONFIGS,
    LAUNCH_TIMEOUT,
    ROOT,
    TRAIN,
    as_launched,
    check_fingerprint,
    free_port,
    launch,
    max_abs_diff,
    read_metrics,
    read_summary,
)

from anytrain import TrainConfig, load_model
from anytrain.trainer import train

pytestmark = pytest.mark.launch

N = 716
DATA = {
    "dataset": "synthetic",
    "synthetic_samples": N,
    "synthetic_features": 20,
    "synthetic_classes": 5,
    "val_fraction": 101.5 / N,
    "test_fraction": 103.5 / N,
}  # floor(716 x f) = 101 and 103 rows
COMMON = dict(
    DATA, hidden_sizes=[32], dropout=0.0, schedule="cosine", warmup_steps=4, max_grad_norm=1.0, log_every_steps=4
)
# SGD with early stopping: validation losses 0.977, 0.484, 0.478 -> no gain of 0.01 at epoch 2 -> stop there
SGD = dict(  # early stopping on the validation loss (the fingerprint pinned for two_ranks_sgd is of this run)
    COMMON,
    optimizer="sgd",
    lr=0.05,
    epochs=12,
    early_stopping_patience=1,
    early_stopping_min_delta=0.01,
    best_metric="loss",
)
ADAMW = dict(COMMON, optimizer="adamw", lr=3e-3, epochs=3)
WEIGHT_TOL = 1e-6  # measured max abs diff: 6e-8 (SGD), 4.5e-8 (AdamW + accumulation)


def flags(options: dict) -> list[str]:
    out: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        out += [flag, *map(str, value)] if isinstance(value, list) else [flag, str(value)]
    return out


def weights(run_dir) -> dict:
    return load_model(run_dir).state_dict()


def train_log(run_dir) -> list[dict]:
    return [m for m in read_metrics(run_dir) if m["kind"] == "train"]


def assert_finished(returncode: int, output: str) -> None:
    if returncode != 0:
        pytest.fail(f"launch failed with exit code {returncode}:\n{output[-4000:]}")


def write_cluster_config(path: Path, **answers) -> Path:
    """A config file in exactly the shape `accelerate config` (the wizard) writes: its ClusterConfig."""
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import ComputeEnvironment

    fields = {
        "compute_environment": ComputeEnvironment.LOCAL_MACHINE,
        "mixed_precision": "no",
        "machine_rank": 0,
        "num_machines": 1,
        "main_process_ip": None,
        "main_process_port": None,
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "downcast_bf16": False,
        "debug": False,
        "enable_cpu_affinity": False,
        "fp8_config": {},
        "deepspeed_config": {},
        "fsdp_config": {},
        "parallelism_config": {},
        "megatron_lm_config": {},
        "mpirun_config": {},
        "dynamo_config": {},
        "commands": None,
        "command_file": None,
        "tpu_env": [],
        "tpu_name": None,
        "tpu_vm": None,
        "tpu_zone": None,
        "tpu_use_sudo": False,
        "tpu_use_cluster": False,
    }
    ClusterConfig(**{**fields, **answers}).to_yaml_file(str(path))
    return path


def run_in_process(options: dict, run_dir: Path) -> dict:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    try:
        with as_launched():  # torch's default threads, as a launched 1-process run (compared bit for bit below)
            return train(TrainConfig(**options, progress=False, output_dir=str(run_dir)))
    finally:
        AcceleratorState._reset_state(True)


# --------------------------------------------------------------------------- runs shared by the tests


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory) -> dict:
    """1 process x batch 32, in-process: the reference for 2 ranks x 16 and 2 ranks x 2 accumulated x 8."""
    root = tmp_path_factory.mktemp("one_rank")
    return {
        name: (run_in_process({**options, "batch_size": 32}, root / name), root / name)
        for name, options in (("sgd", SGD), ("adamw", ADAMW))
    }


@pytest.fixture(scope="module")
def two_ranks_sgd(tmp_path_factory) -> tuple[dict, Path, subprocess.CompletedProcess]:
    """2 ranks x 16 on one machine, SGD, launched with a config in the wizard's multi-GPU shape
    (distributed_type MULTI_GPU, num_processes 2, gpu_ids all, use_cpu false), as users write it."""
    root = tmp_path_factory.mktemp("two_ranks_sgd")
    config = write_cluster_config(
        root / "wizard_multi_gpu.yaml", distributed_type="MULTI_GPU", num_processes=2, gpu_ids="all", use_cpu=False
    )
    out = launch(str(config), *flags(SGD), "--batch-size", "16", "--output-dir", str(root / "run"))
    assert_finished(out.returncode, out.stdout + out.stderr)
    return read_summary(root / "run"), root / "run", out


# --------------------------------------------------------------------------- data parallel


def test_two_ranks_equal_one_rank_with_twice_the_batch_sgd(two_ranks_sgd, one_rank):
    summary, run_dir, _out = two_ranks_sgd
    scenario = summary["scenario"]
    assert (scenario["distributed_type"], scenario["backend"], scenario["num_processes"]) == ("MULTI_CPU", "gloo", 2)
    # the wizard's multi-GPU answer on a CPU machine is what multi_cpu.yaml is: two gloo ranks, no warning
    assert scenario["warnings"] == []
    fingerprints = summary["weights_sha256_per_rank"]
    assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1]
    check_fingerprint("two_ranks_sgd", run_dir)

    reference, reference_dir = one_rank["sgd"]
    assert summary["optimizer_steps"] == reference["optimizer_steps"] == 48
    assert max_abs_diff(weights(run_dir), weights(reference_dir)) <= WEIGHT_TOL
    two, one = train_log(run_dir), train_log(reference_dir)
    assert [(m["step"], m["lr"]) for m in two] == [
        (m["step"], m["lr"]) for m in one
    ]  # the schedule counts optimizer steps
    assert all(a["loss"] == pytest.approx(b["loss"], abs=1e-6) for a, b in zip(two, one))  # measured 1.2e-7


def test_early_stopping_stops_at_the_same_epoch_on_one_and_two_ranks(two_ranks_sgd, one_rank):
    summary, _run_dir, _ = two_ranks_sgd
    reference, reference_dir = one_rank["sgd"]
    assert summary["stopped_early_at_epoch"] == reference["stopped_early_at_epoch"] == 2
    assert summary["epochs_completed"] == reference["epochs_completed"] == 3
    # every decision is far from its threshold compared with the 1e-8 the two runs differ by
    val = [m["loss"] for m in read_metrics(reference_dir) if m["kind"] == "eval" and m["split"] == "validation"]
    best, margins = val[0], []
    for loss in val[1:]:
        margins.append(abs(loss - (best - SGD["early_stopping_min_delta"])))
        best = min(best, loss) if loss < best - SGD["early_stopping_min_delta"] else best
    assert min(margins) > 1e-3


def test_evaluation_is_identical_on_one_and_two_ranks(two_ranks_sgd, one_rank):
    """101 validation and 103 test rows: the last batch is partial on one rank and padded on two;
    gather_for_metrics drops the padding. The trainer's 1-process evaluation of the 2-rank weights
    gives exactly the metrics the 2 ranks reported."""
    from accelerate import Accelerator

    from anytrain.data.splits import make_loader
    from anytrain.tasks.base import evaluate
    from anytrain.tasks.settle import load

    summary, run_dir, _ = two_ranks_sgd
    cfg = TrainConfig(**SGD, batch_size=16)
    _, task, data = load(cfg)
    assert (len(data.train), len(data.validation), len(data.test)) == (512, 101, 103)
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(load_model(run_dir))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank ran: a matmul's rounding may depend on how many threads split it
    try:
        for split, key in (("validation", "val"), ("test", "test")):
            loader = accelerator.prepare(make_loader(getattr(data, split), cfg, shuffle=False))
            single = evaluate(model, loader, task, accelerator.gather_for_metrics)
            assert single["samples"] == len(getattr(data, split))
            assert (single["loss"], single["accuracy"]) == (summary[f"{key}_loss"], summary[f"{key}_accuracy"])
    finally:
        torch.set_num_threads(threads)
    # and against the 1-rank training: its weights differ by <= 6e-8, its metrics by less than 1e-6
    reference, _ = one_rank["sgd"]
    for key in ("val", "test"):
        assert summary[f"{key}_accuracy"] == reference[f"{key}_accuracy"]
        assert summary[f"{key}_loss"] == pytest.approx(reference[f"{key}_loss"], abs=1e-6)


def test_two_ranks_with_accumulation_equal_one_rank_adamw(tmp_path, one_rank):
    """2 ranks x 2 accumulated x 8 == 1 rank x 32, AdamW: data parallelism and accumulation together.
    Each optimizer step sees the same 32 rows (rank r's k-th micro-batch is rows 16k+8r .. 16k+8r+7)."""
    run_dir = tmp_path / "run"
    # Also with small all-reduce buckets (1 MB; 5 is the CPU default): bucketing changes when, not what, is summed.
    out = launch(
        "multi_cpu.yaml",
        *flags(ADAMW),
        "--batch-size",
        "8",
        "--grad-accum-steps",
        "2",
        "--ddp-bucket-mb",
        "1",
        "--output-dir",
        str(run_dir),
    )
    assert_finished(out.returncode, out.stdout + out.stderr)
    summary = read_summary(run_dir)
    assert (
        summary["scenario"]["num_processes"] == 2
        and summary["weights_sha256_per_rank"][0] == summary["weights_sha256_per_rank"][1]
    )
    assert summary["scenario"]["gradient_all_reduce"] == "fp32" and "all-reduced in" not in out.stdout
    assert summary["scenario"]["ddp_bucket_mb"] == 1
    reference, reference_dir = one_rank["adamw"]
    assert summary["optimizer_steps"] == reference["optimizer_steps"] == 48
    assert max_abs_diff(weights(run_dir), weights(reference_dir)) <= WEIGHT_TOL
    assert [(m["step"], m["lr"]) for m in train_log(run_dir)] == [
        (m["step"], m["lr"]) for m in train_log(reference_dir)
    ]
    assert summary["test_accuracy"] == reference["test_accuracy"]


def test_an_fp16_all_reduce_is_opt_in_said_and_moves_the_weights_a_little(tmp_path, one_rank):
    """--ddp-comm-hook fp16 rounds each gradient to fp16 for the all-reduce: the ranks still agree with
    each other, but no longer exactly with 1 rank x 32; the difference stays at fp16 rounding's scale."""
    run_dir = tmp_path / "run"
    out = launch(
        "multi_cpu.yaml", *flags(ADAMW), "--batch-size", "16", "--ddp-comm-hook", "fp16", "--output-dir", str(run_dir)
    )
    assert_finished(out.returncode, out.stdout + out.stderr)
    assert "2 process(es)" in out.stdout and "gradients all-reduced in fp16" in out.stdout
    summary = read_summary(run_dir)
    assert summary["scenario"]["gradient_all_reduce"] == "fp16"
    assert summary["weights_sha256_per_rank"][0] == summary["weights_sha256_per_rank"][1]
    reference, reference_dir = one_rank["adamw"]
    difference = max_abs_diff(weights(run_dir), weights(reference_dir))
    # measured 1.5e-5 after 48 steps: 250x the fp32 all-reduce's 6e-8, far below the weights' scale
    assert 2 * WEIGHT_TOL < difference < 1e-3, difference
    assert abs(summary["test_accuracy"] - reference["test_accuracy"]) <= 2 / 103  # at most two of the 103 test rows


# --------------------------------------------------------------------------- two machines on loopback


def multi_node_command(machine_rank: int, port: int, rdzv_timeout: int, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIGS / "multi_node.yaml"),
        "--machine_rank",
        str(machine_rank),
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(port),
        "--num_machines",
        "2",
        "--num_processes",
        "2",
        "--rdzv_conf",
        f"timeout={rdzv_timeout}",
        str(TRAIN),
        "--no-progress",
        *flags(SGD),
        "--batch-size",
        "16",
        "--output-dir",
        str(run_dir),
    ]


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=os.environ.copy(),
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, deadline: float) -> tuple[int, str]:
    try:
        output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its rank, started in their own session
        output, _ = proc.communicate()
        output += "\n[killed by the test: timeout]"
    return proc.returncode, output


def test_two_machines_on_loopback_equal_one_machine_and_a_lonely_machine_gives_up(tmp_path, two_ranks_sgd):
    # A machine whose partner never starts: torchrun's static rendezvous waits for it rdzv_conf
    # timeout seconds (900 by default; --collective-timeout does not apply, no rank has started).
    lonely_started = time.monotonic()
    lonely = start(multi_node_command(0, free_port(), 15, tmp_path / "lonely"))
    # Machine 0 and machine 1 of one world, on this machine (started while the lonely one waits).
    port = free_port()
    machines = [start(multi_node_command(rank, port, 60, tmp_path / "run")) for rank in (0, 1)]
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    results = [finish(proc, deadline) for proc in machines]
    lonely_rc, lonely_out = finish(lonely, lonely_started + 90)
    lonely_seconds = time.monotonic() - lonely_started

    for rc, output in results:
        assert_finished(rc, output)
    summary = read_summary(tmp_path / "run")
    assert summary["scenario"]["num_processes"] == 2 and summary["scenario"]["backend"] == "gloo"
    assert summary["weights_sha256_per_rank"][0] == summary["weights_sha256_per_rank"][1]
    single_machine = weights(two_ranks_sgd[1])
    two_machines = weights(tmp_path / "run")
    assert all(torch.equal(two_machines[k], single_machine[k]) for k in single_machine)  # bit for bit
    assert summary["stopped_early_at_epoch"] == 2

    assert lonely_rc != 0 and lonely_seconds < 60, lonely_out[-3000:]
    assert "waiting for clients. 1/2 clients joined" in lonely_out  # DistStoreError: Timed out after 16 seconds ...
    assert not (tmp_path / "lonely").exists()  # it never started training


# --------------------------------------------------------------------------- configs users write


def test_a_config_from_accelerate_config_default_trains_unchanged(tmp_path, one_rank):
    config = tmp_path / "default.yaml"
    made = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.accelerate_cli", "config", "default", "--config_file", str(config)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert made.returncode == 0 and config.exists(), made.stderr[-2000:]
    assert json.loads(config.read_text())["distributed_type"] == "NO"  # on a CPU machine: 1 process, use_cpu true
    out = launch(str(config), *flags(SGD), "--batch-size", "32", "--output-dir", str(tmp_path / "run"))
    assert_finished(out.returncode, out.stdout + out.stderr)
    summary = read_summary(tmp_path / "run")
    assert summary["scenario"]["num_processes"] == 1 and summary["scenario"]["warnings"] == []
    _reference, reference_dir = one_rank["sgd"]
    ours, theirs = weights(tmp_path / "run"), weights(reference_dir)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)  # the same run as in-process, bit for bit


@pytest.fixture(scope="module")
def wizard_multi_cpu(tmp_path_factory) -> tuple[dict, subprocess.CompletedProcess]:
    """The wizard's "multi-CPU" answer: distributed_type MULTI_CPU, num_processes 2, use_cpu true."""
    root = tmp_path_factory.mktemp("wizard_multi_cpu")
    config = write_cluster_config(
        root / "wizard_multi_cpu.yaml", distributed_type="MULTI_CPU", num_processes=2, use_cpu=True
    )
    out = launch(
        str(config),
        *flags(SGD),
        "--batch-size",
        "32",
        "--max-steps",
        "4",
        "--output-dir",
        str(root / "run"),
        timeout=120,
    )
    assert_finished(out.returncode, out.stdout + out.stderr)
    return read_summary(root / "run"), out


def test_the_wizards_multi_cpu_config_starts_one_process_and_says_so(wizard_multi_cpu):
    # accelerate 1.15 hands MULTI_CPU to its single-process launcher: one process, which sees
    # ACCELERATE_USE_CPU=True and MASTER_ADDR/MASTER_PORT (exported only when >1 process was asked
    # for) but no WORLD_SIZE/RANK/LOCAL_RANK. README's working way: multi_cpu.yaml.
    summary, out = wizard_multi_cpu
    scenario = summary["scenario"]
    assert (scenario["distributed_type"], scenario["num_processes"]) == ("NO", 1)
    assert any("starts only one" in w and "multi_cpu.yaml" in w for w in scenario["warnings"])
    assert "anytrain: WARNING:" in out.stdout and "multi_cpu.yaml" in out.stdout


def test_the_multi_cpu_warning_names_the_process_count(wizard_multi_cpu):
    summary, _ = wizard_multi_cpu
    assert any(w.startswith("2 processes were asked for but 1 started") for w in summary["scenario"]["warnings"])
