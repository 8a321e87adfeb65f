"""CPU time per training step, trainer against plain loop: the overhead figure that other work on the machine cannot blur.

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
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LARGE = ["--dataset", "synthetic", "--synthetic-samples", "21942", "--synthetic-features", "784", "--hidden-sizes", "1024", "1024",
         "--dropout", "0", "--batch-size", "256"]
# options, S1, S2. Digits: 20 more epochs, so their validation and checkpoint count (they are part of
# the default job's per-step cost). Large: both inside the first 60-step epoch, whose single validation
# and checkpoint both runs pay: pure per-step cost.
WORKLOADS = {"default": ([], 100, 500), "large": (LARGE, 10, 55)}


def child(kind: str, steps: int, options: list[str]) -> None:
    sys.path.insert(0, str(ROOT / "src"))
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "trainer":
            from anytrain.config import parse_config
            from anytrain.trainer import train

            cfg = parse_config(["--no-progress", "--output-dir", str(Path(tmp) / "run"), "--max-steps", str(steps), *options])
            start = time.process_time()
            train(cfg)
        else:
            sys.path.insert(0, str(ROOT / "benchmarks"))
            import plain_loop
            from bench import PLAIN_FLUSH_DENORMAL

            start = time.process_time()
            ftz = ["--flush-denormal"] if PLAIN_FLUSH_DENORMAL else []
            plain_loop.main(["--json", str(Path(tmp) / "plain.json"), *ftz, "--max-steps", str(steps), *options])
        print("CPU_SECONDS", time.process_time() - start)


def measure(kind: str, steps: int, options: list[str]) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(steps), *options], env=env, capture_output=True, text=True, timeout=600, check=False)
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
            for kind in (("trainer", "plain") if r % 2 == 0 else ("plain", "trainer")):
                cpu = {s: measure(kind, s, options) for s in (s1, s2)}
                per[kind].append((cpu[s2] - cpu[s1]) / (s2 - s1))
        t, pl = statistics.median(per["trainer"]), statistics.median(per["plain"])
        result[w] = {"trainer_ms": 1000 * t, "plain_ms": 1000 * pl, "ratio": pl / t, "steps": [s1, s2],
                     "trainer_ms_runs": [1000 * v for v in per["trainer"]], "plain_ms_runs": [1000 * v for v in per["plain"]]}
        print(f"{w:8s} CPU per step: trainer {1000 * t:.3f} ms, plain loop {1000 * pl:.3f} ms, plain/trainer {100 * pl / t:.1f} %", flush=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
