"""Sequence to sequence (`--task seq2seq`) with a transformers encoder-decoder, offline: a tiny BART
(tests/hfmodels.py) learns a word-by-word translation (tests/pairdata.py) to exact match and BLEU 100,
scored by generation during evaluation (BLEU by sacrebleu, from per-sentence statistics summed over
batches and ranks: the same as sacrebleu's corpus BLEU); `anytrain predict` generates what transformers'
own from_pretrained(run_dir/hf).generate does; `anytrain sample` samples, the same for the same seed; the
loss is the mean over the step's target tokens (accumulation = big batch, 2 ranks = 1 rank); a SIGKILL
then --resume is bit-identical; bad input is one line.

Data: 324 generated pairs carved into 256 training rows, 33 validation and 35 test."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import run_cli_error
from hfchecks import big_batch, check_accumulation, check_kill_and_resume, check_two_ranks, in_process
from hfmodels import tiny_bart, tiny_bert
from pairdata import corpus, pairs
from textdata import write_jsonl

from anytrain.predict import predict
from anytrain.sample import sample
from anytrain.tasks.hf_seq2seq import Seq2Seq, bleu_from_stats, bleu_stats

pytest.importorskip("transformers")
sacrebleu = pytest.importorskip("sacrebleu")

N = 324
S2S = f"--val-fraction {33.5 / N} --test-fraction {35.5 / N} --task seq2seq --max-length 16".split()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("s2s")
    return {
        "data": write_jsonl(root / "pairs.jsonl", pairs(N, seed=3)),
        "more": write_jsonl(root / "more.jsonl", pairs(600, seed=3)),
        "bart": tiny_bart(root / "bart", corpus()),
        "quick": tiny_bart(root / "quick", corpus(), init_std=0.1),  # learns in 3 epochs, not 15 (tests/hfmodels.py)
    }


def args(folders, *flags: str) -> list[str]:
    return ["--model", f"hf:{folders['bart']}", "--dataset", str(folders["data"]), *S2S, *flags]


@pytest.fixture(scope="module")
def reference(folders, tmp_path_factory):
    return big_batch(args(folders), tmp_path_factory.mktemp("s2s_big"))


def test_bleu_from_summed_sentence_statistics_is_sacrebleus_corpus_bleu():
    rng = random.Random(0)
    words = "the a river stone fluv petra le un de".split()
    refs = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 9))) for _ in range(200)]
    hyps = [" ".join(w for w in r.split() if rng.random() < 0.8) for r in refs]  # some empty
    summed = [sum(col) for col in zip(*bleu_stats(hyps, refs))]
    assert bleu_from_stats(summed) == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    halves = [[sum(c) for c in zip(*bleu_stats(h, r))] for h, r in ((hyps[:77], refs[:77]), (hyps[77:], refs[77:]))]
    assert bleu_from_stats([a + b for a, b in zip(*halves)]) == pytest.approx(bleu_from_stats(summed), abs=1e-12)


def test_the_bart_learns_to_translate_and_predict_generates_what_transformers_loads(folders, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    run_dir = tmp_path / "run"
    flags = ["--model", f"hf:{folders['quick']}", "--dataset", str(folders["more"]), *S2S[4:]]
    summary = in_process(run_dir, *flags, "--lr", "1e-3", "--epochs", "6", "--batch-size", "16", "--weight-decay", "0")
    assert summary["test_exact_match"] >= 0.9 and summary["test_bleu"] >= 90, summary  # measured 1.0, 100 (by epoch 3)
    rows = [{"source": "river stone the"}, {"source": "engine and cable"}]
    predicted = predict(str(run_dir), str(write_jsonl(tmp_path / "new.jsonl", rows)))
    assert [p["prediction"] for p in predicted] == ["fluv petra le", "moteur et kabel"], predicted
    model = AutoModelForSeq2SeqLM.from_pretrained(run_dir / "hf").eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "hf")
    enc = tokenizer([r["source"] for r in rows], return_tensors="pt", padding=True)
    with torch.no_grad():
        theirs = tokenizer.batch_decode(model.generate(**enc, max_new_tokens=16), skip_special_tokens=True)
    assert theirs == [p["prediction"] for p in predicted]
    text = sample(str(run_dir), prompt="river the", tokens=8, seed=1, temperature=0.5)
    assert text and text == sample(str(run_dir), prompt="river the", tokens=8, seed=1, temperature=0.5)


def test_token_weighted_accumulation_equals_one_big_batch(folders, reference, tmp_path, monkeypatch):
    check_accumulation(args(folders), reference, tmp_path, monkeypatch, Seq2Seq)


@pytest.mark.launch
def test_two_ranks_equal_one_rank_and_score_the_same(folders, reference, tmp_path):
    two = check_two_ranks(args(folders), reference, tmp_path)
    assert (two["val_exact_match"], two["val_bleu"]) == (reference[0]["val_exact_match"], reference[0]["val_bleu"])


@pytest.mark.launch
def test_sigkill_mid_run_then_resume_is_bit_identical(folders, tmp_path):
    check_kill_and_resume(args(folders), tmp_path, "seq2seq")


def test_bad_pairs_are_one_line_and_write_nothing(folders, tmp_path, capsys):
    out = tmp_path / "out"
    good = pairs(40, seed=1)
    cases = {
        "no_target": ([{"source": r["source"]} for r in good], "--label-column: column 'target' not in"),
        "number": ([{**r, "target": 7} for r in good], "--label-column: column 'target' of"),
        "blank": ([{**good[0], "target": "  "}, *good[1:]], "has an empty text in column 'target'"),
    }
    for name, (rows, expected) in cases.items():
        data = write_jsonl(tmp_path / f"{name}.jsonl", rows)
        err = run_cli_error(
            capsys, ["--model", f"hf:{folders['bart']}", "--dataset", str(data), *S2S[4:], "--output-dir", str(out)]
        )
        assert expected in err, (name, err)
    bert = tiny_bert(tmp_path / "bert")
    err = run_cli_error(
        capsys, ["--model", f"hf:{bert}", "--dataset", str(folders["data"]), *S2S, "--output-dir", str(out)]
    )
    assert "a bert model has no sequence-to-sequence head" in err
    assert not out.exists()
