"""The scenario report: what really runs, warnings for requests that cannot be honoured, and an
error when launched processes did not join one group."""

from __future__ import annotations

import pytest

from anytrain import TrainConfig
from anytrain.config import ConfigError
from anytrain.scenario import LaunchError, describe, format_scenario, make_accelerator


def test_plain_cpu_run_is_described_without_warnings(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    scenario = describe(make_accelerator(TrainConfig()))
    assert scenario["distributed_type"] == "NO" and scenario["num_processes"] == 1
    assert scenario["device"] == "cpu" and scenario["mixed_precision"] == "fp32"
    assert scenario["cpu_threads_per_process"] >= 1 and scenario["warnings"] == []
    assert "1 process(es), device cpu" in format_scenario(scenario)


def test_gpu_config_on_a_machine_without_gpu_is_a_warning(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "False")  # what `accelerate launch` sets for a GPU config
    scenario = describe(make_accelerator(TrainConfig()))
    assert any("asks for GPUs but this machine has no CUDA device" in w for w in scenario["warnings"])
    assert "WARNING" in format_scenario(scenario)


def test_processes_that_did_not_join_one_group_stop_the_run(monkeypatch):
    accelerator = make_accelerator(TrainConfig())
    monkeypatch.setenv("WORLD_SIZE", "2")  # launched as 2, but this process trains alone
    with pytest.raises(LaunchError, match="2 processes were launched but they joined a group of 1.*multi_cpu.yaml"):
        describe(accelerator)


def test_a_multi_cpu_launch_that_started_one_process_says_so(monkeypatch):
    # what accelerate's simple launcher exports for `distributed_type: MULTI_CPU, num_processes: 2`
    # (or --cpu --num_processes 2): a rendezvous address, but no RANK/WORLD_SIZE, and one process
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    scenario = describe(make_accelerator(TrainConfig()))
    assert scenario["num_processes"] == 1
    assert any("starts only one" in w and "multi_cpu.yaml" in w for w in scenario["warnings"])


def test_fsdp_config_without_gpus_says_it_runs_plain_data_parallel(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` sets for fsdp.yaml
    scenario = describe(make_accelerator(TrainConfig()))
    assert any("FSDP was requested but runs only on GPUs" in w for w in scenario["warnings"])


def test_a_bf16_all_reduce_on_cpus_is_one_clear_error_and_one_process_has_no_all_reduce():
    with pytest.raises(ConfigError, match=r"--ddp-comm-hook bf16: .*NCCL.*on CPUs \(gloo\) use fp16 or none"):
        make_accelerator(TrainConfig(ddp_comm_hook="bf16"))
    scenario = describe(make_accelerator(TrainConfig(ddp_comm_hook="fp16")))  # a no-op without DDP
    assert scenario["gradient_all_reduce"] is None and "all-reduced" not in format_scenario(scenario)
