#!/usr/bin/env python
"""Mixed-precision checks for a CUDA machine (issue 3). The CI machine has no GPU; run this on one.

1. Launches src/train.py, unchanged, with accelerate_configs/single_gpu.yaml (fp32), fp16.yaml and
   bf16.yaml on the bundled digits, and prints a table: precision asked / effective, test accuracy,
   gap to fp32, optimizer steps, skipped steps, samples/s, wall time.
2. Checks each run: device cuda and the precision asked (no fallback warning); bf16 and fp16 reach
   fp32's test accuracy within --margin; in every run the LR logged after step s is the schedule's
   value at s - (steps skipped so far), i.e. fp16 steps skipped after an overflow do not advance it.
3. Runs the suite's GPU tests (`pytest -m gpu tests/test_parity.py`): an fp16 run forced to overflow
   (initial loss scale 2**40) must skip steps, count them in metrics.jsonl (`skipped_steps`) and hold
   the schedule; fp16 and bf16 reach fp32's accuracy in-process too.

    python scripts/gpu_checks.py                     # --epochs 20 --margin 0.02 --out runs/gpu_checks
    python scripts/gpu_checks.py --skip-pytest

Exit code 0 when every check passes, 1 when one fails, 2 without CUDA (--cpu-dry-run exercises the
script on a CPU machine: the configs fall back to the CPU, so the precision checks are expected to fail).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

RUNS = (("fp32", "single_gpu.yaml", "no"), ("fp16", "fp16.yaml", "fp16"), ("bf16", "bf16.yaml", "bf16"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    config: str, out_dir: Path, train_args: list[str], timeout: int
) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "accelerate_configs" / config),
        "--main_process_port",
        str(free_port()),
        str(ROOT / "src" / "train.py"),
        "--no-progress",
        "--overwrite",
        "--output-dir",
        str(out_dir),
        *train_args,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    return done, time.perf_counter() - start


def schedule_holds(run_dir: Path, summary: dict) -> tuple[bool, str]:
    """LR logged after step s == lr * lr_factor(s - skipped_so_far): skipped steps do not advance the schedule."""
    from anytrain.config import TrainConfig
    from anytrain.optim import lr_factor

    cfg = TrainConfig(**yaml.safe_load((run_dir / "config.yaml").read_text()))
    steps_per_epoch = math.ceil(math.ceil(summary["train_samples"] / cfg.optim.batch_size) / cfg.optim.grad_accum_steps)
    total = min(cfg.optim.max_steps or math.inf, cfg.optim.epochs * steps_per_epoch)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for m in (r for r in records if r["kind"] == "train"):
        expected = cfg.optim.lr * lr_factor(m["step"] - m["skipped_steps"], cfg.optim, total)
        if not math.isclose(m["lr"], expected, rel_tol=1e-9, abs_tol=1e-15):
            return (
                False,
                f"step {m['step']}: lr {m['lr']} but the schedule at step {m['step'] - m['skipped_steps']} is "
                f"{expected}",
            )
    return True, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument(
        "--margin", type=float, default=0.02, help="largest allowed test-accuracy drop of fp16/bf16 below fp32"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu_checks")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per launched run")
    parser.add_argument("--skip-pytest", action="store_true", help="do not run `pytest -m gpu tests/test_parity.py`")
    parser.add_argument("--cpu-dry-run", action="store_true", help="run without CUDA to check the script itself")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available() and not args.cpu_dry_run:
        print("gpu_checks: no CUDA device here; run this on a GPU machine (or --cpu-dry-run to exercise the script)")
        return 2
    print(
        f"gpu_checks: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU (dry run)'}, torch "
        f"{torch.__version__}"
    )

    train_args = ["--epochs", str(args.epochs), "--log-every-steps", "1"]
    results, failures = {}, []
    for name, config, requested in RUNS:
        run_dir = args.out / name
        done, seconds = launch(config, run_dir, train_args, args.timeout)
        if done.returncode != 0 or not (run_dir / "summary.json").exists():
            failures.append(f"{name}: launch failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
            continue
        summary = json.loads((run_dir / "summary.json").read_text())
        scenario = summary["scenario"]
        results[name] = (summary, seconds)
        if not scenario["device"].startswith("cuda"):
            failures.append(f"{name}: ran on {scenario['device']}, not on a GPU")
        expected_precision = {"no": "fp32"}.get(requested, requested)
        if scenario["mixed_precision"] != expected_precision or scenario["warnings"]:
            failures.append(
                f"{name}: effective precision {scenario['mixed_precision']} (asked {requested}); warnings "
                f"{scenario['warnings']}"
            )
        ok, why = schedule_holds(run_dir, summary)
        if not ok:
            failures.append(f"{name}: the LR schedule advanced on a skipped step: {why}")

    header = (
        f"{'run':<6}{'asked':<7}{'effective':<11}{'test acc':>9}{'vs fp32':>9}{'steps':>7}{'skipped':>9}"
        f"{'samples/s':>11}{'wall s':>8}"
    )
    print(header)
    print("-" * len(header))
    base = results.get("fp32", ({}, 0))[0].get("test_accuracy")
    for name, _, requested in RUNS:
        if name not in results:
            print(f"{name:<6}{requested:<7}{'(failed)':<11}")
            continue
        s, seconds = results[name]
        gap = "" if base is None else f"{s['test_accuracy'] - base:+.4f}"
        print(
            f"{name:<6}{requested:<7}{s['scenario']['mixed_precision']:<11}{s['test_accuracy']:>9.4f}{gap:>9}{s['optimizer_steps']:>7}"
            f"{s['skipped_optimizer_steps']:>9}{s['samples_per_s'] or 0:>11,.0f}{seconds:>8.1f}"
        )
    if base is not None:
        for name in ("fp16", "bf16"):
            if name in results and results[name][0]["test_accuracy"] < base - args.margin:
                failures.append(
                    f"{name}: test accuracy {results[name][0]['test_accuracy']:.4f} is more than {args.margin} below "
                    f"fp32's {base:.4f}"
                )

    if not args.skip_pytest:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "tests/test_parity.py"],
            check=False,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=args.timeout,
        )
        print("\npytest -m gpu tests/test_parity.py:\n" + "\n".join(tests.stdout.strip().splitlines()[-6:]))
        if tests.returncode != 0:
            failures.append("pytest -m gpu tests/test_parity.py failed")

    print(
        "\n" + ("gpu_checks: all checks passed" if not failures else "gpu_checks: FAILED\n  " + "\n  ".join(failures))
    )
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
