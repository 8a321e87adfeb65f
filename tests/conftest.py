"""Shared helpers: in-process training with a fresh accelerate state, and timed subprocess launches."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from anytrain.flops import torch_threads  # torch's threads set meanwhile

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "src" / "train.py"
CONFIGS = ROOT / "accelerate_configs"
sys.path.insert(0, str(ROOT / "src"))
# Shared check modules report their failed asserts with values, like the tests that call them.
pytest.register_assert_rewrite("hfchecks")

# Tests never touch the network: hub look-ups fail fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# The process rule (tests/launch_rule.py): an unmarked test that starts a process fails; pytester checks it.
pytest_plugins = ["launch_rule", "pytester"]

# `make check` runs the in-process suite on two pytest-xdist workers, a file to a worker (its module fixtures
# train once). The files that take longest go out first, so that the two end together: from `--durations`, two
# workers, in seconds: about 50, 48, 43, 31, 25, 23, 17, 17, 15, 13, 10; every other file under 10.
SLOWEST_FILES = (
    "test_sft.py",
    "test_lm.py",
    "test_dpo.py",
    "test_llm.py",
    "test_grpo_tools.py",
    "test_images.py",
    "test_conformance_grpo.py",
    "test_hf_seq2seq.py",
    "test_hf_image.py",
    "test_speakers.py",
    "test_sft_tools.py",
)


def pytest_configure(config):
    """An xdist worker (make check) keeps to a core of its own where there are as many cores as workers: its one
    torch thread then never waits on the other worker, and what a run sees of the machine (--num-workers auto
    gives images a decoding worker only where a core is free) is what it has."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    launches = config.getoption("markexpr", "") == "launch"  # their processes share every core, as users' do
    if worker and 1 < count <= len(CORES) and not launches:
        os.sched_setaffinity(0, {CORES[int(worker.removeprefix("gw")) % len(CORES)]})
    font_cache()


def font_cache() -> None:
    """matplotlib's font cache made before any test: on a machine that has none, its first import runs `fc-list`,
    a subprocess that the launch rule would blame on whichever in-process test drew a curve first."""
    try:
        import matplotlib.font_manager  # noqa: F401 - builds ~/.cache/matplotlib's font list once
    except ImportError:  # matplotlib is the bench extra's: the curve tests skip without it
        pass


def pytest_collection_modifyitems(config, items):
    """In an xdist worker of the in-process tests (make check), the slowest files first; otherwise pytest's order (the
    launching tests on two workers: 8:43 and 9:38 in pytest's order, 9:42 with their longest files first)."""
    if os.environ.get("PYTEST_XDIST_WORKER") and config.getoption("markexpr", "") != "launch":
        rank = {name: k for k, name in enumerate(SLOWEST_FILES)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


LAUNCH_TIMEOUT = 240  # seconds; a hung rank fails the test instead of hanging CI


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """One Accelerator per process is accelerate's rule; reset it around every test."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)


@pytest.fixture(autouse=True, scope="session")
def own_cache_dir(tmp_path_factory):
    """A CPU's measured peak is kept in a cache folder (src/anytrain/flops.py): the session's own, never the user's
    ~/.cache/anytrain (launched runs inherit it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANYTRAIN_CACHE_DIR", str(tmp_path_factory.mktemp("anytrain_cache")))
        yield


@pytest.fixture(autouse=True, scope="session")
def no_curves():
    """The end-of-run curves.png costs ~1 s of matplotlib per run: in-process runs skip it (launches
    pass --no-plot, see launch() and start_run()); the `draws_curves` fixture turns it back on."""
    import anytrain.trainer

    REAL["write_curves"] = anytrain.trainer.write_curves
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(anytrain.trainer, "write_curves", lambda run_dir: None)
        yield


REAL = {}  # the trainer's own functions that the session fixture replaces


@pytest.fixture
def draws_curves(monkeypatch):
    import anytrain.trainer

    monkeypatch.setattr(anytrain.trainer, "write_curves", REAL["write_curves"])


DEFAULT_THREADS = torch.get_num_threads()  # torch's own choice for this machine: what a launched run gets
CORES = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []  # before a worker keeps to one


@contextlib.contextmanager
def as_launched():
    """torch's default threads on every core, as a launched run has them (a run whose pinned fingerprint was
    made so): the session's one thread and an xdist worker's one core are set aside meanwhile."""
    before = sorted(os.sched_getaffinity(0)) if CORES else []
    if CORES:
        os.sched_setaffinity(0, CORES)
    try:
        with torch_threads(DEFAULT_THREADS):
            yield
    finally:
        if CORES:
            os.sched_setaffinity(0, before)


@pytest.fixture(autouse=True, scope="session")
def one_thread_in_process():
    """In-process runs use one intra-op thread. The suite's models are tiny: one thread is as fast, and far
    steadier on a shared 2-core machine, where two threads per op wait on each other (a small CNN's step:
    3.6 ms on one thread, 29 ms on two beside another job). Launched runs are processes of their own and
    keep torch's default; a run pinned by a fingerprint made with it runs `as_launched()`."""
    with torch_threads(1):
        yield


@pytest.fixture
def one_thread():
    """Tiny models run as fast (and steadier on a shared 2-core machine) on one intra-op thread."""
    with torch_threads(1):
        yield


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    config: str, *args: str, extra_launch: tuple[str, ...] = (), timeout: int = LAUNCH_TIMEOUT, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file accelerate_configs/<config> src/train.py <args>` with a timeout."""
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIGS / config),
        "--main_process_port",
        str(free_port()),
        *extra_launch,
        str(TRAIN),
        "--no-progress",
        "--no-plot",
        *args,
    ]
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=full_env)


PINNED = ROOT / "tests" / "fingerprints.json"  # per environment; scripts/fingerprints.py pins its jobs here too


def check_fingerprint(name: str, run_dir: Path) -> None:
    """The last step's weights of a run the suite makes anyway must keep their pinned fingerprint: a change
    that alters training, however slightly, fails here. (model.safetensors holds the best validation's
    weights by default; the pins are of the weights training ended with, summary.json's
    last_weights_sha256, which is model.safetensors' fingerprint when those are the saved ones.)
    Bit-identical weights are expected only on the same torch build, CPU kernels and core count, so pins
    are kept per environment; where none is recorded the check says so and passes.
    ANYTRAIN_RECORD_FINGERPRINTS=1 records instead of checking."""
    from safetensors.torch import load_file

    from anytrain.outputs import fingerprint_environment, weights_fingerprint

    summary = read_summary(run_dir)
    found = summary["last_weights_sha256"]
    saved = weights_fingerprint(load_file(str(Path(run_dir) / "model.safetensors")))
    assert (saved == found) == (summary["final_weights_step"] == summary["optimizer_steps"]), (saved, found)
    env, pinned = fingerprint_environment(), json.loads(PINNED.read_text())
    if os.environ.get("ANYTRAIN_RECORD_FINGERPRINTS"):
        pinned.setdefault(env, {})[name] = found
        PINNED.write_text(json.dumps(pinned, indent=1, sort_keys=True) + "\n")
    elif name not in pinned.get(env, {}):
        warnings.warn(
            f"no pinned fingerprint for {name!r} on {env}: record with ANYTRAIN_RECORD_FINGERPRINTS=1", stacklevel=2
        )
    else:
        assert found == pinned[env][name], f"the weights of {name!r} changed: {found}, pinned {pinned[env][name]}"


def read_summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def max_abs_diff(a: dict, b: dict) -> float:
    """The largest absolute difference between two state dicts with the same keys."""
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def start_run(run_dir: Path, args: list[str], *extra: str, ranks: int = 1, env: dict | None = None) -> subprocess.Popen:
    """A training run in the background (1 process, or `ranks` through multi_cpu.yaml), in a session of its own."""
    if ranks == 1:
        cmd = [sys.executable, str(TRAIN)]
    else:
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(CONFIGS / "multi_cpu.yaml"),
            "--main_process_port",
            str(free_port()),
            str(TRAIN),
        ]
    return subprocess.Popen(
        [*cmd, "--no-plot", *args, "--output-dir", str(run_dir), *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def finish_run(proc: subprocess.Popen, timeout: int = LAUNCH_TIMEOUT) -> tuple[int, str]:
    """Wait for a start_run process: (exit code, stderr); killed with its whole session on timeout."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc.returncode, err


def kill_and_resume(root: Path, args: list[str], kill_step: int, env: dict | None = None) -> tuple[Path, Path]:
    """A reference run and a victim side by side; the victim is SIGKILLed once it has logged `kill_step`
    training lines (log every step), then resumed. Returns (reference, victim) run folders, both finished."""
    reference = start_run(root / "reference", args, env=env)
    victim = start_run(root / "victim", args, env=env)
    wait_for_step(root / "victim", kill_step, victim)
    os.killpg(victim.pid, signal.SIGKILL)  # no chance to save anything
    victim.wait(timeout=60)
    code, err = finish_run(reference)
    assert code == 0, err[-2000:]
    assert not (root / "victim" / "summary.json").exists()  # it really died mid-run
    code, err = finish_run(start_run(root / "victim", args, "--resume", env=env))
    assert code == 0, err[-2000:]
    return root / "reference", root / "victim"


def wait_for_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout: int = LAUNCH_TIMEOUT) -> None:
    """Until the run has logged `step` training lines (log every step)."""
    deadline = time.monotonic() + timeout
    path = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if path.exists() and sum(1 for line in path.read_text().splitlines() if '"train"' in line) >= step:
            return
        assert proc.poll() is None, "the run ended before the kill step"
        time.sleep(0.02)
    raise TimeoutError(f"step {step} not reached")


def run_cli_error(capsys, argv: list[str]) -> str:
    """The command line on bad input: exit code 2 and one line on stderr (returned), not a traceback."""
    from anytrain.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err
