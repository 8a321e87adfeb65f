"""How well a run used its hardware: the model's training FLOPs per token or per sample, the FLOP rate the run
achieved, and its model FLOPs utilisation (MFU), the rate over the devices' peak (summary.json and the last line).

Training FLOPs (the forward and backward matrix products; the PaLM paper's appendix B, as nanoGPT and torchtitan
count them):
    a transformer (the registry's GPT, a transformers model)  per token: 6 x its parameters without the embeddings
        (2 FLOPs per weight forward, 4 backward) + 12 x layers x width x context (attention's scores and their
        weighting of the values, forward and backward), the context the run's block or --max-length
    any other model (an MLP, a CNN, your own)  per sample: 3 x a counted forward pass of one sample
        (torch.utils.flop_counter on the data's example inputs; the backward costs twice the forward)
LoRA and frozen weights are counted as trained (the convention: MFU is the model's FLOPs, not the optimizer's).

Peak: a GPU's dense peak from a table by its name and the run's precision (fp32 without TF32, or bf16/fp16 tensor
cores); a CPU's measured with short square matrix products in the run's precision on the process's threads (as
large as take ~25 ms each, up to 1,024); or --peak-tflops. MFU = achieved / (peak x processes). A CPU's peak is
measured once per process, precision and thread count (a process that trains many runs, a notebook or the tests,
measures it once).
"""

from __future__ import annotations

import functools
import time
from typing import Any, cast

import torch
from torch import nn

# Dense (no sparsity) peak TFLOP/s by device name fragment, most specific first: (fp32 without TF32, bf16/fp16
# tensor cores). Vendor data sheets.
GPU_PEAKS = {
    "H200": (67.0, 989.0), "H100 SXM": (67.0, 989.0), "H100 80GB HBM3": (67.0, 989.0), "H100 NVL": (60.0, 835.0),
    "H100 PCIe": (51.0, 756.0), "H100": (67.0, 989.0), "A100": (19.5, 312.0), "L40S": (91.6, 362.0),
    "L4": (30.3, 121.0), "A10G": (31.2, 70.0), "A10": (31.2, 125.0), "V100": (15.7, 125.0), "T4": (8.1, 65.0),
    "RTX 4090": (82.6, 165.0), "RTX 3090": (35.6, 71.0),
}  # fmt: skip


def gpu_peak(name: str) -> tuple[float, float] | None:
    """(fp32, bf16) dense peak TFLOP/s of the GPU called `name`, None when it is not in the table."""
    return next((peak for key, peak in GPU_PEAKS.items() if key.lower() in name.lower()), None)


def transformer_flops(parameters: int, layers: int, width: int, context: int) -> int:
    """Training FLOPs per token of a transformer: 6 N + 12 L d T (N without the embeddings)."""
    return 6 * parameters + 12 * layers * width * context


def embedding_parameters(model: nn.Module) -> int:
    """The parameters of the embedding tables (a lookup costs no matrix product), each table counted once."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if isinstance(module, nn.Embedding) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            total += module.weight.numel()
    return total


def per_token(model: nn.Module, context: int) -> tuple[int, str] | None:
    """(FLOPs per token, how) for a transformer: the registry's GPT (its own count) or a transformers model (its
    config's layers and width); None for any other model."""
    own = getattr(model, "flops_per_token", None)
    if callable(own):
        return int(cast(Any, own)()), "6N + 12 L d T (gpt.py)"
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    width = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if not layers or not width:
        return None
    parameters = sum(p.numel() for p in model.parameters()) - embedding_parameters(model)
    if getattr(model, "get_output_embeddings", None) and (head := cast(Any, model).get_output_embeddings()) is not None:
        if id(head.weight) in {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}:
            parameters += head.weight.numel()  # a tied output layer is a matrix product all the same
    return transformer_flops(parameters, int(layers), int(width), context), "6N + 12 L d T (the model's config)"


def per_sample(model: nn.Module, inputs) -> tuple[int, str]:
    """(FLOPs per sample, how): 3 x one sample's forward pass, counted (eval mode, no gradients)."""
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    model.eval()
    counter = FlopCounterMode(display=False)
    try:
        with torch.no_grad(), counter:
            model(**inputs) if isinstance(inputs, dict) else model(inputs)
    finally:
        model.train(was_training)
    rows = len(next(iter(inputs.values()))) if isinstance(inputs, dict) else len(inputs)
    return 3 * counter.get_total_flops() // rows, "3 x a counted forward pass"


def product_seconds(a: torch.Tensor) -> float:
    start = time.perf_counter()
    torch.mm(a, a)
    return time.perf_counter() - start


@functools.cache
def cpu_peak(dtype: torch.dtype, threads: int, seconds: float = 0.2, largest: int = 1024) -> tuple[float, int]:
    """(FLOP/s, size): the best of ~`seconds` of square matrix products in `dtype` on `threads` threads (this
    process's now), of the largest size up to `largest` whose one product takes ~25 ms at most (a CPU without native
    bf16, AVX2, takes 3 s for one 1,024 product in bf16, and is no faster at that size: 0.7 against 1.9 GFLOP/s at
    256); cached: the same CPU, precision and threads measure the same peak."""
    size, a = 128, torch.full((128, 128), 0.5, dtype=dtype)
    took = min(product_seconds(a), product_seconds(a))  # the first product warms up
    while size < largest and took * 8 <= 0.025:  # the next size does 8 times the work
        size, a = size * 2, torch.full((size * 2, size * 2), 0.5, dtype=dtype)
        took = min(product_seconds(a), product_seconds(a))
    best, spent = took, 0.0
    while spent < seconds:
        took = product_seconds(a)
        best, spent = min(best, took), spent + took
    return 2 * size**3 / best, size


def peak_flops(device: torch.device, precision: str, given_tflops: float) -> tuple[float | None, str]:
    """One device's peak FLOP/s for the run's precision, and where it comes from (None: unknown)."""
    if given_tflops > 0:
        return given_tflops * 1e12, "--peak-tflops"
    half = precision in ("bf16", "fp16")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peaks = gpu_peak(name)
        if peaks is None:
            return None, f"{name} is not in the table of GPU peaks: give --peak-tflops"
        return peaks[1 if half else 0] * 1e12, f"{name}, dense {'bf16/fp16' if half else 'fp32'} (data sheet)"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    threads = torch.get_num_threads()
    peak, size = cpu_peak(dtype, threads)
    return peak, f"measured: a {size} x {size} {dtype} matrix product on {threads} thread(s)"


def utilisation(model: nn.Module, shape, context: float, rates: dict, processes: int, device, precision: str,
                given_tflops: float) -> dict:  # fmt: skip
    """summary.json's figures: FLOPs per token (a transformer whose run counts tokens) or per sample, the FLOP rate
    achieved over the whole run (every process's), the peak and the MFU."""
    token = per_token(model, max(1, round(context))) if rates.get("tokens_per_s") else None
    if token is not None:
        (flops, how), unit, rate = token, "token", rates["tokens_per_s"]
    else:
        inputs = shape.example_inputs(1)
        on_device = {k: v.to(device) for k, v in inputs.items()} if isinstance(inputs, dict) else inputs.to(device)
        (flops, how), unit, rate = per_sample(model, on_device), "sample", rates.get("samples_per_s")
    achieved = flops * rate if rate else None
    peak, source = peak_flops(device, precision, given_tflops)
    mfu = achieved / (peak * processes) if achieved and peak else None
    return {
        f"flops_per_{unit}": flops, "flops_counted_as": how, "achieved_tflops": achieved and achieved / 1e12,
        "peak_tflops": peak and peak / 1e12, "peak_from": source, "mfu": mfu,
    }  # fmt: skip


def said(figures: dict) -> str:
    """The last line's words: ", MFU 12.3 % (0.41 of 3.3 TFLOP/s)", or nothing where unknown."""
    if figures.get("mfu") is None:
        return ""
    total = figures["achieved_tflops"] / figures["mfu"]  # every process's peak
    return f", MFU {100 * figures['mfu']:.1f} % ({figures['achieved_tflops']:.3g} of {total:.3g} TFLOP/s)"
