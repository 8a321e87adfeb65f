"""nanoGPT's GPU recipe for Tiny Shakespeare through anytrain on a CUDA machine: validation loss,
tokens/s and MFU, for bf16 eager and bf16 + torch.compile (and optionally nanoGPT's own train.py).

    python benchmarks/lm_gpu.py                       # both variants, the full 5000-step recipe
    python benchmarks/lm_gpu.py --max-steps 500       # a quick look (the schedule is shortened too)

MFU (model FLOPs utilisation) = tokens/s x FLOPs per token / the GPU's peak dense bf16 FLOP/s, with
FLOPs per token = 6 N + 12 n_layer n_embd block_size (N = parameters without the position
embedding): the matmul FLOPs of the forward and backward pass, attention scores included
(PaLM's appendix B; nanoGPT's estimate_mfu uses the same formula). The rate is the steady state:
the median of the logged tokens/s after the first log window (compilation, warm-up).

Goal from the issue: validation loss <= 1.47 (nanoGPT: best 1.4697 on one A100).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Peak dense bf16 tensor-core FLOP/s by device name fragment (vendor data sheets).
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100 SXM": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0,
                    "A10G": 70.0, "L4": 121.0, "RTX 4090": 165.0, "V100": 125.0, "T4": 65.0}
VARIANTS = {"bf16": "bf16.yaml", "bf16+compile": "gpu_compile.yaml"}


def peak_tflops(name: str) -> float | None:
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def run_variant(name: str, config: str, out: Path, extra: list[str], timeout: int) -> dict:
    run_dir = out / name.replace("+", "_")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "accelerate_configs" / config),
           str(ROOT / "src" / "train.py"), "--config", str(ROOT / "examples" / "shakespeare_gpu.yaml"),
           "--output-dir", str(run_dir), "--overwrite", "--no-progress", *extra]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"variant": name, "error": proc.stderr[-2000:]}
    summary = json.loads((run_dir / "summary.json").read_text())
    rates = [json.loads(line)["tokens_per_s"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    steady = statistics.median(rates[1:]) if len(rates) > 1 else summary["tokens_per_s"]
    device = summary["scenario"]["device_name"]
    peak = peak_tflops(device)
    return {
        "variant": name,
        "device": device,
        "val_loss": summary["val_loss"],
        "best_val_loss": summary["best_val_loss"],
        "steady_tokens_per_s": steady,
        "first_step_s": summary["first_step_s"],
        "flops_per_token": summary["flops_per_token"],
        "mfu": steady * summary["flops_per_token"] / (peak * 1e12) if peak else None,
        "peak_bf16_tflops": peak,
        "peak_memory_gib": summary["peak_memory_bytes"] / 2**30,
        "wall_s": wall,
        "scenario": summary["scenario"],
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out/lm_gpu", help="folder for the run folders and lm_gpu.json")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--max-steps", type=int, default=0, help="shorten the recipe (0 = its 5000 steps)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per variant")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = ["--max-steps", str(args.max_steps)] if args.max_steps else []
    results = [run_variant(name, VARIANTS[name], out, extra, args.timeout) for name in args.variants]
    (out / "lm_gpu.json").write_text(json.dumps(results, indent=2) + "\n")
    print("| variant | device | val loss (last / best) | steady tokens/s | MFU | first step s | peak GiB | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            print(f"| {r['variant']} | failed: {r['error'].strip().splitlines()[-1] if r['error'].strip() else '?'} |")
            continue
        mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "n/a (unknown GPU peak)"
        print(f"| {r['variant']} | {r['device']} | {r['val_loss']:.4f} / {r['best_val_loss']:.4f} | {r['steady_tokens_per_s']:,.0f} | {mfu} "
              f"| {r['first_step_s']:.1f} | {r['peak_memory_gib']:.2f} | {r['wall_s']:.0f} |")


if __name__ == "__main__":
    main()
