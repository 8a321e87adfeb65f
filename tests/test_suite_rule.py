"""The process rule (tests/launch_rule.py), run on a small suite of its own through pytester, in process."""

from __future__ import annotations

import sys

INNER = """
import multiprocessing
import subprocess
import sys

import pytest
import torch

PYTHON = [sys.executable, "-c", "print('child')"]


def test_unmarked_subprocess():
    subprocess.run(PYTHON, capture_output=True, timeout=60)


def test_unmarked_popen_swallowed():
    try:
        subprocess.Popen(PYTHON).wait(timeout=60)
    except BaseException:
        pass


def test_unmarked_multiprocessing():
    child = multiprocessing.get_context("spawn").Process(target=print)
    child.start()
    child.join(timeout=60)


@pytest.fixture(scope="module")
def shared_launch():
    return subprocess.check_output(PYTHON, text=True, timeout=60)


def test_unmarked_test_of_a_launching_fixture(shared_launch):
    assert shared_launch


def test_unmarked_dataloader_workers():
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2, num_workers=1)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


def test_unmarked_in_process():
    assert sum(range(4)) == 6


@pytest.mark.launch
def test_marked_subprocess():
    done = subprocess.run(PYTHON, capture_output=True, text=True, timeout=60)
    assert done.stdout == "child\\n"
"""


def test_an_unmarked_test_that_starts_a_process_fails(pytester):
    """Unmarked: a subprocess, a Popen whose failure the test swallows, a multiprocessing process and a module
    fixture that launches each fail, naming the marker; DataLoader workers and plain code pass, and so does
    the marked test's subprocess."""
    pytester.makepyfile(test_inner=INNER)
    pytester.makeini("[pytest]\nmarkers =\n    launch: starts a process\naddopts = --strict-markers -p launch_rule\n")
    result = pytester.runpytest_inprocess("-q")
    reports = result.reprec.getreports("pytest_runtest_logreport")
    failed = {r.nodeid.split("::")[-1] for r in reports if r.failed}
    assert failed == {
        "test_unmarked_subprocess",
        "test_unmarked_popen_swallowed",
        "test_unmarked_multiprocessing",
        "test_unmarked_test_of_a_launching_fixture",  # an error in its setup
    }
    result.assert_outcomes(passed=3, failed=3, errors=1)
    text = result.stdout.str()
    assert text.count("is not marked @pytest.mark.launch") >= 4, text
    assert "this test starts a process (subprocess: " in text and sys.executable in text
    assert "this test starts a process (multiprocessing: " in text
    assert "(the test caught the failure and went on)" in text
