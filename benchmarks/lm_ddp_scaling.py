"""CPU DDP on the GPT CPU recipe: 2 ranks x 1 thread (multi_cpu.yaml, batch 6 per rank) against
1 rank x 2 threads (cpu.yaml, batch 12): the same global batch, the same cores, interleaved.

    python benchmarks/lm_ddp_scaling.py --steps 300 --rounds 2

Scaling = steady tokens/s of 2 x 1 / steady tokens/s of 1 x 2 (the median of the logged windows after
the first). 1.0 means the all-reduce and the smaller per-rank matmuls cost nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from toolkit import ROOT, TRAIN, launch_cmd, read_run, rotated, run_process, steady_tokens_per_s

VARIANTS = {"1x2": ("cpu.yaml", 12), "2x1": ("multi_cpu.yaml", 6)}


def run(name: str, steps: int, out: Path) -> dict:
    config, batch = VARIANTS[name]
    run_dir, recipe = out / name, ROOT / "examples" / "shakespeare_cpu.yaml"
    args = [
        "--config",
        str(recipe),
        "--batch-size",
        str(batch),
        "--max-steps",
        str(steps),
        "--output-dir",
        str(run_dir),
    ]
    args += "--eval-every-steps 0 --eval-windows 64 --overwrite --no-progress".split()
    with (out / f"{name}.log").open("w") as log:
        rec, _ = run_process(launch_cmd(config, TRAIN, *args), log, timeout=1200)
    if "error" in rec:
        raise SystemExit(f"{name} failed: {rec['error']}\n" + "\n".join(rec.get("error_tail", [])))
    train, _, summary = read_run(run_dir)
    scenario = summary["scenario"]
    res = {"variant": name, "steady_tokens_per_s": steady_tokens_per_s(train), "wall_s": rec["wall_s"]}
    res.update(processes=scenario["num_processes"], threads=scenario["cpu_threads_per_process"])
    return {**res, "val_loss": summary["val_loss"]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default="bench_out/lm_ddp_scaling")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for r in range(args.rounds):
        for name in rotated(list(VARIANTS), r):
            results.append({"round": r, **run(name, args.steps, out)})
            print(json.dumps(results[-1]), flush=True)
    best = {name: max(x["steady_tokens_per_s"] for x in results if x["variant"] == name) for name in VARIANTS}
    rate = {(x["round"], x["variant"]): x["steady_tokens_per_s"] for x in results}
    ratios = [rate[r, "2x1"] / rate[r, "1x2"] for r in range(args.rounds)]
    report = {
        "results": results,
        "best_tokens_per_s": best,
        "scaling_best": best["2x1"] / best["1x2"],
        "scaling_per_round": ratios,
    }
    (out / "lm_ddp_scaling.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"2 ranks x 1 thread / 1 rank x 2 threads, steady tokens/s: best {report['scaling_best']:.3f} "
        f"({best['2x1']:,.0f} / {best['1x2']:,.0f}); per round {', '.join(f'{x:.3f}' for x in ratios)}"
    )


if __name__ == "__main__":
    main()
