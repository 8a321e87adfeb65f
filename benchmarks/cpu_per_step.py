"""CPU time per training step, trainer against plain loop: the overhead figure other work on the machine cannot blur.

Wall-clock throughput on a shared machine swings by 10x and more between identical runs (see
docs/benchmarks.md). CPU time charged to a single-threaded process hardly moves: it counts the
work the process does, not the time it waited for a core. So each side runs in a fresh process
with 1 thread, twice, for S1 and S2 optimizer steps; (cpu(S2) - cpu(S1)) / (S2 - S1) is the CPU
cost of one more step, start-up cancelled out. The trainer side is `anytrain.trainer.train` itself
(everything it does per step and per epoch: data loading, accelerate's wrappers, logging,
validation and the epoch-end checkpoint); the plain side is benchmarks/plain_loop.py.

    python benchmarks/cpu_per_step.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import toolkit

# options, S1, S2. Digits: 20 more epochs, so their validation and checkpoint count (they are part of
# the default job's per-step cost). Large: both inside the first 60-step epoch, whose single validation
# and checkpoint both runs pay: pure per-step cost.
WORKLOADS = {"default": ([], 100, 500), "large": ([*toolkit.LARGE, "--batch-size", "256"], 10, 55)}


def child(kind: str, steps: int, options: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "trainer":
            train = toolkit.trainer_job(
                ["--no-progress", "--output-dir", str(Path(tmp) / "run"), "--max-steps", str(steps), *options]
            )
            start = time.process_time()
            train()
        else:
            import plain_loop
            from bench import FTZ

            start = time.process_time()
            plain_loop.main(["--json", str(Path(tmp) / "plain.json"), *FTZ, "--max-steps", str(steps), *options])
        print("CPU_SECONDS", time.process_time() - start)


def measure(kind: str, steps: int, options: list[str]) -> float:
    cmd = [sys.executable, __file__, "--child", kind, str(steps), *options]
    out = subprocess.run(cmd, env=toolkit.run_env(1), capture_output=True, text=True, timeout=600, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("CPU_SECONDS")]
    if out.returncode or not lines:
        raise RuntimeError(f"{kind} {steps} steps failed: {out.stderr[-500:]}")
    return float(lines[-1].split()[1])


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        return child(argv[1], int(argv[2]), argv[3:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    args = p.parse_args(argv)
    result = {}
    for w in args.workloads:
        options, s1, s2 = WORKLOADS[w]
        per = {"trainer": [], "plain": []}
        for r in range(args.rounds):
            for kind in toolkit.rotated(["trainer", "plain"], r):
                cpu = {s: measure(kind, s, options) for s in (s1, s2)}
                per[kind].append((cpu[s2] - cpu[s1]) / (s2 - s1))
        t, pl = statistics.median(per["trainer"]), statistics.median(per["plain"])
        result[w] = {"trainer_ms": 1000 * t, "plain_ms": 1000 * pl, "ratio": pl / t, "steps": [s1, s2]}
        result[w].update({f"{k}_ms_runs": [1000 * v for v in per[k]] for k in ("trainer", "plain")})
        ms = f"trainer {1000 * t:.3f} ms, plain loop {1000 * pl:.3f} ms"
        print(f"{w:8s} CPU per step: {ms}, plain/trainer {100 * pl / t:.1f} %", flush=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
