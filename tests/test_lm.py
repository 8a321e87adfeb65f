"""Language modelling through the same loop, in one process: the bundled Shakespeare split and
vocabulary, other text sources, windows, a short run that learns, sampling, accumulation, early
stopping, bf16 autocast, the compile fallback, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import as_launched, check_fingerprint, max_abs_diff, read_metrics, read_summary, run_cli_error

import anytrain.data.text as text_module
from anytrain import TrainConfig, load_model
from anytrain.cli import main
from anytrain.config import ConfigError
from anytrain.data.text import SHAKESPEARE_PATH, load_text_splits
from anytrain.data.tokenizer import Vocab
from anytrain.sample import sample
from anytrain.tasks.settle import settle
from anytrain.trainer import train

SHAKESPEARE = SHAKESPEARE_PATH.read_text()
# A tiny GPT: 300 steps take a few seconds on 2 cores.
TINY_LM = {
    "dataset": "shakespeare",
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 32,
    "block_size": 32,
    "batch_size": 16,
    "lr": 3e-3,
    "warmup_steps": 10,
    "dropout": 0.0,
    "eval_windows": 200,
    "log_every_steps": 10,
    "progress": False,
}
UNIGRAM_VAL_LOSS = 3.347  # cross-entropy of the training text's character frequencies on the validation text


def lm_config(tmp_path, name="run", **overrides) -> TrainConfig:
    return TrainConfig(**{**TINY_LM, "output_dir": str(tmp_path / name), **overrides})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One short run shared by the assertions on learning, logs, summary, weights and sampling."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    folder = tmp_path_factory.mktemp("lm")
    with as_launched():  # as its pinned fingerprint (lm_tiny) was made: torch's default threads
        summary = train(lm_config(folder, max_steps=300, eval_every_steps=100))
    AcceleratorState._reset_state(True)
    return folder / "run", summary


# --------------------------------------------------------------------------- data


def test_shakespeare_splits_like_nanogpt_with_its_65_character_vocabulary():
    data = load_text_splits(TrainConfig(dataset="shakespeare"))
    n = len(SHAKESPEARE)
    assert (data.train.num_tokens, data.validation.num_tokens) == (int(n * 0.9), n - int(n * 0.9))
    assert (
        data.tokenizer.kind == "char"
        and data.tokenizer.chars == "".join(sorted(set(SHAKESPEARE)))
        and data.tokenizer.size == 65
    )
    assert data.train.tokens.dtype == np.uint8  # one byte per token, held once
    assert data.tokenizer.decode(data.train.tokens[:40]) == SHAKESPEARE[:40]
    assert data.tokenizer.decode(data.validation.tokens[:40]) == SHAKESPEARE[int(n * 0.9) :][:40]
    assert data.test is None  # nanoGPT's split has no test part


def test_windows_are_block_plus_one_tokens_shifted_by_one():
    data = load_text_splits(TrainConfig(dataset="shakespeare", block_size=8))
    inputs, targets = data.train.__getitems__([0, 100])
    assert inputs.shape == targets.shape == (2, 8) and inputs.dtype == torch.long
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert (
        data.tokenizer.decode(inputs[1].tolist()) + data.tokenizer.decode(targets[1, -1:].tolist())
        == SHAKESPEARE[100:109]
    )
    assert len(data.train) == data.train.num_tokens - 8  # every start position
    # validation: every non-overlapping window, fixed
    n_val = data.validation.num_tokens
    assert len(data.validation) == (n_val - 9) // 8 + 1
    assert data.validation.starts[:3].tolist() == [0, 8, 16]


def test_eval_windows_spread_evenly_over_the_validation_text():
    data = load_text_splits(TrainConfig(dataset="shakespeare", block_size=16, eval_windows=5))
    starts = data.validation.starts
    assert len(starts) == 5 and starts[0] == 0 and starts[-1] == data.validation.num_tokens - 17


def test_a_txt_file_a_folder_of_them_and_a_parquet_text_column_load_the_same_way(tmp_path):
    text = "to be or not to be, that is the question\n" * 20
    (tmp_path / "one.txt").write_text(text)
    single = load_text_splits(TrainConfig(dataset=str(tmp_path / "one.txt"), block_size=8))
    assert single.source.endswith("one.txt") and single.tokenizer.chars == "".join(sorted(set(text)))
    cut = int(len(text) * 0.9)
    assert (
        single.tokenizer.decode(single.train.tokens) == text[:cut]
        and single.tokenizer.decode(single.validation.tokens) == text[cut:]
    )
    folder = tmp_path / "books"
    folder.mkdir()
    (folder / "b.txt").write_text("second book " * 30)
    (folder / "a.txt").write_text("first book " * 30)
    both = load_text_splits(TrainConfig(dataset=str(folder), block_size=8, val_fraction=0.2))
    joined = "first book " * 30 + "\n" + "second book " * 30  # files in name order, one newline between
    assert both.tokenizer.decode(np.concatenate([both.train.tokens, both.validation.tokens])) == joined
    docs = ["hello world, " * 10, "goodbye moon. " * 10]
    pq.write_table(pa.table({"story": docs, "stars": [1, 2]}), tmp_path / "stories.parquet")
    cfg = TrainConfig(dataset=str(tmp_path / "stories.parquet"), text_column="story", block_size=8)
    assert settle(cfg).reason == "auto: text without labels"  # --text-column alone implies language modelling
    table = load_text_splits(cfg)
    assert table.tokenizer.decode(np.concatenate([table.train.tokens, table.validation.tokens])) == "\n".join(docs)


def test_byte_vocabulary_is_the_fallback_for_unknown_alphabets(tmp_path):
    text = "abc " * 100 + "ünïcödé " * 5  # the last 10 % holds characters the training text lacks
    (tmp_path / "t.txt").write_text(text)
    data = load_text_splits(TrainConfig(dataset=str(tmp_path / "t.txt"), block_size=8))
    assert data.tokenizer.kind == "byte" and data.tokenizer.size == 256
    assert data.tokenizer.decode(np.concatenate([data.train.tokens, data.validation.tokens])) == text
    with pytest.raises(ConfigError, match="--tokenizer char: the training text lacks characters"):
        load_text_splits(TrainConfig(dataset=str(tmp_path / "t.txt"), block_size=8, vocab="char"))
    assert load_text_splits(TrainConfig(dataset="shakespeare", vocab="byte")).tokenizer.kind == "byte"


def test_large_token_arrays_are_memory_mapped_from_a_cache_and_equal_the_in_memory_ones(monkeypatch, tmp_path):
    in_memory = load_text_splits(TrainConfig(dataset="shakespeare"))
    monkeypatch.setattr(text_module, "MEMMAP_TOKENS", 1000)
    monkeypatch.setattr(text_module, "token_cache_dir", lambda: tmp_path)
    mapped = load_text_splits(TrainConfig(dataset="shakespeare"))
    assert isinstance(mapped.train.tokens, np.memmap) and isinstance(mapped.validation.tokens, np.memmap)
    assert np.array_equal(mapped.train.tokens, in_memory.train.tokens) and np.array_equal(
        mapped.validation.tokens, in_memory.validation.tokens
    )
    assert len(list(tmp_path.iterdir())) == 2  # one cache file per split, reused by the next load (and the other ranks)
    again = load_text_splits(TrainConfig(dataset="shakespeare"))
    assert np.array_equal(again.train.tokens, in_memory.train.tokens)


def test_vocab_round_trips_and_rejects_unknown_characters():
    vocab = Vocab("char", "\n !abc")
    assert vocab.decode(vocab.encode("abc !\n")) == "abc !\n"
    with pytest.raises(KeyError):
        vocab.encode("abz")
    assert Vocab.from_json(vocab.to_json()).chars == vocab.chars
    assert Vocab("byte").decode(Vocab("byte").encode("héllo")) == "héllo"


# --------------------------------------------------------------------------- training


def test_a_short_run_learns_more_than_character_frequencies(trained):
    run_dir, summary = trained
    check_fingerprint("lm_tiny", run_dir)
    # ln(65) = 4.17 at the start; the unigram model of the training text scores 3.35 on validation
    assert summary["val_loss"] < 2.95 < UNIGRAM_VAL_LOSS  # measured 2.73
    assert summary["val_perplexity"] == pytest.approx(math.exp(summary["val_loss"]))
    assert summary["task"] == "lm" and summary["vocab_size"] == 65 and summary["optimizer_steps"] == 300
    assert "test_loss" not in summary  # no test split in nanoGPT's split
    evals = [m for m in read_metrics(run_dir) if m["kind"] == "eval"]
    assert [m["step"] for m in evals] == [100, 200, 300] and evals[0]["loss"] > evals[-1]["loss"]
    train_lines = [m for m in read_metrics(run_dir) if m["kind"] == "train"]
    assert len(train_lines) == 30 and train_lines[0]["loss"] > 3.5 > train_lines[-1]["loss"]
    # tokens/s: every target position counts, 32 per window
    assert all(m["tokens_per_s"] == pytest.approx(32 * m["samples_per_s"]) for m in train_lines)
    assert summary["tokens_per_s"] == pytest.approx(32 * summary["samples_per_s"]) and summary["first_step_s"] > 0


def test_the_vocabulary_travels_with_the_weights_and_sampling_uses_it(trained, capsys):
    run_dir, _ = trained
    model = load_model(run_dir)
    assert model.block_size == 32
    text = sample(str(run_dir), prompt="ROMEO:", tokens=60, temperature=0.8, seed=1)
    assert text.startswith("ROMEO:") and len(text) == 66 and set(text) <= set(SHAKESPEARE)
    assert text == sample(str(run_dir), prompt="ROMEO:", tokens=60, temperature=0.8, seed=1)  # seeded
    long_prompt = SHAKESPEARE[:500]  # longer than the 32-token context: cropped, not an error
    assert sample(str(run_dir), prompt=long_prompt, tokens=5).startswith(long_prompt)
    main(["sample", str(run_dir), "--prompt", "JULIET:", "--tokens", "20", "--top-k", "5"])
    out = capsys.readouterr().out
    assert out.startswith("JULIET:") and len(out.rstrip("\n")) >= 20


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--prompt", "héllo wörld"], "--prompt: characters not in the run's vocabulary: 'éö'"),
        (["--prompt", ""], "--prompt must not be empty"),
        (["--temperature", "0"], "--temperature must be positive"),
        (["--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--min-p", "1.5"], "--min-p must be in [0, 1]"),
        (["--repetition-penalty", "-1"], "--repetition-penalty must be positive"),
        (["--top-p", "0.9"], "--top-p: the gpt samples as nanoGPT does, with --temperature and --top-k only"),
        (["--repetition-penalty", "1.2"], "--repetition-penalty: the gpt samples as nanoGPT does"),
    ],
)
def test_sampling_bad_input_is_one_line_exit_2(trained, capsys, argv, expected):
    run_dir, _ = trained
    with pytest.raises(SystemExit) as exc:
        main(["sample", str(run_dir), *argv])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and expected in err, err


def test_sampling_from_a_classification_run_is_refused(tmp_path, capsys):
    train(TrainConfig(epochs=1, hidden_sizes=[8], progress=False, output_dir=str(tmp_path / "clf")))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["sample", str(tmp_path / "clf")])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and err == "anytrain sample: error: run_dir: --task classify does not sample text"


def test_gradient_accumulation_equals_the_bigger_batch_for_the_lm(tmp_path):
    common = {"max_steps": 12, "optimizer": "sgd", "lr": 0.5, "momentum": 0.0, "eval_windows": 20, "log_every_steps": 1}
    train(lm_config(tmp_path, "accum", batch_size=4, grad_accum_steps=4, **common))
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    train(lm_config(tmp_path, "big", batch_size=16, **common))
    diff = max_abs_diff(load_model(tmp_path / "accum").state_dict(), load_model(tmp_path / "big").state_dict())
    assert diff < 1e-6, diff  # the same 16 windows per update, summed in another order: measured 2.8e-8
    accum = [m["loss"] for m in read_metrics(tmp_path / "accum") if m["kind"] == "train"]
    big = [m["loss"] for m in read_metrics(tmp_path / "big") if m["kind"] == "train"]
    assert accum == pytest.approx(big, abs=1e-5)


def test_early_stopping_on_the_validation_loss(tmp_path):
    summary = train(
        lm_config(
            tmp_path, max_steps=200, eval_every_steps=10, early_stopping_patience=2, early_stopping_min_delta=100.0
        )
    )
    assert summary["optimizer_steps"] == 30  # best at the first validation (step 10), two more without improvement
    assert summary["stopped_early_at_epoch"] == 0


def test_bf16_autocast_on_cpu_trains_the_gpt(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # what `accelerate launch` exports for bf16.yaml
    seen = []
    original = torch.nn.functional.scaled_dot_product_attention

    def watch(q, *args, **kwargs):
        seen.append(q.dtype)
        return original(q, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", watch)
    summary = train(lm_config(tmp_path, n_layer=1, n_embd=16, block_size=16, max_steps=40, eval_windows=20))
    assert summary["scenario"]["mixed_precision"] == "bf16" and torch.bfloat16 in seen
    assert summary["val_loss"] < math.log(65)  # it learned something in bf16


def test_compile_without_a_cxx_compiler_says_so_in_one_line_and_runs_eager(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR")  # what `accelerate launch` exports for cpu_compile.yaml
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    summary = train(lm_config(tmp_path, max_steps=5, eval_windows=10))
    warning = (
        "torch.compile (inductor) was requested but TorchInductor on the CPU needs a C++ compiler and "
        "'/nonexistent/g++' was not found"
    )
    assert summary["scenario"]["compile"] is None and any(warning in w for w in summary["scenario"]["warnings"])
    assert f"anytrain: WARNING: {warning}" in capsys.readouterr().out


# --------------------------------------------------------------------------- bad input


def test_bad_text_input_is_one_line_naming_the_option_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "blank.txt").write_text("   \n\n\t  \n")
    (tmp_path / "short.txt").write_text("abcdefghij" * 50)  # 450 training, 50 validation characters
    pq.write_table(pa.table({"text": ["some words here " * 20], "n": [3]}), tmp_path / "t.parquet")
    out = str(tmp_path / "out")
    cases = [
        (["--dataset", str(tmp_path / "blank.txt")], "holds no text (empty or whitespace only)"),
        (["--dataset", str(tmp_path / "short.txt"), "--block-size", "64"], "--block-size: the validation split of"),
        (["--dataset", str(tmp_path / "t.parquet"), "--text-column", "n"], "--text-column: column 'n' of"),
        (["--dataset", str(tmp_path / "t.parquet"), "--text-column", "body"], "--text-column: column 'body' not in"),
        (["--dataset", str(tmp_path / "missing.txt")], "--dataset: file not found"),
        (["--dataset", "shakespeare", "--model", "mlp"], "--model mlp does not fit --task lm"),
        (["--dataset", "shakespeare", "--n-head", "3"], "--n-head (3) must divide --n-embd (128)"),
    ]
    for argv, expected in cases:
        err = run_cli_error(capsys, [*argv, "--output-dir", out])
        assert expected in err, (argv, err)
        assert not (tmp_path / "out").exists()


def test_resuming_with_a_block_size_beyond_the_positional_table_is_refused(tmp_path, capsys):
    train(lm_config(tmp_path, max_steps=4, eval_windows=10))
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    args = [
        "--dataset",
        "shakespeare",
        "--n-layer",
        "2",
        "--n-head",
        "2",
        "--n-embd",
        "32",
        "--batch-size",
        "16",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "10",
        "--dropout",
        "0",
        "--eval-windows",
        "10",
        "--max-steps",
        "8",
        "--output-dir",
        str(tmp_path / "run"),
    ]
    err = run_cli_error(capsys, [*args, "--block-size", "64", "--resume"])
    assert "--block-size 64 is beyond the positional table of the model in" in err and "(32 positions)" in err
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before and read_summary(tmp_path / "run")[
        "optimizer_steps"
    ] == 4
