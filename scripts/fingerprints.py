"""Fingerprints of the final weights of four reference runs, to prove a change left training untouched.

    python scripts/fingerprints.py            # run the four jobs, print their fingerprints
    python scripts/fingerprints.py --check    # ... and compare with tests/fingerprints.json (exit 1 on a difference)
    python scripts/fingerprints.py --record   # ... and store them there for this environment

The jobs, each through `accelerate launch` of this checkout's src/train.py:
  digits       the default job (bundled digits, seed 42, every option at its default)
  shakespeare  the first 200 optimizer steps of examples/shakespeare_cpu.yaml (--max-steps 200)
  two_ranks    2 gloo ranks (accelerate_configs/multi_cpu.yaml), digits, 5 epochs
  resumed      digits, 6 epochs, SIGKILLed after its step-100 checkpoint, then --resume

A fingerprint is anytrain.outputs.weights_fingerprint (16 hex digits of a sha256) of the weights training
ended with (summary.json's last_weights_sha256: model.safetensors holds the best validation's weights
by default, the last step's with --final-weights last).
Bit-identical weights are only expected on the same torch build, CPU kernels and core count, so they
are stored per environment (anytrain.outputs.fingerprint_environment); the test suite pins the runs it
makes anyway the same way, in the same file (tests/conftest.py, check_fingerprint). About 2 minutes on
2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "tests" / "fingerprints.json"  # shared with the tests' pins (tests/conftest.py)
TIMEOUT = 600


def fingerprint(run_dir: Path) -> str:
    """The last step's weights (a tree older than --final-weights: its model.safetensors)."""
    from safetensors.torch import load_file

    from anytrain.outputs import weights_fingerprint

    summary = json.loads((run_dir / "summary.json").read_text())
    return summary.get("last_weights_sha256") or weights_fingerprint(load_file(str(run_dir / "model.safetensors")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(tree: Path, config: str, run_dir: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(tree / "accelerate_configs" / config),
        "--main_process_port",
        str(free_port()),
        str(tree / "src" / "train.py"),
        "--no-progress",
        "--no-plot",
        "--output-dir",
        str(run_dir),
        *args,
    ]


def run(cmd: list[str], tree: Path) -> None:
    out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=TIMEOUT)
    if out.returncode != 0:
        sys.exit(f"fingerprints: {' '.join(cmd[-6:])} failed ({out.returncode}):\n{out.stderr[-3000:]}")


def killed_and_resumed(tree: Path, run_dir: Path) -> None:
    args = ["--epochs", "6", "--checkpoint-every-steps", "50"]
    victim = subprocess.Popen(
        command(tree, "cpu.yaml", run_dir, *args),
        cwd=tree,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + TIMEOUT
    while not (run_dir / "checkpoints" / "step-000100").is_dir():
        if victim.poll() is not None or time.monotonic() > deadline:
            sys.exit("fingerprints: the run to kill ended (or hung) before its step-100 checkpoint")
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=60)
    run(command(tree, "cpu.yaml", run_dir, *args, "--resume"), tree)


def jobs(tree: Path, root: Path) -> dict[str, str]:
    recipe = str(tree / "examples" / "shakespeare_cpu.yaml")
    run(command(tree, "cpu.yaml", root / "digits"), tree)
    run(command(tree, "cpu.yaml", root / "shakespeare", "--config", recipe, "--max-steps", "200"), tree)
    run(command(tree, "multi_cpu.yaml", root / "two_ranks", "--epochs", "5"), tree)
    killed_and_resumed(tree, root / "resumed")
    return {name: fingerprint(root / name) for name in ("digits", "shakespeare", "two_ranks", "resumed")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout whose src/train.py runs (default: this one)")
    parser.add_argument(
        "--check", action="store_true", help="compare with tests/fingerprints.json; exit 1 on a difference"
    )
    parser.add_argument(
        "--record", action="store_true", help="store the fingerprints in tests/fingerprints.json for this environment"
    )
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    os.environ.update(env)
    with tempfile.TemporaryDirectory() as tmp:
        found = jobs(args.tree.resolve(), Path(tmp))
    from anytrain.outputs import fingerprint_environment

    key = fingerprint_environment()
    print(json.dumps({key: found}, indent=1))
    stored = json.loads(STORE.read_text()) if STORE.exists() else {}
    if args.record:
        stored[key] = found
        STORE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    elif args.check:
        expected = stored.get(key)
        if expected is None:
            sys.exit(f"fingerprints: none stored for this environment ({key}); run with --record on a known-good tree")
        differing = [name for name in found if found[name] != expected.get(name)]
        if differing:
            sys.exit(f"fingerprints: changed: {', '.join(differing)}")
        print("fingerprints: all four unchanged")


if __name__ == "__main__":
    main()
