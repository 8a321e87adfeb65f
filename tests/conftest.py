"""Shared helpers: in-process training with a fresh accelerate state, and timed subprocess launches."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "src" / "train.py"
CONFIGS = ROOT / "accelerate_configs"
sys.path.insert(0, str(ROOT / "src"))

# Tests never touch the network: hub look-ups fail fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

LAUNCH_TIMEOUT = 240  # seconds; a hung rank fails the test instead of hanging CI


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """One Accelerator per process is accelerate's rule; reset it around every test."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(config: str, *args: str, extra_launch: tuple[str, ...] = (), timeout: int = LAUNCH_TIMEOUT, env: dict | None = None) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file accelerate_configs/<config> src/train.py <args>` with a timeout."""
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(CONFIGS / config),
        "--main_process_port", str(free_port()),
        *extra_launch, str(TRAIN), "--no-progress", *args,
    ]
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=full_env)


def read_summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def max_abs_diff(a: dict, b: dict) -> float:
    """The largest absolute difference between two state dicts with the same keys."""
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)
