"""Language modelling under real `accelerate launch`: 2 ranks equal 1 rank with twice the batch,
a SIGKILLed run resumes bit for bit, and torch.compile through the accelerate config file matches
eager within a stated tolerance."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import kill_and_resume, launch, max_abs_diff, read_metrics, read_summary

from anytrain import load_model

pytestmark = pytest.mark.launch

TINY = (
    "--dataset shakespeare --n-layer 2 --n-head 2 --n-embd 32 --block-size 32 --warmup-steps 5 --eval-windows 64 "
    "--log-every-steps 1"
).split()


def train_losses(run_dir) -> list[float]:
    return [m["loss"] for m in read_metrics(run_dir) if m["kind"] == "train"]


def test_two_ranks_equal_one_rank_with_twice_the_batch(tmp_path):
    common = [*TINY, *"--optimizer sgd --lr 0.1 --momentum 0 --dropout 0 --max-steps 15 --eval-every-steps 5".split()]
    two = launch("multi_cpu.yaml", *common, "--batch-size", "8", "--output-dir", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-2000:]
    one = launch("cpu.yaml", *common, "--batch-size", "16", "--output-dir", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-2000:]
    s2, s1 = read_summary(tmp_path / "two"), read_summary(tmp_path / "one")
    assert s2["scenario"]["num_processes"] == 2 and s1["scenario"]["num_processes"] == 1
    assert len(set(s2["weights_sha256_per_rank"])) == 1  # both ranks hold the same weights
    diff = max_abs_diff(load_model(tmp_path / "two").state_dict(), load_model(tmp_path / "one").state_dict())
    assert diff < 1e-6, diff  # measured 1.5e-8
    assert train_losses(tmp_path / "two") == pytest.approx(train_losses(tmp_path / "one"), abs=5e-6)  # measured 4.8e-7
    # validation: the same fixed windows on 1 and 2 ranks, so the same loss
    evals = [[m["loss"] for m in read_metrics(tmp_path / name) if m["kind"] == "eval"] for name in ("two", "one")]
    assert len(evals[0]) == 3 and evals[0] == pytest.approx(evals[1], abs=1e-6)  # measured 1.9e-8
    assert s2["tokens_per_s"] == pytest.approx(32 * s2["samples_per_s"])


# Slow enough per step that a kill lands mid-run; dropout on, so the RNG states must be restored too.
RESUMABLE = [
    *TINY,
    *(
        "--n-embd 64 --block-size 64 --batch-size 16 --dropout 0.1 --max-steps 80 --eval-every-steps 20 "
        "--checkpoint-every-steps 7 --grad-accum-steps 2 --no-progress"
    ).split(),
]


def test_sigkill_mid_run_then_resume_is_bit_identical(tmp_path):
    kill_step = random.Random("lm").randint(10, 60)
    print(f"kill step {kill_step} of 80")
    one_thread = {"OMP_NUM_THREADS": "1"}  # two runs side by side on 2 cores: one thread each, not four fighting
    kill_and_resume(tmp_path, RESUMABLE, kill_step, env=one_thread)
    assert read_summary(tmp_path / "reference")["optimizer_steps"] == 80
    ref, res = load_model(tmp_path / "reference").state_dict(), load_model(tmp_path / "victim").state_dict()
    assert all(torch.equal(ref[k], res[k]) for k in ref), "weights differ"
    assert [(m["step"], m["loss"]) for m in read_metrics(tmp_path / "reference")] == [
        (m["step"], m["loss"]) for m in read_metrics(tmp_path / "victim")
    ]
    assert read_summary(tmp_path / "victim")["resumed_from"] is not None


def test_torch_compile_from_the_accelerate_config_matches_eager(tmp_path):
    common = [*TINY, *"--n-layer 1 --dropout 0 --batch-size 8 --max-steps 20 --eval-every-steps 0".split()]
    cache = tmp_path / "inductor"  # where inductor writes the kernels it generates
    compiled = launch(
        "cpu_compile.yaml",
        *common,
        "--output-dir",
        str(tmp_path / "compiled"),
        timeout=600,
        env={"TORCHINDUCTOR_CACHE_DIR": str(cache)},
    )
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    assert "torch.compile (inductor)" in compiled.stdout
    eager = launch("cpu.yaml", *common, "--output-dir", str(tmp_path / "eager"))
    assert eager.returncode == 0, eager.stderr[-2000:]
    sc, se = read_summary(tmp_path / "compiled"), read_summary(tmp_path / "eager")
    assert sc["scenario"]["compile"] == "inductor" and se["scenario"]["compile"] is None
    # Inductor fuses and reorders float arithmetic: the same losses within 1e-4 (measured up to ~1e-6).
    assert train_losses(tmp_path / "compiled") == pytest.approx(train_losses(tmp_path / "eager"), abs=1e-4)
    assert sc["val_loss"] == pytest.approx(se["val_loss"], abs=1e-4)
    # the saved weights are the model's, not torch.compile's wrapper's, and load like any run's
    diff = max_abs_diff(load_model(tmp_path / "compiled").state_dict(), load_model(tmp_path / "eager").state_dict())
    assert diff < 1e-4, diff  # measured 2.0e-6
    # inductor really compiled (it wrote kernels); the first step, which holds the compilation, is reported
    # apart from the steady rate (no wall-clock comparison here: CI's machine is shared and noisy)
    assert any(cache.rglob("*.py")), "inductor generated no kernel"
    assert sc["first_step_s"] > 0 and se["first_step_s"] > 0 and sc["tokens_per_s"] > 0
