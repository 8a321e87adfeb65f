"""The suite's process rule (a pytest plugin; tests/conftest.py registers it): a test that starts a process
must be marked `@pytest.mark.launch`, so that `make check` (`pytest -m "not launch"`) is the in-process suite.

"Starts a process" means, here:
- `subprocess.Popen` in any form (`subprocess.run`, `check_output`, `os.popen`, `accelerate launch` through
  the tests' `launch()` and `start_run()` helpers): caught where Popen forks, so every spelling is caught;
- `os.system`, `os.posix_spawn` and `os.posix_spawnp`;
- `multiprocessing` processes (`Process.start`, which `Pool`s and `spawn` also go through), except a
  DataLoader's workers: `--num-workers` is part of in-process training, not a second program.
Not counted: a bare `os.fork` that runs the test's own code (tests/test_runlock.py checks a lock from a
forked child), threads, and what libraries run outside Python (tokenizers' Rust threads).

An unmarked test that starts one fails with a message naming the marker; the start raises `pytest.fail`'s
exception, which `except Exception` does not swallow, and a test that swallows it anyway is still reported
failed. A module- or session-scoped fixture that starts a process counts against the test that sets it up.
tests/test_suite_rule.py checks the rule itself."""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess

import pytest

MARKER = "launch"
_ITEMS: list[pytest.Item] = []  # the test being run (a stack: the rule's own test runs a pytest inside pytest)
_VIOLATIONS = pytest.StashKey[list[str]]()


def _what(kind: str, args: object) -> str:
    text = " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)
    return f"{kind}: {text[:160]}"


def _check(kind: str, args: object) -> None:
    """Fail the current test if it is unmarked; nothing outside a test (collection, the session's end)."""
    if not _ITEMS or _ITEMS[-1].get_closest_marker(MARKER) is not None:
        return
    item = _ITEMS[-1]
    message = (
        f"this test starts a process ({_what(kind, args)}) but is not marked @pytest.mark.{MARKER}: mark it "
        f"(`make check` runs pytest -m 'not {MARKER}', the in-process suite) or keep it in process"
    )
    item.stash.setdefault(_VIOLATIONS, []).append(message)
    pytest.fail(message, pytrace=False)


def _is_dataloader_worker(process: multiprocessing.process.BaseProcess) -> bool:
    target = getattr(process, "_target", None)
    return getattr(target, "__module__", "") == "torch.utils.data._utils.worker"


def _guards() -> dict[tuple[object, str], object]:
    """(owner, name) -> the guarded replacement, each calling the original after the check."""
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    start = multiprocessing.process.BaseProcess.start

    def guarded_execute_child(self, args, *rest, **kwargs):
        _check("subprocess", args)
        return execute_child(self, args, *rest, **kwargs)

    def guarded_start(self):
        if not _is_dataloader_worker(self):
            _check("multiprocessing", f"{type(self).__name__}(target={getattr(self, '_target', None)!r})")
        return start(self)

    guards: dict[tuple[object, str], object] = {
        (subprocess.Popen, "_execute_child"): guarded_execute_child,
        (multiprocessing.process.BaseProcess, "start"): guarded_start,
    }
    for name in ("system", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            guards[(os, name)] = _guard_function(name, getattr(os, name))
    return guards


def _guard_function(name: str, original):
    def guarded(*args, **kwargs):
        _check(f"os.{name}", args[:2])
        return original(*args, **kwargs)

    return guarded


@pytest.fixture(autouse=True, scope="session")
def processes_need_the_marker():
    """The rule, for the whole session: the guards stay in place; the hooks below say which test runs."""
    with pytest.MonkeyPatch.context() as patch:
        for (owner, name), guard in _guards().items():
            patch.setattr(owner, name, guard)
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _ITEMS.append(item)
    try:
        return (yield)
    finally:
        _ITEMS.pop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that caught the failure and went on is failed all the same."""
    report = yield
    violations = item.stash.get(_VIOLATIONS, [])
    if violations and report.when == "call" and report.passed:
        report.outcome = "failed"
        report.longrepr = violations[0] + " (the test caught the failure and went on)"
    return report
