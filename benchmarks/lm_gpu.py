"""nanoGPT's GPU recipe for Tiny Shakespeare through anytrain on a CUDA machine, bf16 eager and bf16 + torch.compile:
validation loss (goal <= 1.47), steady tokens/s and MFU (docs/benchmarks.md, "GPU recipe")."""

from pathlib import Path

import toolkit
from toolkit import gpu_peak, lm_run

VARIANTS = {"bf16": "bf16.yaml", "bf16+compile": "gpu_compile.yaml"}


def run_variant(name: str, config: str, out: Path, extra: list[str], timeout: int) -> dict:
    rec, lines, train, summary = lm_run(config, out / name.replace("+", "_"), "shakespeare_gpu.yaml", extra, timeout)
    if "error" in rec:
        return {"variant": name, "error": "\n".join(text for _, text in lines)[-2000:] or rec["error"]}
    steady = toolkit.steady_tokens_per_s(train) if len(train) > 1 else summary["tokens_per_s"]
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
    p = toolkit.parser(__doc__, out="bench_out/lm_gpu")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--max-steps", type=int, default=0, help="shorten the recipe (0 = its 5000 steps)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per variant")
    args = p.parse_args(argv)
    out, extra = toolkit.out_dir(args.out), ["--max-steps", str(args.max_steps)] if args.max_steps else []
    results = [run_variant(name, VARIANTS[name], out, extra, args.timeout) for name in args.variants]
    toolkit.write_json(out / "lm_gpu.json", results, indent=2)
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
