"""Token classification (`--task tag`) with a transformers model, offline: a tiny BERT (tests/hfmodels.py,
its masked-LM head replaced by a tag head) learns the generated people and places (tests/tagdata.py)
to an entity F1 of at least 0.9; entities are counted by seqeval's definition (checked against seqeval);
`anytrain predict` prints each word's tag, as transformers' own from_pretrained of run_dir/hf gives it;
the loss is the mean over the tagged words of the optimizer step, so 4 accumulated micro-batches equal
one big batch and 2 gloo ranks equal 1 rank; a SIGKILL then --resume, bit for bit; bad input is one line.

Data: 324 generated sentences (1 to 30 words) carved into 256 training rows, 33 validation and 35 test."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import run_cli_error
from hfchecks import big_batch, check_accumulation, check_kill_and_resume, check_two_ranks, in_process
from hfmodels import tiny_bert_mlm
from tagdata import tagged
from textdata import write_jsonl

from anytrain.predict import predict
from anytrain.tasks.hf_tag import TokenClassification
from anytrain.tasks.hf_tag.tagging import align_labels, entities, entity_counts, prf

pytest.importorskip("transformers")

N = 324
SPLIT = f"--val-fraction {33.5 / N} --test-fraction {35.5 / N}".split()
TAG = [*SPLIT, *"--task tag --text-column tokens --label-column tags --max-length 64".split()]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tag")
    return {
        "data": write_jsonl(root / "tags.jsonl", tagged(N, seed=3)),
        "more": write_jsonl(root / "more.jsonl", tagged(1000, seed=5)),  # 700 / 100 / 200: F1 measured over ~400
        "bert": tiny_bert_mlm(root / "bert"),
    }


def args(folders, *flags: str) -> list[str]:
    return ["--model", f"hf:{folders['bert']}", "--dataset", str(folders["data"]), *TAG, *flags]


@pytest.fixture(scope="module")
def reference(folders, tmp_path_factory):
    return big_batch(args(folders), tmp_path_factory.mktemp("tag_big"))


def test_entities_are_counted_as_seqeval_counts_them():
    from seqeval.metrics import f1_score, precision_score, recall_score

    rng = random.Random(0)
    alphabet = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "E-PER", "S-LOC", "I-MISC"]  # malformed runs included
    true = [[rng.choice(alphabet) for _ in range(rng.randint(1, 12))] for _ in range(300)]
    guess = [[t if rng.random() < 0.7 else rng.choice(alphabet) for t in row] for row in true]
    counts = [sum(c) for c in zip(*(entity_counts(g, t) for g, t in zip(guess, true)))]
    ours = prf(*counts)
    assert ours["precision"] == pytest.approx(precision_score(true, guess), abs=1e-12)
    assert ours["recall"] == pytest.approx(recall_score(true, guess), abs=1e-12)
    assert ours["f1"] == pytest.approx(f1_score(true, guess), abs=1e-12)
    assert entities(["O", "I-PER", "I-PER", "B-LOC"]) == {("PER", 1, 2), ("LOC", 3, 3)}  # conlleval: an I opens one
    assert entity_counts(["O", "I-PER", "I-PER"], ["B-PER", "I-PER", "I-PER"]) == (0, 1, 1)  # spans differ


def test_a_words_tag_goes_on_its_first_sub_token(folders):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folders["bert"])
    enc = tokenizer(["the", "Capuletti", "kernel"], is_split_into_words=True)  # not in the vocabulary
    labels = align_labels(enc.word_ids(), [0, 1, 2])
    pieces = enc.word_ids()
    assert pieces.count(1) > 1, "Capuletti should split into several word pieces here"
    assert labels[0] == labels[-1] == -100  # [CLS], [SEP]
    assert [label for label in labels if label != -100] == [0, 1, 2]


def test_the_bert_learns_the_tags_and_predict_gives_what_transformers_loads(folders, tmp_path):
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    run_dir = tmp_path / "run"
    flags = [*TAG[len(SPLIT) :], "--lr", "3e-3", "--epochs", "4", "--batch-size", "32"]
    summary = in_process(run_dir, "--model", f"hf:{folders['bert']}", "--dataset", str(folders["more"]), *flags)
    assert summary["task"] == "tag" and summary["task_reason"] == "--task tag"
    assert summary["test_f1"] >= 0.9 and summary["test_accuracy"] >= 0.97, (
        summary
    )  # measured 1.0 and 1.0 (the names are whole tokens)
    assert summary["tags"] == ["B-LOC", "B-PER", "I-PER", "O"] and summary["train_samples"] == 700
    rows = [{"tokens": ["Romeo", "met", "Marcus", "Brutus", "in", "Verona"]}, {"tokens": ["the", "river"]}]
    new = write_jsonl(tmp_path / "new.jsonl", rows)
    predicted = predict(str(run_dir), str(new))
    assert predicted[0]["words"] == rows[0]["tokens"]
    assert predicted[0]["tags"] == ["B-PER", "O", "B-PER", "I-PER", "O", "B-LOC"], predicted[0]
    assert predicted[1]["tags"] == ["O", "O"]
    model = AutoModelForTokenClassification.from_pretrained(run_dir / "hf").eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "hf")
    enc = tokenizer(rows[0]["tokens"], is_split_into_words=True, return_tensors="pt")
    with torch.no_grad():
        best = model(**enc).logits.argmax(-1)[0].tolist()
    first = {w: i for i, w in reversed(list(enumerate(enc.word_ids()))) if w is not None}
    assert [model.config.id2label[best[first[w]]] for w in range(6)] == predicted[0]["tags"]


def test_token_weighted_accumulation_equals_one_big_batch(folders, reference, tmp_path, monkeypatch):
    check_accumulation(args(folders), reference, tmp_path, monkeypatch, TokenClassification)


@pytest.mark.launch
def test_two_ranks_equal_one_rank(folders, reference, tmp_path):
    two = check_two_ranks(args(folders), reference, tmp_path)
    assert two["val_f1"] == reference[0]["val_f1"]


@pytest.mark.launch
def test_sigkill_mid_run_then_resume_is_bit_identical(folders, tmp_path):
    check_kill_and_resume(args(folders), tmp_path, "tag")


def test_bad_tagged_data_is_one_line_and_writes_nothing(folders, tmp_path, capsys):
    good = tagged(40, seed=1)
    cases = {
        "count": ([{**good[0], "tags": good[0]["tags"][:-1]}] + good[1:], "has", "tags for its"),
        "flat": ([{"tokens": " ".join(r["tokens"]), "tags": r["tags"]} for r in good], "not lists of words", ""),
        "scalar": ([{"tokens": r["tokens"], "tags": 1} for r in good], "not lists of tags", ""),
        "empty": ([{"tokens": [], "tags": []}] + good[1:], "row 0 of the train split", "has no words"),
    }
    out = tmp_path / "out"
    for name, (rows, *expected) in cases.items():
        data = write_jsonl(tmp_path / f"{name}.jsonl", rows)
        flags = ["--model", f"hf:{folders['bert']}", "--dataset", str(data), *TAG, "--output-dir", str(out)]
        err = run_cli_error(capsys, flags)
        assert all(e in err for e in expected) and err.count("\n") <= 1, (name, err)
        assert not out.exists()
    plain = ["--dataset", str(folders["data"]), *TAG, "--output-dir", str(out)]
    assert "--task tag trains a transformers model: --model hf:FOLDER_OR_ID" in run_cli_error(capsys, plain)
    assert "unknown task 'tags'" in run_cli_error(capsys, ["--task", "tags", "--output-dir", str(out)])
    data = write_jsonl(tmp_path / "missing.jsonl", good)
    flags = ["--model", f"hf:{folders['bert']}", "--dataset", str(data), *TAG, "--label-column", "ner"]
    assert "--label-column: column 'ner' not in" in run_cli_error(capsys, [*flags, "--output-dir", str(out)])
    assert not out.exists()
