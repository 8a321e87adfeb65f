"""The scenario report: what really runs, warnings for requests that cannot be honoured, and an
error when launched processes did not join one group."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from anytrain import TrainConfig, scenario
from anytrain.config import ConfigError
from anytrain.scenario import LaunchError, describe, format_scenario, glibc_mallopt, make_accelerator
from anytrain.trainer import train


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


MALLOC_PROBE = """
import ctypes, json, sys
from anytrain import TrainConfig
from anytrain.scenario import set_host_malloc

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]

def mapped(size):
    before = libc.mallinfo2().hblks  # the blocks mapped apart, alive now
    block = libc.malloc(size)
    after = libc.mallinfo2().hblks
    libc.free(block)
    return after == before + 1

libc.free(libc.malloc(16 << 20))  # a large block freed: glibc's own threshold rises to its size
said = set_host_malloc(TrainConfig(mmap_threshold_kb=int(sys.argv[1])))
print(json.dumps({"large": mapped(6 << 20), "small": mapped(256 << 10), "said": said}))
"""


@pytest.mark.launch
@pytest.mark.skipif(glibc_mallopt() is None, reason="glibc's malloc only")
def test_the_mmap_threshold_maps_large_blocks_apart_once_set():
    """In processes of their own (the setting lasts the process's life), after a 16 MB block was freed: with glibc's
    own threshold (risen to 16 MB) a new 6 MB block grows the heap (the control); with 512 KB set it is mapped apart,
    and returns to the system when freed, while a 256 KB block still comes from the heap."""

    def probe(kb: int) -> dict:
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        run = [sys.executable, "-c", MALLOC_PROBE, str(kb)]
        done = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    assert probe(0) == {"large": False, "small": False, "said": {"host_mmap_threshold_kb": None}}
    assert probe(512) == {"large": True, "small": False, "said": {"host_mmap_threshold_kb": 512}}


def test_a_run_sets_the_mmap_threshold_first_and_says_so(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(scenario, "glibc_mallopt", lambda: lambda option, value: calls.append((option, value)) or 1)
    cfg = dict(epochs=1, progress=False, plot=False, hidden_sizes=[16], output_dir=str(tmp_path / "run"))
    summary = train(TrainConfig(**cfg, mmap_threshold_kb=512))
    assert calls == [(scenario.M_MMAP_THRESHOLD, 512 * 1024)]  # once, glibc's M_MMAP_THRESHOLD in bytes
    assert "host blocks of 512 KB or more mapped apart (--mmap-threshold-kb)" in capsys.readouterr().out
    assert summary["scenario"]["host_mmap_threshold_kb"] == 512
    calls.clear()
    assert scenario.set_host_malloc(TrainConfig(**cfg)) == {"host_mmap_threshold_kb": None} and calls == []


def test_an_mmap_threshold_without_glibc_or_over_its_limit_is_one_clear_error(monkeypatch):
    with pytest.raises(ConfigError, match=r"--mmap-threshold-kb 40000: glibc takes at most 32768 \(32 MB\)"):
        scenario.set_host_malloc(TrainConfig(mmap_threshold_kb=40000))
    monkeypatch.setattr(scenario, "glibc_mallopt", lambda: None)  # macOS, musl
    with pytest.raises(ConfigError, match=r"--mmap-threshold-kb 512: needs glibc's malloc \(Linux\)"):
        scenario.set_host_malloc(TrainConfig(mmap_threshold_kb=512))
