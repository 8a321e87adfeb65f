"""scripts/gpu_truth.py, the GPU script (issue 42), checked on the CPU: its dry run runs steps at toy sizes and
writes truth.json and truth.md; a step that raises is recorded with its error and the next step still runs; a
failed check fails the run, while on a dry run the checks that need a GPU are recorded, not counted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import gpu_truth  # noqa: E402


@pytest.mark.launch
def test_the_dry_run_measures_the_fused_loss_against_the_full_logits_and_writes_both_files(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "gpu_truth.py"), "--dry-run", "--only", "env", "mfu", "lmhead"]
    done = subprocess.run([*cmd, "--out", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert truth["dry_run"] and list(truth["steps"]) == ["env", "mfu", "lmhead"]
    assert all(step["status"] == "ran" for step in truth["steps"].values())
    rows = truth["steps"]["lmhead"]["rows"]
    assert sorted((r["vocabulary"], r["loss"]) for r in rows) == [
        (512, "full logits"), (512, "fused"), (2048, "full logits"), (2048, "fused")
    ]  # fmt: skip
    by = {(r["vocabulary"], r["loss"]): r for r in rows}
    for vocabulary in (512, 2048):  # the same model, batch and steps: the same loss either way
        assert by[vocabulary, "fused"]["last_loss"] == pytest.approx(
            by[vocabulary, "full logits"]["last_loss"], rel=1e-4
        )
    checks = [c["result"] for step in truth["steps"].values() for c in step.get("checks", [])]
    assert "not a real run (dry run)" in checks and "FAIL" not in checks  # no GPU here: recorded, not counted
    md = (tmp_path / "truth.md").read_text()
    assert "## lmhead: ran" in md and "| 2048 | fused |" in md


def test_a_step_that_raises_is_recorded_and_the_next_step_runs(tmp_path, monkeypatch):
    def broken(run, step):
        raise RuntimeError("no such config")

    def checked(run, step):
        step["rows"] = [{"figure": 1.5}]
        run.check(step, "a figure above 2", False, "1.5", real_run=False)  # counted on a dry run too

    monkeypatch.setattr(gpu_truth, "STEPS", {"env": broken, "mfu": checked})
    assert gpu_truth.main(["--dry-run", "--all", "--out", str(tmp_path)]) == 1
    steps = json.loads((tmp_path / "truth.json").read_text())["steps"]
    assert steps["env"]["status"] == "failed" and steps["env"]["error"] == "RuntimeError: no such config"
    assert steps["mfu"]["status"] == "check failed" and steps["mfu"]["checks"][0]["result"] == "FAIL"
    md = (tmp_path / "truth.md").read_text()
    assert "Error: `RuntimeError: no such config`" in md and "- FAIL: a figure above 2 (1.5)" in md


def test_without_cuda_and_without_dry_run_it_says_so(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    assert gpu_truth.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA device here" in capsys.readouterr().out
