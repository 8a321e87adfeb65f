"""CPU time per training step, trainer against plain loop: the overhead figure other work on the machine cannot
blur. Each side, 1 thread, in a fresh process for S1 and S2 steps: (cpu(S2) - cpu(S1)) / (S2 - S1) is the CPU cost
of one more step (docs/benchmarks.md); the trainer side is anytrain.trainer.train, the plain side plain_loop.py.
"""

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
            options = ["--no-progress", "--output-dir", str(Path(tmp) / "run"), "--max-steps", str(steps), *options]
            train = toolkit.trainer_job(options)
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
    p = toolkit.parser(__doc__, json="bench_out/cpu_per_step.json", rounds=2)
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    args = p.parse_args(argv)
    result = {}
    for w in args.workloads:
        options, s1, s2 = WORKLOADS[w]

        def per_step(kind: str, r: int) -> float:
            cpu = {s: measure(kind, s, options) for s in (s1, s2)}
            return (cpu[s2] - cpu[s1]) / (s2 - s1)

        per = toolkit.interleave(["trainer", "plain"], args.rounds, per_step)
        t, pl = statistics.median(per["trainer"]), statistics.median(per["plain"])
        result[w] = {"trainer_ms": 1000 * t, "plain_ms": 1000 * pl, "ratio": pl / t, "steps": [s1, s2]}
        result[w].update({f"{k}_ms_runs": [1000 * v for v in per[k]] for k in ("trainer", "plain")})
        ms = f"trainer {1000 * t:.3f} ms, plain loop {1000 * pl:.3f} ms"
        print(f"{w:8s} CPU per step: {ms}, plain/trainer {100 * pl / t:.1f} %", flush=True)
    toolkit.write_json(args.json, result)


if __name__ == "__main__":
    main()
