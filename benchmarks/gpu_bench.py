"""GPU throughput by precision: fp32 vs bf16 vs fp16 samples/s, peak memory and model FLOPs utilisation.

    python benchmarks/gpu_bench.py [--json out.json] [--width 8192 --layers 8 --batch-size 4096]

The workload is anytrain's own MLP (anytrain.models.build_model) made wide enough to fill a GPU,
trained on synthetic data already on the device (so the figure is the GPU, not the data path),
with the trainer's recipe: AdamW, gradient clipping, autocast under bf16/fp16 (fp16 with dynamic
loss scaling, as accelerate does it). Precisions are interleaved over rounds; the best round counts.

MFU = model FLOPs per second / the GPU's dense peak for that precision. Model FLOPs per sample are
6 x (weights of the Linear layers) (2 forward + 4 backward multiply-adds per weight); the peak is
looked up by device name (--peak-tflops overrides). fp32 runs true fp32 (TF32 off, torch's default
for matmuls), so its peak is the fp32 peak. Without CUDA the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch
from torch import nn

from anytrain.config import TrainConfig
from anytrain.models import build_model

# Dense (no sparsity) peak TFLOP/s: (fp32 without TF32, bf16/fp16 tensor cores). Vendor data sheets.
PEAKS = {
    "H200": (67.0, 989.0),
    "H100 SXM": (67.0, 989.0),
    "H100 80GB HBM3": (67.0, 989.0),
    "H100 NVL": (60.0, 835.0),
    "H100 PCIe": (51.0, 756.0),
    "H100": (67.0, 989.0),
    "A100": (19.5, 312.0),
    "L40S": (91.6, 362.0),
    "L4": (30.3, 121.0),
    "A10G": (31.2, 70.0),
    "A10": (31.2, 125.0),
    "V100": (15.7, 125.0),
    "T4": (8.1, 65.0),
    "RTX 4090": (82.6, 165.0),
    "RTX 3090": (35.6, 71.0),
}


def peak_for(name: str) -> tuple[float, float] | None:
    for key, peak in PEAKS.items():  # most specific first
        if key.lower() in name.lower():
            return peak
    return None


def linear_weights(model: nn.Module) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def run(precision: str, cfg: TrainConfig, features: int, classes: int, batch: int, steps: int, device) -> dict:
    torch.manual_seed(0)
    model = build_model(cfg, features, classes).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    inputs = torch.randn(batch, features, device=device)
    targets = torch.randint(classes, (batch,), device=device)
    criterion = nn.CrossEntropyLoss()

    def step():
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            loss = criterion(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):  # warm-up: cuBLAS heuristics, allocator, optimizer state
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device)
    weights = linear_weights(model)
    return {"samples_per_s": batch * steps / seconds, "peak_memory_bytes": peak, "flops_per_sample": 6 * weights, "weights": weights}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--width", type=int, default=8192, help="hidden width (and input features)")
    p.add_argument("--layers", type=int, default=8, help="hidden layers")
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--steps", type=int, default=20, help="timed steps per precision per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, nargs=2, metavar=("FP32", "BF16"), help="dense peaks of this GPU, if not in the built-in table")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        msg = "gpu_bench: no CUDA device here; nothing measured (run it on a CUDA machine)"
        print(msg)
        if args.json:
            Path(args.json).write_text(json.dumps({"skipped": msg}))
        return
    device = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(device)
    peak = tuple(args.peak_tflops) if args.peak_tflops else peak_for(name)
    cfg = TrainConfig(hidden_sizes=[args.width] * args.layers, dropout=0.0)
    classes = 1000
    precisions = ["fp32", "bf16", "fp16"]
    runs = {pr: [] for pr in precisions}
    for r in range(args.rounds):
        for pr in precisions[r % 3:] + precisions[: r % 3]:
            runs[pr].append(run(pr, cfg, args.width, classes, args.batch_size, args.steps, device))
            torch.cuda.empty_cache()  # the last precision's model and optimizer state are gone: start the next one clean
            print(f"round {r + 1}: {pr:5s} {runs[pr][-1]['samples_per_s']:12,.0f} samples/s", flush=True)
    rows = []
    fp32 = max(x["samples_per_s"] for x in runs["fp32"])
    for pr in precisions:
        bestrun = max(runs[pr], key=lambda x: x["samples_per_s"])
        tflops = bestrun["samples_per_s"] * bestrun["flops_per_sample"] / 1e12
        pk = None if peak is None else (peak[0] if pr == "fp32" else peak[1])
        rows.append({"precision": pr, "samples_per_s": bestrun["samples_per_s"], "vs_fp32": bestrun["samples_per_s"] / fp32,
                     "peak_memory_gib": bestrun["peak_memory_bytes"] / 2**30, "tflops": tflops, "peak_tflops": pk,
                     "mfu": tflops / pk if pk else None, "rounds": [x["samples_per_s"] for x in runs[pr]],
                     "median_samples_per_s": statistics.median(x["samples_per_s"] for x in runs[pr])})
    result = {
        "device": name,
        "workload": f"MLP {args.width}-" + "-".join([str(args.width)] * args.layers) + f"-{classes}, batch {args.batch_size}, AdamW, clip 1.0",
        "peak_note": f"dense fp32 {peak[0]} / bf16-fp16 {peak[1]} TFLOP/s" if peak else "unknown GPU: pass --peak-tflops",
        "torch": torch.__version__,
        "rows": rows,
        "bf16_over_fp32": rows[1]["vs_fp32"],
    }
    print(f"{'precision':9s} {'samples/s':>12s} {'vs fp32':>8s} {'peak GiB':>9s} {'TFLOP/s':>8s} {'MFU':>6s}")
    for x in rows:
        mfu = f"{100 * x['mfu']:.0f}%" if x["mfu"] is not None else "n/a"
        print(f"{x['precision']:9s} {x['samples_per_s']:12,.0f} {x['vs_fp32']:7.2f}x {x['peak_memory_gib']:9.1f} {x['tflops']:8.1f} {mfu:>6s}")
    print(f"device {name}; {result['workload']}; peak {result['peak_note']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
