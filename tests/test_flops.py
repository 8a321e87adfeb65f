"""The model's training FLOPs, the FLOP rate and MFU (src/anytrain/flops.py, issue 41), against hand counts: the
default MLP per sample (3 x its forward's multiply-adds x 2), the registry's GPT and a transformers Llama per token
(6 x the weights outside the embeddings + 12 x layers x width x context); the peaks (the GPU table, a CPU's
measured products, the fastest of several and kept per machine in cpu_peak.json, --peak-tflops); and a run's
summary.json and last line carry them, the MFU being the achieved rate over the peak."""

from __future__ import annotations

import datetime
import json
import re

import pytest
import torch
from conftest import read_summary, torch_threads
from hfchecks import in_process

from anytrain import flops
from anytrain.config import ModelConfig
from anytrain.gpt import GPT
from anytrain.models import build_mlp
from anytrain.shape import DataShape


def test_the_default_mlp_costs_three_forward_passes_of_its_multiply_adds_per_sample():
    shape = DataShape("tabular", num_features=64, num_classes=10)
    model = build_mlp(ModelConfig(hidden_sizes=[256, 256]), shape)
    multiply_adds = 64 * 256 + 256 * 256 + 256 * 10
    assert flops.per_sample(model, torch.zeros(4, 64)) == (3 * 2 * multiply_adds, "3 x a counted forward pass")


def test_a_transformer_costs_six_per_weight_and_its_attention_per_token():
    gpt = GPT(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=16)
    weights = sum(p.numel() for p in gpt.parameters()) - 32 * 16  # the position table costs no product
    assert flops.per_token(gpt, 999) == (6 * weights + 12 * 2 * 16 * 32, "6N + 12 L d T (gpt.py)")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    llama = transformers.LlamaForCausalLM(config)
    kv = 2 * (64 // 4)  # two key-value heads of 16
    layer = 64 * 64 + 2 * 64 * kv + 64 * 64 + 3 * 64 * 128 + 2 * 64  # q, k and v, o, the MLP, two norms
    outside_embeddings = 2 * layer + 64 + 100 * 64  # + the final norm, + the untied output layer
    counted, how = flops.per_token(llama, 50)
    assert counted == 6 * outside_embeddings + 12 * 2 * 64 * 50 and how == "6N + 12 L d T (the model's config)"


@pytest.fixture(autouse=True)
def fresh_cpu_peak():
    """Each test starts from an empty per-process cache of the CPU's peak, and leaves none behind."""
    flops.cpu_peak.cache_clear()
    yield
    flops.cpu_peak.cache_clear()


@pytest.fixture
def kept(monkeypatch, tmp_path):
    """cpu_peak.json in a folder of the test's own, beside a quiet machine (no other process's work measured), and
    fake products: 24 ms at 1,024 on one thread, 89 GFLOP/s, twice as fast on two (512's 3 ms: the size climbs to
    1,024; 5 take the 0.1 s on one thread, 9 on two). The products
    each call measured are counted in `kept.products`, the file's writes in `kept.writes`."""

    class Kept:
        path = tmp_path / "cache" / "cpu_peak.json"
        products: list[int] = []
        writes = 0

    def write(path, entries):
        Kept.writes += 1
        return real_write(path, entries)

    def seconds(a):
        return 0.024 * (len(a) / 1024) ** 3 / torch.get_num_threads()

    real_write = flops.write_kept
    monkeypatch.setenv("ANYTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(flops, "machine_busy", lambda: None)
    monkeypatch.setattr(flops, "product_seconds", lambda a: Kept.products.append(len(a)) or seconds(a))
    monkeypatch.setattr(flops, "write_kept", write)
    return Kept


def key(threads: int, dtype=torch.float32) -> str:
    return f"{flops.cpu_name()} | {dtype} | {threads} thread(s) | torch {torch.__version__}"


def test_peaks_come_from_the_option_the_gpu_table_or_a_measured_cpu_product(monkeypatch, tmp_path):
    assert flops.peak_flops(torch.device("cpu"), "fp32", 2.5) == (2.5e12, "--peak-tflops")
    assert flops.gpu_peak("NVIDIA H200") == (67.0, 989.0) and flops.gpu_peak("Some GPU") is None
    monkeypatch.setenv("ANYTRAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(flops, "machine_busy", lambda: None)  # a quiet machine: the peak is kept
    measured, said = flops.peak_flops(torch.device("cpu"), "fp32", 0.0)  # really measured
    kept = f"cached {datetime.date.today()} in {tmp_path / 'cpu_peak.json'}"
    said_is = rf"measured: best of (\d+) (\d+)x\2 float32 products on 1 thread\(s\), {re.escape(kept)}"
    assert 1e8 < measured < 1e14 and (match := re.fullmatch(said_is, said)) and int(match[1]) >= 5, said


@pytest.mark.parametrize(
    ("seconds_at_256", "threads", "size"), [(0.018, 1, 256), (0.0002, 1, 1024), (0.003, 1, 512), (0.0008, 1, 512),
                                            (0.0008, 4, 1024)],
)  # fmt: skip
def test_a_cpus_peak_is_measured_on_the_largest_product_that_takes_25_ms(monkeypatch, seconds_at_256, threads, size):
    """On AVX2 one 1,024 product in bf16 takes 3 s (256: 18 ms); in fp32 66 ms (256: 2 ms). A product's time grows
    with the cube of its size: the size stops where the next size's product, judged on one thread, would take more
    than 25 ms on the run's threads (one thread's 51 ms at 1,024 is 13 ms on four). The sizes are tried on one
    thread; 5 timed products then run on the run's threads, after a warm-up on several (the 0.1 s rule aside)."""
    products = []
    monkeypatch.setattr(
        flops, "product_seconds",
        lambda a: products.append((len(a), torch.get_num_threads())) or seconds_at_256 * (len(a) / 256) ** 3,
    )  # fmt: skip
    with torch_threads(threads):
        peak, measured_on, timed, scaled = flops.measure_peak(torch.bfloat16, threads, seconds=0.0)
        assert torch.get_num_threads() == threads  # given back
    tried = [128, 128] + [s for s in (256, 256, 512, 512, 1024, 1024) if s <= size]
    assert products == [(s, 1) for s in tried] + [(size, threads)] * (5 + (threads > 1))
    assert measured_on == size and timed == 5 and scaled == (threads == 1)  # (4 threads as fast as one: not)
    assert peak == pytest.approx(2 * size**3 / (seconds_at_256 * (size / 256) ** 3))


def test_a_cpus_peak_is_the_fastest_of_several_products(monkeypatch):
    """A product slowed by another process (a slow outlier, a slow warm-up) does not lower the peak: it is the
    fastest of 5 timed products on the run's threads, more where 5 take under 0.1 s; and never below one thread's
    rate (its fastest of two at that size), however slow every product on several threads was (said: they did not
    scale)."""
    cases = (
        ([0.010, 0.200, 0.008, 0.009, 0.030], 0.008, True),
        ([0.5] * 5, 0.04, False),  # one thread's
        ([0.016, 0.015, 0.014, 0.015, 0.015, 0.015, 0.015], 0.014, True),  # 5 take 75 ms, 7 take 105
    )
    for timed, fastest, scaled in cases:
        times = iter([0.05, 0.04, 1.0, *timed])  # one thread's two at 1,024, the warm-up on two, those timed
        monkeypatch.setattr(flops, "product_seconds", lambda a, times=times: next(times) if len(a) == 1024 else 1e-6)
        peak = (pytest.approx(2 * 1024**3 / fastest), 1024, len(timed), scaled)
        assert flops.measure_peak(torch.float32, 2) == peak
        assert next(times, None) is None  # every one of them was timed


def test_a_cpus_peak_is_kept_per_machine_precision_and_thread_count(kept):
    """The first call measures and writes cpu_peak.json; a later one (a fresh process: its own cache empty) reads
    it back and measures nothing; another thread count, or precision, is measured anew and added."""
    today = datetime.date.today().isoformat()
    peak, said = flops.peak_flops(torch.device("cpu"), "fp32", 0.0)
    assert peak == pytest.approx(2 * 1024**3 / 0.024) and kept.products[-5:] == [1024] * 5 and kept.writes == 1
    assert said == f"measured: best of 5 1024x1024 float32 products on 1 thread(s), cached {today} in {kept.path}"
    entry = {"flops": peak, "size": 1024, "products": 5, "day": today}
    assert json.loads(kept.path.read_text()) == {key(1): entry}
    flops.cpu_peak.cache_clear()  # a later process
    measured = len(kept.products)
    assert flops.peak_flops(torch.device("cpu"), "fp32", 0.0) == (peak, said)
    assert len(kept.products) == measured and kept.writes == 1  # read back: nothing measured nor written
    with torch_threads(2):
        said_on_two = flops.peak_flops(torch.device("cpu"), "fp32", 0.0)[1]
    assert said_on_two.endswith(f"on 2 thread(s), cached {today} in {kept.path}")
    flops.peak_flops(torch.device("cpu"), "bf16", 0.0)
    assert (
        len(kept.products) == measured + 8 + 1 + 9 + 8 + 5 and kept.writes == 3
    )  # measured anew: 8 sizing, (warm-up,) timed
    on_two = {**entry, "flops": 2 * peak, "products": 9}
    assert json.loads(kept.path.read_text()) == {key(1): entry, key(2): on_two, key(1, torch.bfloat16): entry}


def test_the_cache_is_in_the_home_folder_unless_told_otherwise(kept, monkeypatch, tmp_path):
    """~/.cache/anytrain/cpu_peak.json (peak_from says so, the home folder as ~), else $XDG_CACHE_HOME/anytrain,
    else $ANYTRAIN_CACHE_DIR: the last first."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("ANYTRAIN_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    said = flops.peak_flops(torch.device("cpu"), "fp32", 0.0)[1]
    assert said.endswith(f"cached {datetime.date.today()} in ~/.cache/anytrain/cpu_peak.json"), said
    assert (tmp_path / ".cache" / "anytrain" / "cpu_peak.json").is_file()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert flops.cache_file() == tmp_path / "xdg" / "anytrain" / "cpu_peak.json"
    monkeypatch.setenv("ANYTRAIN_CACHE_DIR", str(tmp_path / "own"))
    assert flops.cache_file() == tmp_path / "own" / "cpu_peak.json"


CORRUPT = {
    "not JSON": lambda key: "{not json",
    "empty": lambda key: "",
    "a list": lambda key: "[1, 2]",
    "no entry": lambda key: json.dumps({key: -1.0}),
    "no rate": lambda key: json.dumps({key: {"flops": "fast", "size": 1024, "products": 5, "day": "2026-11-26"}}),
}


@pytest.mark.parametrize("corrupt", CORRUPT.values(), ids=CORRUPT.keys())
def test_a_corrupt_cache_file_is_measured_anew_and_rewritten(kept, corrupt):
    kept.path.parent.mkdir()
    kept.path.write_text(corrupt(key(1)))
    peak, said = flops.peak_flops(torch.device("cpu"), "fp32", 0.0)
    assert len(kept.products) == 13 and kept.writes == 1 and peak == pytest.approx(2 * 1024**3 / 0.024)
    assert json.loads(kept.path.read_text())[key(1)]["flops"] == peak and said.endswith(f"in {kept.path}")
    assert [p.name for p in kept.path.parent.iterdir()] == ["cpu_peak.json"]  # no temporary file left


def test_an_unwritable_cache_is_measured_and_says_so(kept, tmp_path, monkeypatch):
    blocked = tmp_path / "a_file"  # the cache folder cannot be made: a file is in the way
    blocked.write_text("")
    monkeypatch.setenv("ANYTRAIN_CACHE_DIR", str(blocked / "cache"))
    peak, said = flops.peak_flops(torch.device("cpu"), "fp32", 0.0)
    assert peak == pytest.approx(2 * 1024**3 / 0.024) and len(kept.products) == 13 and blocked.read_text() == ""
    assert said.endswith(f"on 1 thread(s), not cached: cannot write {blocked}/cache/cpu_peak.json (Not a directory)")


def test_a_peak_measured_beside_other_work_is_not_kept(kept, monkeypatch):
    """Other processes busy on more cores than the run leaves free (half a core's slack), or several threads no
    faster than one: measured, said, not kept, so that the next run measures anew."""
    assert not flops.disturbed(None, 2) and not flops.disturbed(0.4, 2, cores=2) and flops.disturbed(0.6, 2, cores=2)
    assert not flops.disturbed(1.4, 1, cores=2) and flops.disturbed(1.6, 1, cores=2)
    assert not flops.disturbed(14.4, 2, cores=16) and flops.disturbed(14.6, 2, cores=16)
    for run in (1, 2):
        readings = iter([1000.0, 1000.0 + 1e6])  # the machine's busy CPU seconds before and after: a million
        monkeypatch.setattr(flops, "machine_busy", lambda readings=readings: next(readings))
        flops.cpu_peak.cache_clear()  # the next run
        said = flops.peak_flops(torch.device("cpu"), "fp32", 0.0)[1]
        assert re.search(r"on 1 thread\(s\), not cached: other processes kept \d+\.\d cores busy meanwhile$", said)
        assert len(kept.products) == 13 * run and not kept.path.exists()
    monkeypatch.setattr(flops, "machine_busy", lambda: 1000.0)  # quiet
    monkeypatch.setattr(flops, "product_seconds", lambda a: 0.024 * (len(a) / 1024) ** 3)  # as fast on two threads
    with torch_threads(2):
        peak, said = flops.peak_flops(torch.device("cpu"), "fp32", 0.0)
    assert said.endswith("on 2 thread(s), not cached: 2 threads were no faster than one (other work meanwhile?)")
    assert peak == pytest.approx(2 * 1024**3 / 0.024) and not kept.path.exists()
    flops.cpu_peak.cache_clear()
    assert flops.peak_flops(torch.device("cpu"), "fp32", 0.0)[1].endswith(f"in {kept.path}") and kept.path.exists()


def test_a_cpus_peak_is_measured_once_per_process_precision_and_thread_count(monkeypatch, tmp_path):
    monkeypatch.setenv("ANYTRAIN_CACHE_DIR", str(tmp_path))
    products = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: products.append(a.dtype) or real_mm(a, b))
    first, _ = flops.peak_flops(torch.device("cpu"), "fp32", 0.0)
    measured = len(products)
    assert measured >= 2 and flops.peak_flops(torch.device("cpu"), "fp32", 0.0)[0] == first
    assert len(products) == measured  # the second run of the process measured nothing
    with torch_threads(2):
        flops.peak_flops(torch.device("cpu"), "fp32", 0.0)
    assert len(products) > measured  # another thread count is measured anew


def test_a_runs_summary_and_last_line_say_its_mfu(tmp_path, capsys):
    summary = in_process(tmp_path / "run", "--epochs", "1", "--hidden-sizes", "32")
    per_sample = 3 * 2 * (64 * 32 + 32 * 10)
    assert summary["flops_per_sample"] == per_sample
    assert summary["achieved_tflops"] == pytest.approx(per_sample * summary["samples_per_s"] / 1e12)
    assert summary["mfu"] == pytest.approx(summary["achieved_tflops"] / summary["peak_tflops"])
    assert 0 < summary["mfu"] < 1 and summary["peak_from"].startswith("measured")
    assert f"MFU {100 * summary['mfu']:.1f} %" in capsys.readouterr().out
    assert read_summary(tmp_path / "run")["mfu"] == summary["mfu"]
