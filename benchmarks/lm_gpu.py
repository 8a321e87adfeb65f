"""nanoGPT's GPU recipe for Tiny Shakespeare through anytrain on a CUDA machine: validation loss,
tokens/s and MFU, for bf16 eager and bf16 + torch.compile (and optionally nanoGPT's own train.py).

    python benchmarks/lm_gpu.py                       # both variants, the full 5000-step recipe
    python benchmarks/lm_gpu.py --max-steps 500       # a quick look (the schedule is shortened too)

MFU (model FLOPs utilisation) = tokens/s x FLOPs per token / the GPU's peak dense bf16 FLOP/s
(toolkit.GPU_PEAKS), with FLOPs per token = 6 N + 12 n_layer n_embd block_size (N = parameters
without the position embedding): the matmul FLOPs of the forward and backward pass, attention
scores included (PaLM's appendix B; nanoGPT's estimate_mfu uses the same formula). The rate is the
steady state: the median of the logged tokens/s after the first log window (compilation, warm-up).

Goal from the issue: validation loss <= 1.47 (nanoGPT: best 1.4697 on one A100).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from toolkit import ROOT, TRAIN, gpu_peak, launch_cmd, read_run, run_process, steady_tokens_per_s

VARIANTS = {"bf16": "bf16.yaml", "bf16+compile": "gpu_compile.yaml"}


def run_variant(name: str, config: str, out: Path, extra: list[str], timeout: int) -> dict:
    run_dir = out / name.replace("+", "_")
    args = ["--config", str(ROOT / "examples" / "shakespeare_gpu.yaml"), "--output-dir", str(run_dir), "--overwrite"]
    with (out / f"{run_dir.name}.log").open("w") as log:
        rec, lines = run_process(launch_cmd(config, TRAIN, *args, "--no-progress", *extra), log, timeout=timeout)
    if "error" in rec:
        return {"variant": name, "error": "\n".join(text for _, text in lines)[-2000:] or rec["error"]}
    train, _, summary = read_run(run_dir)
    steady = steady_tokens_per_s(train) if len(train) > 1 else summary["tokens_per_s"]
    device = summary["scenario"]["device_name"]
    peak = (gpu_peak(device) or (None, None))[1]
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
        "wall_s": rec["wall_s"],
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
            print(f"| {r['variant']} | failed: {(r['error'].strip().splitlines() or ['?'])[-1]} |")
            continue
        mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "n/a (unknown GPU peak)"
        loss = f"{r['val_loss']:.4f} / {r['best_val_loss']:.4f}"
        rest = f"{r['first_step_s']:.1f} | {r['peak_memory_gib']:.2f} | {r['wall_s']:.0f}"
        print(f"| {r['variant']} | {r['device']} | {loss} | {r['steady_tokens_per_s']:,.0f} | {mfu} | {rest} |")


if __name__ == "__main__":
    main()
