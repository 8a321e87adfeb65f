"""RunLock for real: separate Python processes, real flocks, a real SIGKILL. No mocks."""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anytrain.cli import main
from anytrain.config import ConfigError
from anytrain.runlock import RunLock, check_not_in_use

SRC = Path(__file__).resolve().parents[1] / "src"
TIMEOUT = 60  # seconds for any child process

# Tries to take the lock once: exit 0 and "acquired <warning>" on success (then releases), exit 2 and the message on
# refusal.
TRY_ACQUIRE = """
import sys
from anytrain.cli import main
from anytrain.config import ConfigError
from anytrain.runlock import RunLock, check_not_in_use
lock = RunLock(sys.argv[1])
try:
    warning = lock.acquire()
except ConfigError as e:
    print(e, file=sys.stderr)
    sys.exit(2)
print("acquired", warning)
lock.release()
"""

# Takes the lock and keeps it until killed.
HOLD = """
import sys, time
from anytrain.runlock import RunLock
RunLock(sys.argv[1]).acquire()
time.sleep(120)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}


def _try_acquire(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", TRY_ACQUIRE, str(run_dir)],
        check=False,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _holder(run_dir: Path) -> dict | None:
    try:
        return json.loads((run_dir / ".lock").read_text())
    except (OSError, ValueError):
        return None


@pytest.mark.launch
def test_second_process_is_refused_until_release(tmp_path):
    run_dir = tmp_path / "run"
    lock = RunLock(run_dir)
    try:
        assert lock.acquire() is None
        info = _holder(run_dir)
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname() and info["argv"] == sys.argv
        datetime.datetime.fromisoformat(info["started"])

        refused = _try_acquire(run_dir)
        assert refused.returncode == 2, refused.stderr
        message = refused.stderr.strip()
        assert "\n" not in message
        assert message.startswith(
            f"--output-dir: {run_dir} is in use by another run (pid {os.getpid()} on {socket.gethostname()}, started "
        )
        assert message.endswith("; wait for it to finish, or choose another --output-dir")
        assert _holder(run_dir)["pid"] == os.getpid()  # the refused process did not touch the file
    finally:
        lock.release()
    assert not (run_dir / ".lock").exists()

    after = _try_acquire(run_dir)
    assert after.returncode == 0, after.stderr
    assert after.stdout.strip() == "acquired None"  # a clean release leaves nothing to take over
    assert not (run_dir / ".lock").exists()


@pytest.mark.launch
def test_lock_of_a_killed_run_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lock = RunLock(run_dir)
    try:
        deadline = time.monotonic() + TIMEOUT
        while (_holder(run_dir) or {}).get("pid") != child.pid:
            assert child.poll() is None, child.stderr.read()
            assert time.monotonic() < deadline, "the child never took the lock"
            time.sleep(0.05)

        with pytest.raises(ConfigError, match=f"in use by another run \\(pid {child.pid} on "):
            lock.acquire()
        assert not lock.held

        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=TIMEOUT) == -signal.SIGKILL
        assert _holder(run_dir)["pid"] == child.pid  # the dead run's file is still there

        warning = lock.acquire()
        assert warning is not None and warning == lock.warning
        assert warning.startswith(
            f"took over the lock of a run that ended without releasing it (pid {child.pid} on {socket.gethostname()}, "
            "started "
        )
        assert _holder(run_dir)["pid"] == os.getpid()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=TIMEOUT)
        child.stderr.close()
        lock.release()
    assert not (run_dir / ".lock").exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", None),  # an empty file names no holder: taken over silently
        (
            "{not json",
            "took over the lock of a run that ended without releasing it (holder unknown: the lock file is unreadable)",
        ),
        (
            '{"host": "h"}',
            "took over the lock of a run that ended without releasing it (holder unknown: the lock file is unreadable)",
        ),
    ],
)
def test_unheld_garbled_or_empty_lock_file_is_taken_over(tmp_path, content, expected):
    (tmp_path / ".lock").write_text(content)
    lock = RunLock(tmp_path)
    try:
        assert lock.acquire() == expected
        assert _holder(tmp_path)["pid"] == os.getpid()
    finally:
        lock.release()


def test_garbled_lock_file_of_a_live_holder_says_another_process(tmp_path):
    holder = RunLock(tmp_path)
    holder.acquire()
    try:
        (tmp_path / ".lock").write_text("garbage")
        with pytest.raises(ConfigError) as refused:
            RunLock(tmp_path).acquire()
        assert (
            str(refused.value)
            == f"--output-dir: {tmp_path} is in use by another process; wait for it to finish, or choose another "
            "--output-dir"
        )
    finally:
        holder.release()


def _start_holder(run_dir: Path) -> subprocess.Popen:
    """A live process holding the folder's lock (until killed)."""
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], env=_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + TIMEOUT
    while (_holder(run_dir) or {}).get("pid") != child.pid:
        assert child.poll() is None, child.stderr.read()
        assert time.monotonic() < deadline, "the child never took the lock"
        time.sleep(0.05)
    return child


def _refusal(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    return err


@pytest.mark.launch
def test_a_launch_into_a_folder_whose_run_still_trains_hears_of_the_lock_first(tmp_path, capsys):
    """The folder holds an unfinished run (which would be "pass --resume") and a live process holds
    its lock: the lock is said first, with or without --resume; once the holder is gone, the
    unfinished run is. The probe takes nothing: the holder's lock file is left as it was."""
    run_dir = tmp_path / "run"
    argv = "--dataset synthetic --synthetic-samples 200 --synthetic-features 8 --hidden-sizes 16 --epochs 1".split()
    argv += ["--no-progress", "--no-plot", "--output-dir", str(run_dir)]
    main(argv)
    (run_dir / "summary.json").unlink()  # as if it were still training: checkpoints, no summary
    child = _start_holder(run_dir)
    try:
        held = _holder(run_dir)
        for extra in ([], ["--resume"]):
            err = _refusal(capsys, [*argv, *extra])
            assert err.startswith(
                f"train.py: error: --output-dir: {run_dir} is in use by another run (pid {child.pid} on "
                f"{socket.gethostname()}, started "
            ), err
            assert err.endswith("; wait for it to finish, or choose another --output-dir") and "--resume" not in err
            assert _holder(run_dir) == held
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=TIMEOUT) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=TIMEOUT)
        child.stderr.close()
    # the dead holder's lock file is still there, but nobody holds it: now the unfinished run is the news
    assert _holder(run_dir)["pid"] == child.pid
    err = _refusal(capsys, argv)
    assert err == (
        f"train.py: error: --output-dir: {run_dir} holds an unfinished run with this config; pass --resume to "
        "continue it or --overwrite to start over"
    ), err
    check_not_in_use(tmp_path / "none")  # no folder, no lock file: nothing to say, nothing made
    assert not (tmp_path / "none").exists()


def test_release_is_idempotent_removes_the_file_and_creates_parents(tmp_path):
    run_dir = tmp_path / "a" / "b" / "run"
    lock = RunLock(run_dir)
    lock.release()  # never acquired: nothing happens
    assert lock.acquire() is None
    assert lock.held and (run_dir / ".lock").is_file()
    assert lock.acquire() is None  # already held: no-op

    refused = RunLock(run_dir)  # a separate open of the file conflicts even within one process
    with pytest.raises(ConfigError):
        refused.acquire()
    refused.release()  # after a failed acquire: must not delete the holder's file
    assert _holder(run_dir)["pid"] == os.getpid()

    lock.release()
    lock.release()
    assert not lock.held and not (run_dir / ".lock").exists()
    assert lock.acquire() is None  # can be taken again
    lock.release()


def test_context_manager(tmp_path):
    with RunLock(tmp_path / "run") as lock:
        assert lock.held and lock.warning is None
        assert (tmp_path / "run" / ".lock").exists()
    assert not lock.held and not (tmp_path / "run" / ".lock").exists()


def test_release_in_a_forked_child_keeps_the_parents_lock(tmp_path):
    lock = RunLock(tmp_path)
    lock.acquire()
    try:
        pid = os.fork()
        if pid == 0:  # child: only closes its copy of the descriptor
            try:
                lock.release()
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert lock.held and _holder(tmp_path)["pid"] == os.getpid()
        with pytest.raises(ConfigError):
            RunLock(tmp_path).acquire()
    finally:
        lock.release()
    assert not (tmp_path / ".lock").exists()
