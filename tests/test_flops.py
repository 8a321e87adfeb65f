"""The model's training FLOPs, the FLOP rate and MFU (src/anytrain/flops.py, issue 41), against hand counts: the
default MLP per sample (3 x its forward's multiply-adds x 2), the registry's GPT and a transformers Llama per token
(6 x the weights outside the embeddings + 12 x layers x width x context); the peaks (the GPU table, a CPU's
measured product, --peak-tflops); and a run's summary.json and last line carry them, the MFU being the achieved
rate over the peak."""

from __future__ import annotations

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


def test_peaks_come_from_the_option_the_gpu_table_or_a_measured_cpu_product():
    assert flops.peak_flops(torch.device("cpu"), "fp32", 2.5) == (2.5e12, "--peak-tflops")
    assert flops.gpu_peak("NVIDIA H200") == (67.0, 989.0) and flops.gpu_peak("Some GPU") is None
    measured, said = flops.peak_flops(torch.device("cpu"), "fp32", 0.0)
    assert 1e8 < measured < 1e14 and re.match(r"measured: a (\d+) x \1 torch.float32 matrix product", said), said


@pytest.mark.parametrize(("seconds_at_256", "size"), [(0.018, 256), (0.0002, 1024), (0.003, 512)])
def test_a_cpus_peak_is_measured_on_the_largest_product_that_takes_25_ms(monkeypatch, seconds_at_256, size):
    """On AVX2 one 1,024 product in bf16 takes 3 s (256: 18 ms); in fp32 66 ms (256: 2 ms). A product's time grows
    with the cube of its size: the measurement stops where the next size would take more than 25 ms."""
    sizes = []
    monkeypatch.setattr(
        flops, "product_seconds", lambda a: sizes.append(len(a)) or seconds_at_256 * (len(a) / 256) ** 3
    )
    peak, measured_on = flops.cpu_peak.__wrapped__(torch.bfloat16, 1)
    assert measured_on == size and max(sizes) == size
    assert peak == pytest.approx(2 * size**3 / (seconds_at_256 * (size / 256) ** 3))


def test_a_cpus_peak_is_measured_once_per_process_precision_and_thread_count(monkeypatch):
    flops.cpu_peak.cache_clear()
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
