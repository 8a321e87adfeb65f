"""GPU throughput by precision: fp32 vs bf16 vs fp16 samples/s, peak memory and model FLOPs utilisation
(docs/benchmarks.md, "GPU"); precisions interleaved over rounds, the best counts. Without CUDA it says so, exits 0.
"""

import statistics
import time

import bench_render
import toolkit
import torch
from torch import nn

PRECISIONS, CLASSES = ["fp32", "bf16", "fp16"], 1000


def run(precision: str, hidden: list[int], features: int, classes: int, batch: int, steps: int, device) -> dict:
    torch.manual_seed(0)
    model = toolkit.mlp(hidden, features, classes).to(device)
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
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    peak = torch.cuda.max_memory_allocated(device)
    figures = {"samples_per_s": batch * steps / seconds, "peak_memory_bytes": peak}
    return {**figures, "flops_per_sample": 6 * weights, "weights": weights}


def main(argv=None) -> None:
    p = toolkit.parser(__doc__, json=None, rounds=3)
    p.add_argument("--width", type=int, default=8192, help="hidden width (and input features)")
    p.add_argument("--layers", type=int, default=8, help="hidden layers")
    p.add_argument("--batch-size", type=int, default=4096)
    p.add_argument("--steps", type=int, default=20, help="timed steps per precision per round")
    peaks = "dense peaks of this GPU, if not in the built-in table"
    p.add_argument("--peak-tflops", type=float, nargs=2, metavar=("FP32", "BF16"), help=peaks)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        msg = "gpu_bench: no CUDA device here; nothing measured (run it on a CUDA machine)"
        print(msg)
        if args.json:
            toolkit.write_json(args.json, {"skipped": msg}, indent=None)
        return
    device = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(device)
    peak = tuple(args.peak_tflops) if args.peak_tflops else toolkit.gpu_peak(name)
    hidden = [args.width] * args.layers

    def timed(pr: str, r: int) -> dict:
        x = run(pr, hidden, args.width, CLASSES, args.batch_size, args.steps, device)
        torch.cuda.empty_cache()  # the last precision's model and optimizer state are gone: start the next clean
        print(f"round {r + 1}: {pr:5s} {x['samples_per_s']:12,.0f} samples/s", flush=True)
        return x

    rows = figures(toolkit.interleave(PRECISIONS, args.rounds, timed), peak)
    workload = f"MLP {args.width}-" + "-".join([str(args.width)] * args.layers) + f"-{CLASSES}, batch {args.batch_size}"
    peak_note = f"dense fp32 {peak[0]} / bf16-fp16 {peak[1]} TFLOP/s" if peak else "unknown GPU: pass --peak-tflops"
    result = {"device": name, "workload": f"{workload}, AdamW, clip 1.0", "peak_note": peak_note}
    result.update(torch=torch.__version__, rows=rows, bf16_over_fp32=rows[1]["vs_fp32"])
    print("\n".join(bench_render.gpu_table(result)[3:]))  # the table of docs/benchmarks.md's item 5
    if args.json:
        toolkit.write_json(args.json, result)


def figures(runs: dict[str, list[dict]], peak: tuple[float, float] | None) -> list[dict]:
    """One row per precision from its best round: samples/s, against fp32, memory, TFLOP/s, MFU."""
    rows, fp32 = [], max(x["samples_per_s"] for x in runs["fp32"])
    for pr, done in runs.items():
        top = max(done, key=lambda x: x["samples_per_s"])
        tflops = top["samples_per_s"] * top["flops_per_sample"] / 1e12
        pk = None if peak is None else (peak[0] if pr == "fp32" else peak[1])
        rows.append({"precision": pr, "samples_per_s": top["samples_per_s"], "vs_fp32": top["samples_per_s"] / fp32,
                     "peak_memory_gib": top["peak_memory_bytes"] / 2**30, "tflops": tflops, "peak_tflops": pk,
                     "mfu": tflops / pk if pk else None, "rounds": [x["samples_per_s"] for x in done],
                     "median_samples_per_s": statistics.median(x["samples_per_s"] for x in done)})  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
