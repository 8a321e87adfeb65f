"""Padded text classification, where padding and uneven lengths make the scenarios easy to get wrong:
2 gloo ranks under a real `accelerate launch` equal 1 rank with twice the batch, gradient
accumulation equals the bigger batch, and a SIGKILLed run resumes bit for bit.

The texts (tests/textdata.py) are 1 to 49 words long, so every rank and every accumulated micro-batch
pads to its own longest text: the 1-rank batch of 16 to the longest of 16, each rank's 8 to the longest
of its 8. Data: 324 rows carved into 256 training (divisible by every global batch here, 16), 33
validation and 35 test rows (divisible by neither the batch nor the world size).
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import kill_and_resume, launch, max_abs_diff, read_metrics, read_summary
from textdata import texts, write_jsonl

from anytrain import load_model
from anytrain.config import parse_config
from anytrain.data.textcls import load_text_class_splits
from anytrain.trainer import train

pytestmark = pytest.mark.launch

N = 324
TEXT = f"--text-column text --label-column label --val-fraction {33.5 / N} --test-fraction {35.5 / N}".split()
SMALL = "--model encoder --tokenizer bpe --vocab-size 300 --n-layer 1 --n-head 2 --n-embd 32".split()
COMMON = [*TEXT, *SMALL, *"--dropout 0 --lr 1e-3 --warmup-steps 3 --epochs 2 --log-every-steps 1".split()]
WEIGHT_TOL = 1e-6  # the project's tolerance (docs/equivalence.md); measured 1.2e-7 for weights and losses, both cases


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("texts") / "texts.jsonl", texts(N, seed=3))


def in_process(data, run_dir, *flags: str) -> dict:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    try:
        return train(
            parse_config(["--dataset", str(data), *COMMON, *flags, "--no-progress", "--output-dir", str(run_dir)])
        )
    finally:
        AcceleratorState._reset_state(True)


def logged(run_dir, kind: str) -> list[dict]:
    return [m for m in read_metrics(run_dir) if m["kind"] == kind]


@pytest.fixture(scope="module")
def one_rank(data, tmp_path_factory):
    """1 process x batch 16, in-process: the reference for 2 ranks x 8 and for 2 accumulated x 8."""
    run_dir = tmp_path_factory.mktemp("one_rank")
    return in_process(data, run_dir, "--batch-size", "16"), run_dir


def test_the_texts_are_padded_unevenly(data):
    splits = load_text_class_splits(parse_config(["--dataset", str(data), *TEXT, *SMALL]))
    lengths = splits.train.offsets[1:] - splits.train.offsets[:-1]
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (256, 33, 35)
    assert lengths.min() <= 3 and lengths.max() >= 60  # tokens per text


def test_two_ranks_equal_one_rank_with_twice_the_batch(data, one_rank, tmp_path):
    one, one_dir = one_rank
    two_dir = tmp_path / "two"
    result = launch(
        "multi_cpu.yaml", "--dataset", str(data), *COMMON, "--batch-size", "8", "--output-dir", str(two_dir)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    two = read_summary(two_dir)
    assert two["scenario"]["num_processes"] == 2 and one["scenario"]["num_processes"] == 1
    assert len(set(two["weights_sha256_per_rank"])) == 1  # both ranks hold the same weights
    assert two["optimizer_steps"] == one["optimizer_steps"] == 32
    diff = max_abs_diff(load_model(two_dir).state_dict(), load_model(one_dir).state_dict())
    assert diff < WEIGHT_TOL, diff
    losses = [[m["loss"] for m in logged(d, "train")] for d in (two_dir, one_dir)]
    assert losses[0] == pytest.approx(losses[1], abs=WEIGHT_TOL)
    # evaluation: per text, gathered without the rows padded into the last batch, so equal
    evals = [[(m["split"], m["accuracy"], m["loss"]) for m in logged(d, "eval")] for d in (two_dir, one_dir)]
    assert [e[:2] for e in evals[0]] == [e[:2] for e in evals[1]] and len(evals[0]) == 3
    assert [e[2] for e in evals[0]] == pytest.approx([e[2] for e in evals[1]], abs=WEIGHT_TOL)
    assert one["test_accuracy"] > 0.8  # it learned (measured 0.97)


def test_gradient_accumulation_equals_the_bigger_batch(data, one_rank, tmp_path):
    one, one_dir = one_rank
    accum = in_process(data, tmp_path / "accum", "--batch-size", "8", "--grad-accum-steps", "2")
    assert accum["optimizer_steps"] == one["optimizer_steps"]
    diff = max_abs_diff(load_model(tmp_path / "accum").state_dict(), load_model(one_dir).state_dict())
    assert diff < WEIGHT_TOL, diff
    losses = [[m["loss"] for m in logged(d, "train")] for d in (tmp_path / "accum", one_dir)]
    assert losses[0] == pytest.approx(losses[1], abs=WEIGHT_TOL)


# Slow enough per step that a kill lands mid-run; dropout on, so the RNG states must be restored too;
# the resumed run reads the BPE back from the run folder's tokenizer.json.
RESUMABLE = [
    *TEXT,
    *SMALL,
    *(
        "--n-layer 2 --n-embd 64 --dropout 0.1 --batch-size 8 --grad-accum-steps 2 --max-steps 60 --epochs 10 "
        "--eval-every-steps 20 --checkpoint-every-steps 7 --log-every-steps 1 --warmup-steps 5 --no-progress"
    ).split(),
]


def test_sigkill_mid_run_then_resume_is_bit_identical(data, tmp_path):
    kill_step = random.Random("textcls").randint(10, 40)
    print(f"kill step {kill_step} of 60")
    args = ["--dataset", str(data), *RESUMABLE]
    one_thread = {"OMP_NUM_THREADS": "1"}  # two runs side by side on 2 cores
    kill_and_resume(tmp_path, args, kill_step, env=one_thread)
    assert read_summary(tmp_path / "reference")["optimizer_steps"] == 60
    ref, res = load_model(tmp_path / "reference").state_dict(), load_model(tmp_path / "victim").state_dict()
    assert all(torch.equal(ref[k], res[k]) for k in ref), "weights differ"
    assert [(m["step"], m["loss"]) for m in read_metrics(tmp_path / "reference")] == [
        (m["step"], m["loss"]) for m in read_metrics(tmp_path / "victim")
    ]
    assert read_summary(tmp_path / "victim")["resumed_from"] is not None
    assert (tmp_path / "victim" / "tokenizer.json").read_text() == (
        tmp_path / "reference" / "tokenizer.json"
    ).read_text()
