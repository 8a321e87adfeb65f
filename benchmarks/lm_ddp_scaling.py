"""CPU DDP on the GPT CPU recipe: 2 ranks x 1 thread (multi_cpu.yaml, batch 6 per rank) against
1 rank x 2 threads (cpu.yaml, batch 12): the same global batch, the same cores, interleaved.

    python benchmarks/lm_ddp_scaling.py --steps 300 --rounds 2

Scaling = steady tokens/s of 2 x 1 / steady tokens/s of 1 x 2 (the median of the logged windows after
the first). 1.0 means the all-reduce and the smaller per-rank matmuls cost nothing.
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
VARIANTS = {"1x2": ("cpu.yaml", 12), "2x1": ("multi_cpu.yaml", 6)}


def run(name: str, steps: int, out: Path) -> dict:
    config, batch = VARIANTS[name]
    run_dir = out / name
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "accelerate_configs" / config),
           str(ROOT / "src" / "train.py"), "--config", str(ROOT / "examples" / "shakespeare_cpu.yaml"), "--batch-size", str(batch),
           "--max-steps", str(steps), "--eval-every-steps", "0", "--eval-windows", "64", "--output-dir", str(run_dir), "--overwrite", "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-2000:]}")
    rates = [json.loads(line)["tokens_per_s"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"variant": name, "steady_tokens_per_s": statistics.median(rates[1:]), "wall_s": time.perf_counter() - start,
            "processes": summary["scenario"]["num_processes"], "threads": summary["scenario"]["cpu_threads_per_process"],
            "val_loss": summary["val_loss"]}


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
        for name in (list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]):
            results.append({"round": r, **run(name, args.steps, out)})
            print(json.dumps(results[-1]), flush=True)
    best = {name: max(x["steady_tokens_per_s"] for x in results if x["variant"] == name) for name in VARIANTS}
    rate = {(x["round"], x["variant"]): x["steady_tokens_per_s"] for x in results}
    ratios = [rate[r, "2x1"] / rate[r, "1x2"] for r in range(args.rounds)]
    report = {"results": results, "best_tokens_per_s": best, "scaling_best": best["2x1"] / best["1x2"], "scaling_per_round": ratios}
    (out / "lm_ddp_scaling.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"2 ranks x 1 thread / 1 rank x 2 threads, steady tokens/s: best {report['scaling_best']:.3f} "
          f"({best['2x1']:,.0f} / {best['1x2']:,.0f}); per round {', '.join(f'{x:.3f}' for x in ratios)}")


if __name__ == "__main__":
    main()
