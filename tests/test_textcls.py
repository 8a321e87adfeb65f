"""Text classification: batches padded per batch and truncated, padding that never changes a result, the
tokenizers (BPE trained on the training split only), short runs that learn, predict with the run's own
tokenizer, BPE for the language model, the --vocab alias, and bad input (one line, exit 2, nothing written).
The text is generated (tests/textdata.py). The 1-vs-2-rank, accumulation and resume scenarios are in
test_textcls_launch.py."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import datasets
import pytest
import torch
import yaml
from textdata import texts, write_jsonl

from anytrain import TrainConfig
from anytrain.checkpoint import check_compatible
from anytrain.cli import main
from anytrain.config import ConfigError, ModelConfig, parse_config, saved_options
from anytrain.data.textcls import PAD, SPECIALS, UNK, TokenRows, encode_texts, load_text_class_splits
from anytrain.data.tokenizer import Vocab
from anytrain.models import build_bag, build_encoder
from anytrain.sample import sample
from anytrain.shape import DataShape
from anytrain.trainer import train
from anytrain.usermodel import make_model

TINY = dict(text_column="text", label_column="label", n_layer=1, n_head=2, n_embd=32, dropout=0.0, progress=False)


def predictions(capsys, run_dir: Path, dataset: Path, *extra: str) -> list[dict]:
    main(["predict", str(run_dir), "--dataset", str(dataset), *extra])
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def cli_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    return err


# --------------------------------------------------------------------------- batches and models


def test_batches_are_padded_to_their_longest_text_and_truncated_at_max_length():
    vocab = Vocab("char", " abc")  # ' ' a b c -> 0 1 2 3, shifted by SPECIALS
    tokens, offsets, truncated = encode_texts(vocab, [["ab", "c", "abcabc", "zz a"]], max_length=4)
    rows = TokenRows(tokens, offsets, torch.tensor([0, 1, 0, 1]))
    inputs, targets = rows.__getitems__([1, 0])
    assert inputs.dtype == torch.int64 and targets.tolist() == [1, 0]
    assert inputs.tolist() == [[SPECIALS + 3, PAD], [SPECIALS + 1, SPECIALS + 2]]  # padded to the batch's longest
    assert rows.__getitems__([1])[0].shape == (1, 1)  # a batch of short texts is short
    inputs, _ = rows.__getitems__([2, 3])
    assert truncated == 1 and inputs.shape == (2, 4)  # "abcabc" keeps its first 4 tokens
    assert inputs[1].tolist() == [UNK, UNK, SPECIALS + 0, SPECIALS + 1]  # 'z' is not in the training text


def build_bag_of_ngrams(model: ModelConfig, shape: DataShape):
    return build_bag(dataclasses.replace(model, ngrams=3, ngram_buckets=64), shape)


@pytest.mark.parametrize("build", [build_encoder, build_bag, build_bag_of_ngrams])
def test_padding_never_changes_a_texts_logits_or_gradients(build):
    shape = DataShape("tokens", num_classes=3, vocab_size=20, max_length=16, pad_id=PAD)
    torch.manual_seed(0)
    model = build(ModelConfig(n_layer=2, n_head=2, n_embd=16, dropout=0.0, hidden_sizes=[8]), shape)
    text = torch.randint(SPECIALS, 20, (1, 5))
    padded = torch.cat([text, torch.full((1, 11), PAD)], 1)
    batch = torch.cat([padded, torch.randint(SPECIALS, 20, (1, 16))])  # beside a full-length text

    def grads(inputs):
        model.zero_grad()
        logits = model(inputs)[:1]
        torch.nn.functional.cross_entropy(logits, torch.tensor([2])).backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    (alone, g_alone), (in_batch, g_batch) = grads(text), grads(batch)
    assert (alone - in_batch).abs().max() < 1e-6
    assert max((g_alone[n] - g_batch.get(n, torch.zeros_like(g))).abs().max() for n, g in g_alone.items()) < 1e-6


def test_the_bag_adds_each_run_of_2_to_n_real_tokens_as_one_hashed_row():
    shape = DataShape("tokens", num_classes=2, vocab_size=20, max_length=16, pad_id=PAD)
    bag = build_bag(ModelConfig(ngrams=3, ngram_buckets=1000, hidden_sizes=[]), shape)
    assert bag.embed.num_embeddings == 20 + 1000
    a, b, c = SPECIALS, SPECIALS + 1, SPECIALS + 2
    features = bag.features(torch.tensor([[a, b, c, PAD], [c, a, b, c]]))
    assert features.shape == (2, 4 + 3 + 2)  # the tokens, then the 2-grams, then the 3-grams
    first, second = features.tolist()
    assert first[:4] == [a, b, c, PAD] and first[6] == first[8] == PAD  # b c + padding, c + padding: none
    assert all(20 <= row < 1020 for row in first[4:6] + first[7:8] + second[4:])
    assert first[4:6] == second[5:7] and first[7] == second[8]  # "a b", "b c" and "a b c" wherever they are
    assert len({*first[4:6], first[7]}) == 3  # here no two n-grams share a bucket
    assert build_bag(ModelConfig(hidden_sizes=[]), shape).embed.num_embeddings == 20  # --ngrams 1: no buckets


def test_a_users_factory_gets_the_tokens_shape_and_its_logits_are_checked():
    shape = DataShape("tokens", num_classes=2, vocab_size=30, max_length=8, pad_id=PAD)
    seen = []

    def factory(model, shape):
        seen.append(shape.example_inputs(2))
        return torch.nn.Sequential(torch.nn.Embedding(shape.vocab_size, 4), torch.nn.Flatten(), torch.nn.LazyLinear(2))

    make_model(ModelConfig(name="mine"), shape, factory)
    assert seen[0].shape == (2, 8) and (seen[0][1, 4:] == PAD).all() and (seen[0][0] != PAD).all()
    with pytest.raises(ConfigError, match=r"maps inputs of shape \(2, 8\) to \(2, 8, 4\); expected logits of shape"):
        make_model(ModelConfig(name="mine"), shape, lambda m, s: torch.nn.Embedding(s.vocab_size, 4))


# --------------------------------------------------------------------------- tokenizers


def test_bpe_is_trained_on_the_training_split_only_and_round_trips():
    train_rows, val_rows = texts(200, seed=1), [{"text": "zebra quagga " * 30, "label": "tech"}] * 20
    given = datasets.DatasetDict(
        train=datasets.Dataset.from_list(train_rows), validation=datasets.Dataset.from_list(val_rows)
    )
    data = load_text_class_splits(TrainConfig(**TINY, tokenizer="bpe", vocab_size=300, test_fraction=0.1), given)
    bpe = data.tokenizer
    assert bpe.kind == "bpe" and bpe.size == 300 and data.shape.vocab_size == 300 + SPECIALS
    assert not any("zeb" in token or "quag" in token for token in bpe.tokenizer.get_vocab())  # never saw them
    assert {"Ġthe", "Ġand", "Ġfrom"} <= set(bpe.tokenizer.get_vocab())  # whole words of the training text
    for text in ("zebra quagga", "héllo wörld 日本", train_rows[0]["text"]):
        assert bpe.decode(bpe.encode(text)) == text  # byte-level: anything encodes, exactly
    lengths = data.validation.offsets[1:] - data.validation.offsets[:-1]
    assert len(bpe.encode(val_rows[0]["text"])) > 256 and data.shape.max_length == 256 and (lengths == 256).all()


def test_auto_is_a_bpe_of_at_most_vocab_size_tokens_for_text_to_classify():
    given = datasets.Dataset.from_list(texts(100, seed=2))
    data = load_text_class_splits(TrainConfig(**TINY, vocab_size=100_000), given)  # more than the text supports
    assert data.tokenizer.kind == "bpe" and 256 < data.tokenizer.size < 1000
    assert load_text_class_splits(TrainConfig(**TINY, vocab_size=300), given).tokenizer.size == 300


# --------------------------------------------------------------------------- short runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs on 700 generated texts: the encoder on a 300-token BPE, and --model auto on characters."""
    from accelerate.state import AcceleratorState

    folder = tmp_path_factory.mktemp("textcls")
    data = write_jsonl(folder / "train.jsonl", texts(700))
    common = dict(TINY, dataset=str(data), epochs=3, batch_size=32, warmup_steps=5)
    runs = {
        "encoder": dict(model="encoder", tokenizer="bpe", vocab_size=300, lr=3e-3),
        "auto": dict(tokenizer="char", lr=1e-2),
    }
    summaries = {}
    for name, options in runs.items():
        AcceleratorState._reset_state(True)
        summaries[name] = train(TrainConfig(**common, **options, output_dir=str(folder / name)))
    AcceleratorState._reset_state(True)
    return folder, summaries


def test_the_encoder_on_bpe_and_the_auto_model_on_characters_learn_the_topics(runs):
    folder, summaries = runs
    encoder, auto = summaries["encoder"], summaries["auto"]
    assert encoder["test_accuracy"] >= 0.9 and auto["test_accuracy"] >= 0.85, (encoder, auto)  # measured 0.97, 0.93
    assert (encoder["model"], encoder["tokenizer"], encoder["vocab_size"]) == ("encoder", "bpe", 302)
    assert (auto["model"], auto["tokenizer"], auto["task"]) == ("bag", "char", "classify")
    assert encoder["train_samples"] == 490 and encoder["samples_per_s"] > 0 and encoder["mean_tokens_per_text"] > 10
    assert encoder["tokens_per_s"] == pytest.approx(encoder["samples_per_s"] * encoder["mean_tokens_per_text"])
    assert (folder / "encoder" / "tokenizer.json").is_file() and not (folder / "auto" / "tokenizer.json").exists()


def test_predict_uses_the_runs_own_tokenizer_and_padding_does_not_change_it(runs, capsys):
    folder, _ = runs
    new = write_jsonl(folder / "new.jsonl", texts(150, seed=7))
    for name, least in (("encoder", 0.9), ("auto", 0.8)):  # as in training: measured 0.97 and 0.88
        preds = predictions(capsys, folder / name, new)
        assert len(preds) == 150 and {p["class_name"] for p in preds} <= {"nature", "tech"}
        assert sum(p["class_name"] == p["label"] for p in preds) / 150 >= least
        one_by_one = predictions(capsys, folder / name, new, "--batch-size", "1")  # no padding at all
        assert [p["class_id"] for p in one_by_one] == [p["class_id"] for p in preds]
        assert max(abs(a["probability"] - b["probability"]) for a, b in zip(one_by_one, preds)) < 1e-5


def test_a_changed_or_missing_tokenizer_file_is_refused_by_predict(runs, tmp_path, capsys):
    folder, _ = runs
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "model.safetensors").write_bytes((folder / "encoder" / "model.safetensors").read_bytes())
    new = write_jsonl(tmp_path / "new.jsonl", texts(3, seed=8))
    err = cli_error(capsys, ["predict", str(copy), "--dataset", str(new)])
    assert f"{copy / 'tokenizer.json'} is missing" in err
    tokenizer = json.loads((folder / "encoder" / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]  # another tokenizer of the same size
    (copy / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert "is not the tokenizer this run was trained with" in cli_error(
        capsys, ["predict", str(copy), "--dataset", str(new)]
    )


def test_the_gpt_trains_on_bpe_and_sample_decodes_it(tmp_path):
    from anytrain.data.text import SHAKESPEARE_PATH

    (tmp_path / "plays.txt").write_text(SHAKESPEARE_PATH.read_text()[:200_000])
    run = tmp_path / "lm"
    options = dict(dataset=str(tmp_path / "plays.txt"), tokenizer="bpe", vocab_size=512, n_layer=1, n_embd=32)
    summary = train(
        TrainConfig(
            **options,
            n_head=2,
            block_size=16,
            max_steps=30,
            eval_windows=20,
            lr=1e-2,
            output_dir=str(run),
            progress=False,
        )
    )
    assert summary["task"] == "lm" and summary["vocab_kind"] == "bpe" and summary["vocab_size"] == 512
    assert summary["val_loss"] < math.log(512) - 0.5  # uniform over 512 tokens: 6.24; measured 5.27
    assert (run / "tokenizer.json").is_file()
    text = sample(str(run), prompt="ROMEO:", tokens=30, seed=1)
    assert text.startswith("ROMEO:") and len(text) > 40 and text == sample(str(run), prompt="ROMEO:", tokens=30, seed=1)


# --------------------------------------------------------------------------- options and bad input


def test_vocab_is_the_tokenizers_earlier_name(tmp_path):
    assert parse_config(["--vocab", "byte"]).data.tokenizer == "byte"
    assert TrainConfig(vocab="char").data.tokenizer == "char"
    (tmp_path / "flat.yaml").write_text("vocab: byte\n")
    (tmp_path / "sectioned.yaml").write_text(yaml.safe_dump({"data": {"vocab": "char", "max_length": 32}}))
    assert parse_config(["--config", str(tmp_path / "flat.yaml")]).data.tokenizer == "byte"
    cfg = parse_config(["--config", str(tmp_path / "sectioned.yaml")])
    assert (cfg.data.tokenizer, cfg.data.max_length) == ("char", 32)
    assert saved_options({"data": {"vocab": "byte"}}) == {"tokenizer": "byte"}  # a run saved before the rename


def test_resuming_with_a_max_length_beyond_the_positional_table_is_refused():
    saved = TrainConfig(**TINY, dataset="x.jsonl", max_length=64).to_dict()
    with pytest.raises(ConfigError) as err:
        check_compatible(saved, TrainConfig(**TINY, dataset="x.jsonl", max_length=128), Path("ckpt"), "max_length")
    assert str(err.value) == (
        "--max-length 128 is beyond the positional table of the model in ckpt (64 positions); resume with "
        "--max-length 64"
    )


def test_bad_text_input_is_one_line_naming_the_option_or_file_and_writes_nothing(tmp_path, capsys):
    rows = texts(60)
    good = write_jsonl(tmp_path / "good.jsonl", rows)
    empty = write_jsonl(tmp_path / "empty.jsonl", rows[:5] + [{"text": "  ", "label": "tech"}] + rows[5:])
    numbers = write_jsonl(tmp_path / "numbers.jsonl", [{"text": i, "label": r["label"]} for i, r in enumerate(rows)])
    small = write_jsonl(
        tmp_path / "small.jsonl", [{"text": "ab ab ba", "label": "x"}, {"text": "ba", "label": "y"}] * 5
    )
    out = tmp_path / "out"
    cases = [
        ([empty], f"--dataset: row 5 of the train split of {empty} has an empty text in column 'text'"),
        ([numbers], f"--text-column: column 'text' of {numbers} is not text (Value('int64'"),
        ([good, "--text-column", "body"], f"--text-column: column 'body' not in {good} (columns: text, label)"),
        ([good, "--label-column", "topic"], "--label-column: column 'topic' not in"),
        ([small, "--tokenizer", "bpe", "--vocab-size", "300"], "--vocab-size 300: the training text of"),
        (
            [good, "--model", "mlp"],
            "--model mlp does not fit --task classify with --text-column (choose encoder or bag)",
        ),
        ([good, "--max-length", "0"], "--max-length must be positive, got 0"),
        ([good, "--vocab-size", "100"], "--vocab-size must be in [256, inf), got 100"),
        ([good, "--streaming", "--max-steps", "5"], "--streaming reads classification data"),
    ]
    for (dataset, *argv), expected in cases:
        args = ["--dataset", str(dataset), "--text-column", "text", "--label-column", "label", *argv]
        err = cli_error(capsys, [*args, "--no-progress", "--output-dir", str(out)])
        assert expected in err, (argv, err)
        assert not out.exists()
    args = ["--dataset", str(small), "--text-column", "text", "--label-column", "label", "--output-dir", str(out)]
    assert (
        "supports at most 260 BPE tokens (256 bytes and 4 merges, until every word is one token); use --vocab-size 260"
        in cli_error(capsys, [*args, "--tokenizer", "bpe"])
    )
