"""Exact for any dataset size (docs/equivalence.md): 2 ranks equal 1 rank, and accumulation equals one big
batch, over whole epochs whose training rows divide into no global batch. The last, short round of batches is
split over the ranks as it falls (no row twice), each batch weighted by its rows' (a token-weighted task: its
target tokens') share of the step, a rank left with nothing runs one row of weight 0 (shares.py).

Data: the bundled digits' 1,259 training rows (prime), a regression table of 293 training rows (prime), and for
the token-weighted loss the tiny GPT-2 on 247 generated texts (prime). The 1-rank references train in-process.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import launch, max_abs_diff, read_metrics, read_summary
from hfchecks import in_process

from anytrain import load_model

WEIGHT_TOL = 1e-6  # the project's tolerance (docs/equivalence.md)
DIGITS = "--dataset digits --hidden-sizes 32 --dropout 0 --lr 3e-3 --epochs 2 --log-every-steps 5".split()
DIGITS += ["--final-weights", "last"]
TABLE_ROWS = 371  # floor(371 x f): 37 validation, 41 test, 293 training rows
TABLE = (
    f"--label-column y --val-fraction {37.5 / 371} --test-fraction {41.5 / 371} --hidden-sizes 16 --dropout 0".split()
)
TABLE += "--lr 3e-3 --epochs 3 --log-every-steps 4 --final-weights last".split()


def train_losses(run_dir) -> list[tuple[int, float, float]]:
    return [(m["step"], m["loss"], m["lr"]) for m in read_metrics(run_dir) if m["kind"] == "train"]


def assert_equal_runs(summary: dict, run_dir, reference: tuple[dict, object], tol: float = WEIGHT_TOL) -> str:
    """Same steps and LRs, every logged loss and the weights within tol; says the largest differences."""
    one, one_dir = reference
    assert (
        summary["optimizer_steps"] == one["optimizer_steps"] and summary["epochs_completed"] == one["epochs_completed"]
    )
    diff = max_abs_diff(load_model(run_dir).state_dict(), load_model(one_dir).state_dict())
    assert diff <= tol, diff
    ours, theirs = train_losses(run_dir), train_losses(one_dir)
    assert [(s, lr) for s, _, lr in ours] == [(s, lr) for s, _, lr in theirs]
    losses = max(abs(a - b) for (_, a, _), (_, b, _) in zip(ours, theirs))
    assert losses <= tol, losses
    return f"weights {diff:.1e}, logged losses {losses:.1e}"


def launched(run_dir, *args: str) -> dict:
    out = launch("multi_cpu.yaml", *args, "--no-plot", "--output-dir", str(run_dir))
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["scenario"]["num_processes"] == 2 and len(set(summary["weights_sha256_per_rank"])) == 1
    return summary


# --------------------------------------------------------------------------- the rounds and their weights


@pytest.mark.parametrize(
    "rows, batch, processes, accum",
    [(1259, 16, 2, 1), (1259, 8, 1, 4), (293, 4, 2, 2), (5, 4, 3, 2), (512, 16, 2, 2), (1259, 32, 1, 1)],
)
def test_every_row_trains_once_an_epoch_and_each_step_is_the_mean_over_its_rows(rows, batch, processes, accum):
    from accelerate.data_loader import BatchSamplerShard, SeedableRandomSampler

    from anytrain.shares import Rounds, epoch_weights, split_as_it_falls

    class Loader:  # what epoch_weights reads of accelerate's prepared loader
        def __init__(self, batch_sampler):
            self.batch_sampler = batch_sampler

        def set_epoch(self, epoch):
            sampler.set_epoch(epoch)

    per_process, trained, steps, every = [], [], {}, []
    for process in range(processes):
        sampler = SeedableRandomSampler(data_source=range(rows), generator=torch.Generator().manual_seed(7))
        rounds = Rounds(sampler, batch)
        loader = Loader(BatchSamplerShard(rounds, processes, process) if processes > 1 else rounds)
        split_as_it_falls(loader)
        weights = epoch_weights(loader, 3, None, accum)
        loader.set_epoch(3)
        batches = list(loader.batch_sampler)
        per_process.append(len(batches))
        every += [w.weight for w in weights]
        assert len(weights) == len(batches) == len(loader.batch_sampler)
        for k, (indices, w) in enumerate(zip(batches, weights)):
            assert w.share is None and len(indices) >= 1  # a filler is one row
            if w.weight:
                trained += indices
            # after backward's 1 / accum and DDP's 1 / processes: each row's weight in its step's gradient
            steps.setdefault(k // accum, set()).add(round(w.weight / (processes * accum * len(indices)), 12))
    assert len(set(per_process)) == 1  # as many batches on every rank: DDP needs each in every all-reduce
    assert sorted(trained) == list(range(rows))  # every row once, none twice
    step_rows = [batch * processes * accum] * (len(steps) - 1) + [rows - (len(steps) - 1) * batch * processes * accum]
    assert [step - {0.0} for step in steps.values()] == [{round(1 / n, 12)} for n in step_rows]
    divides = rows % (batch * processes * accum) == 0 or processes * accum == 1
    assert divides == all(w == 1.0 for w in every)  # exactly 1 where the sizes divide


# --------------------------------------------------------------------------- the bundled digits: 1,259 rows


@pytest.fixture(scope="module")
def digits_one_batch(tmp_path_factory) -> tuple[dict, object]:
    """1 process x batch 32, 2 epochs of 40 steps (the last of 11 rows): the reference."""
    run_dir = tmp_path_factory.mktemp("digits") / "one"
    return in_process(run_dir, *DIGITS, "--batch-size", "32"), run_dir


def test_digits_accumulation_equals_the_big_batch_whatever_the_size(digits_one_batch, tmp_path):
    """4 x 8 accumulated: 158 micro-batches an epoch, the last step 2 of them (8 + 3 rows), weighed 8/11 and 3/11."""
    summary = in_process(tmp_path / "accum", *DIGITS, "--batch-size", "8", "--grad-accum-steps", "4")
    assert summary["optimizer_steps"] == 80 and summary["train_samples"] == 1259
    print(f"digits, 4 x 8 vs 1 x 32: {assert_equal_runs(summary, tmp_path / 'accum', digits_one_batch)}")


@pytest.mark.launch
def test_digits_on_two_ranks_equal_one_rank_whatever_the_size(digits_one_batch, tmp_path):
    """2 ranks x 16: 79 batches an epoch, rank 0's last of 11 rows, rank 1's last a filler row of weight 0."""
    summary = launched(tmp_path / "two", *DIGITS, "--batch-size", "16")
    print(f"digits, 2 x 16 vs 1 x 32: {assert_equal_runs(summary, tmp_path / 'two', digits_one_batch)}")
    assert summary["val_accuracy"] == digits_one_batch[0]["val_accuracy"]


# --------------------------------------------------------------------------- a regression table: 293 rows


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> tuple[list[str], tuple[dict, object]]:
    """A regression table of 371 rows, 293 for training; 1 process x batch 16 (19 steps an epoch, the last of 5)."""
    root = tmp_path_factory.mktemp("table")
    rng = np.random.default_rng(11)
    x = rng.normal(size=(TABLE_ROWS, 3)).astype(np.float32)
    y = 1.5 + x @ np.array([2.0, -1.0, 0.5]) + rng.normal(scale=0.3, size=TABLE_ROWS)
    pq.write_table(pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "y": y}), root / "table.parquet")
    args = ["--dataset", str(root / "table.parquet"), *TABLE]
    return args, (in_process(root / "one", *args, "--batch-size", "16"), root / "one")


def test_table_accumulation_equals_the_big_batch_whatever_the_size(table, tmp_path):
    args, reference = table
    summary = in_process(tmp_path / "accum", *args, "--batch-size", "4", "--grad-accum-steps", "4")
    assert (summary["task"], summary["train_samples"], summary["optimizer_steps"]) == ("regress", 293, 57)
    print(f"table, 4 x 4 vs 1 x 16: {assert_equal_runs(summary, tmp_path / 'accum', reference)}")


@pytest.mark.launch
def test_table_on_two_ranks_with_accumulation_equals_one_rank_whatever_the_size(table, tmp_path):
    """2 ranks x 2 accumulated x 4: 74 batches an epoch, 37 a rank; each epoch's last step is 1 micro-batch a rank,
    of 4 and 1 rows."""
    args, reference = table
    summary = launched(tmp_path / "two", *args, "--batch-size", "4", "--grad-accum-steps", "2")
    print(f"table, 2 x 2 x 4 vs 1 x 16: {assert_equal_runs(summary, tmp_path / 'two', reference)}")
    assert summary["val_rmse"] == pytest.approx(reference[0]["val_rmse"], abs=WEIGHT_TOL)


# --------------------------------------------------------------------------- token-weighted: 247 texts


LM_TOL = 2e-5  # AdamW's normalised steps on float32 sums in another order (tests/test_hf.py says why)


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> tuple[list[str], tuple[dict, object]]:
    """The tiny GPT-2 on 324 texts, 247 for training: 1 process x batch 16, one epoch of 16 steps (the last of 7).
    (Accumulation on one process was already exact for it: its step shares weigh an epoch's last, short step.)"""
    pytest.importorskip("transformers")
    from hfmodels import tiny_gpt2
    from textdata import texts, write_jsonl

    root, n = tmp_path_factory.mktemp("lm"), 324
    data = write_jsonl(root / "texts.jsonl", texts(n, seed=3))
    args = ["--model", f"hf:{tiny_gpt2(root / 'gpt2')}", "--dataset", str(data), "--text-column", "text"]
    args += f"--val-fraction {38.5 / n} --test-fraction {39.5 / n} --task lm --max-length 64 --lr 2e-3".split()
    args += "--warmup-steps 2 --epochs 1 --log-every-steps 1".split()
    return args, (in_process(root / "one", *args, "--batch-size", "16"), root / "one")


@pytest.mark.launch
def test_token_weighted_two_ranks_equal_one_rank_whatever_the_size(lm, tmp_path):
    """2 ranks x 8: 31 batches, rank 0's last of 7 texts, rank 1's last a filler text of weight 0."""
    args, reference = lm
    summary = launched(tmp_path / "two", *args, "--batch-size", "8")
    print(f"lm, 2 x 8 vs 1 x 16: {assert_equal_runs(summary, tmp_path / 'two', reference, LM_TOL)}")
    assert summary["val_loss"] == pytest.approx(reference[0]["val_loss"], abs=LM_TOL)
