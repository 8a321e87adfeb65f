"""Time one training step (forward, loss, backward, SGD step) of a wide MLP: the whole model on one
device vs the naive two-stage split vs the pipelined split over a sweep of micro-batch counts.

Variants interleaved in rounds; model_parallel.json, .md and .png under --out (docs/model_parallel.md, "Benchmark").
"""

import argparse
import copy
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import toolkit
import torch
from torch import nn

# Sizes per device kind: a few seconds per variant on a 2-core CPU; big enough to keep a GPU busy.
PRESETS = {
    # On the CPU both "devices" are the same cores; one thread keeps the figures steady on a shared machine.
    "cpu": {"width": 1024, "layers": 8, "batch_size": 256, "steps": 2, "rounds": 7, "threads": 1},
    "cuda": {"width": 8192, "layers": 8, "batch_size": 1024, "steps": 10, "rounds": 5, "threads": 0},
}


def parse_args(argv=None) -> argparse.Namespace:
    def per_device(name: str) -> str:
        return "; default per device: " + ", ".join(f"{kind} {preset[name]}" for kind, preset in PRESETS.items())

    p = toolkit.parser(__doc__, out="bench_out/model_parallel")
    p.add_argument("--device", choices=("auto", "cpu"), default="auto", help="auto: the GPUs if any, else the CPU")
    p.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="micro-batch counts")
    p.add_argument("--width", type=int, help="hidden width (and input features) of the MLP" + per_device("width"))
    p.add_argument("--layers", type=int, help="hidden layers" + per_device("layers"))
    p.add_argument("--batch-size", type=int, help="samples per step" + per_device("batch_size"))
    p.add_argument("--steps", type=int, help="timed steps per variant per round, after a warm-up" + per_device("steps"))
    p.add_argument("--rounds", type=int, help="rounds (best, median and worst are reported)" + per_device("rounds"))
    p.add_argument("--threads", type=int, help="CPU threads for torch, 0 = torch's default" + per_device("threads"))
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs")
    args = p.parse_args(argv)
    if any(m < 1 for m in args.micro_batches):
        p.error(f"--micro-batches must all be positive, got {args.micro_batches}")
    return args


def synchronize() -> None:
    """Wait for every queued GPU kernel, on every GPU, so the clock measures the work and not its launch."""
    for index in range(torch.cuda.device_count()):
        torch.cuda.synchronize(index)


def step_seconds(model: nn.Module, optimizer, inputs, targets, steps: int) -> float:
    def step():
        outputs = model(inputs)
        loss = nn.functional.cross_entropy(outputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step()  # warm-up: allocator, kernels, caches
    synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize()
    return (time.perf_counter() - start) / steps


def machine_info(first: torch.device, second: torch.device, why: str) -> dict:
    import accelerate

    info = {"date": datetime.date.today().isoformat(), "python": platform.python_version(), "torch": torch.__version__}
    info.update(accelerate=accelerate.__version__, platform=platform.platform(), processor=toolkit.cpu_name())
    info.update(cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads())
    info.update(stage_devices=[str(first), str(second)], placement_note=why)
    if first.type == "cuda":
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["cuda"] = torch.version.cuda
    return info


def main(argv=None) -> None:
    args = parse_args(argv)
    first, second, why = toolkit.stage_devices(use_cpu=True if args.device == "cpu" else None)
    for name, value in PRESETS[first.type].items():
        if getattr(args, name) is None:  # the device kind's size where no option gave one
            setattr(args, name, value)
    if args.threads:
        torch.set_num_threads(args.threads)
    if max(args.micro_batches) > args.batch_size:
        sys.exit(f"error: --micro-batches {max(args.micro_batches)} is more than a batch ({args.batch_size} samples)")
    torch.manual_seed(args.seed)
    base = toolkit.mlp([args.width] * args.layers, args.width, 10)  # Standardize, (Linear, ReLU) x layers, Linear
    devices = (first, second) if args.device == "cpu" else None  # None: the module's own choice, with its note
    variants = {"single": copy.deepcopy(base).to(first), "naive": toolkit.two_stages(copy.deepcopy(base), devices)}
    for m in args.micro_batches:
        variants[f"pipelined x{m}"] = toolkit.two_stages(copy.deepcopy(base), devices, micro_batches=m)
    info, params = machine_info(first, second, why), sum(p.numel() for p in base.parameters())
    print(f"model: MLP {args.width} x {args.layers} hidden layers, {params:,} params, batch {args.batch_size}")
    print(variants["naive"].placement())
    threads = f"torch {info['torch']}, {info['torch_threads']} CPU thread(s)"
    print(f"timing {len(variants)} variants x {args.rounds} rounds x {args.steps} steps; {threads}")
    times = timings(variants, args, first, second)
    rows = [row(name, variants[name], t, min(times["single"]), args.batch_size) for name, t in times.items()]
    config = {k: getattr(args, k) for k in "width layers batch_size steps rounds threads micro_batches seed".split()}
    result = {"machine": info, "config": config, "params": params, "placement": variants["naive"].placement()}
    out, table = toolkit.out_dir(args.out), format_table(rows)
    print(f"\n{table}")
    toolkit.write_json(out / "model_parallel.json", {**result, "rows": rows}, indent=2)
    (out / "model_parallel.md").write_text(table + "\n")
    plot({**result, "rows": rows}, out / "model_parallel.png")
    print(f"\nwrote {out / 'model_parallel.json'}, {out / 'model_parallel.md'}, {out / 'model_parallel.png'}")


def timings(variants: dict[str, nn.Module], args, first: torch.device, second: torch.device) -> dict[str, list[float]]:
    """Seconds per step of each variant in each round, the order rotating every round."""
    optimizers = {name: torch.optim.SGD(model.parameters(), lr=1e-3) for name, model in variants.items()}
    inputs = torch.randn(args.batch_size, args.width, device=first)
    targets = torch.randint(10, (args.batch_size,), device=second)
    times: dict[str, list[float]] = {name: [] for name in variants}
    started = time.perf_counter()
    for r in range(args.rounds):
        for name in toolkit.rotated(list(variants), r):
            times[name].append(step_seconds(variants[name], optimizers[name], inputs, targets, args.steps))
        print(f"  round {r + 1}/{args.rounds} done ({time.perf_counter() - started:.0f}s)")
    return times


def row(name: str, model: nn.Module, times: list[float], single: float, batch_size: int) -> dict:
    m = getattr(model, "micro_batches", None) if name.startswith("pipelined") else None
    low, extra = divmod(batch_size, m or 1)  # torch.tensor_split's parts: '64', or '36-37' when they differ by one
    return {
        "variant": name,
        "micro_batches": m,
        "micro_batch_size": None if m is None else f"{low}" if extra == 0 else f"{low}-{low + 1}",
        "ms_per_step": min(times) * 1e3,  # best round
        "ms_median": statistics.median(times) * 1e3,
        "ms_max": max(times) * 1e3,
        "time_vs_single": min(times) / single,
        "ms_rounds": [t * 1e3 for t in times],
        # two perfectly balanced stages on two devices, no copy cost: (M + 1) / (2 M) of single
        "ideal_two_devices_vs_single": None if m is None else (m + 1) / (2 * m),
    }


def format_table(rows: list[dict]) -> str:
    lines = ["| variant | micro-batch size | ms / step (best) | median / worst | time vs single | ideal on 2 devices |"]
    lines.append("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        ideal = "" if r["ideal_two_devices_vs_single"] is None else f"{r['ideal_two_devices_vs_single']:.2f}"
        times = f"{r['ms_per_step']:.1f} | {r['ms_median']:.1f} / {r['ms_max']:.1f} | {r['time_vs_single']:.2f}"
        lines.append(f"| {r['variant']} | {r['micro_batch_size'] or 'whole batch'} | {times} | {ideal} |")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    rows = {r["variant"]: r for r in result["rows"]}
    piped = [r for r in result["rows"] if r["micro_batches"] is not None]
    ms = [r["micro_batches"] for r in piped]
    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    ax.plot(ms, [r["ms_per_step"] for r in piped], "o-", label="pipelined (2 stages)")
    ax.axhline(rows["single"]["ms_per_step"], color="k", linestyle="--", label="single device")
    ax.axhline(rows["naive"]["ms_per_step"], color="tab:red", linestyle=":", label="naive split")
    ideal = [rows["single"]["ms_per_step"] * r["ideal_two_devices_vs_single"] for r in piped]
    ax.plot(ms, ideal, color="tab:green", linestyle="-.", label="ideal pipeline on 2 devices")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_xlabel("micro-batches per batch")
    ax.set_ylabel("ms per training step (best round)")
    info, cfg = result["machine"], result["config"]
    where = " + ".join(dict.fromkeys(info["stage_devices"]))
    title = f"MLP {cfg['width']}x{cfg['layers']}, batch {cfg['batch_size']}, stages on {where}\n"
    ax.set_title(
        title + f"torch {info['torch']}, {info.get('gpus', [info['processor']])[0]}, {info['date']}", fontsize=9
    )
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
