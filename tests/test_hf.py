"""Transformers models through the same loop (`--model hf:FOLDER`), offline: a tiny BERT that classifies
the generated topics and saves what transformers loads back; a tiny GPT-2 (tied embeddings, no pad
token of its own) whose loss is the mean over every real token of the optimizer step's global batch,
so 4 accumulated micro-batches equal one big batch and 2 gloo ranks equal 1 rank, with padded texts of
very uneven lengths; a SIGKILL then --resume, bit for bit; bf16 autocast; `sample` and `predict`; and
bad input (one line, exit 2, nothing written). The models are built by tests/hfmodels.py.

Data: 324 generated texts (tests/textdata.py, 1 to 49 words) carved into 256 training rows, 33
validation and 35 test rows, as in test_textcls_launch.py.
"""

from __future__ import annotations

import json
import random
import shutil
import sys

import pytest
import torch
from conftest import kill_and_resume, launch, max_abs_diff, read_metrics, read_summary
from hfchecks import in_process
from hfmodels import tiny_bert, tiny_gpt2
from textdata import texts, write_jsonl

from anytrain import load_model
from anytrain.cli import main
from anytrain.config import parse_config
from anytrain.sample import sample
from anytrain.tasks.hf_lm import HFCausalLM

pytest.importorskip("transformers")

N = 324
SPLIT = f"--text-column text --val-fraction {33.5 / N} --test-fraction {35.5 / N}".split()
LM = [*SPLIT, *"--task lm --max-length 64 --lr 2e-3 --warmup-steps 2 --log-every-steps 1".split()]
WEIGHT_TOL = 1e-6  # the project's tolerance (docs/equivalence.md), for losses
# Weights after 8 AdamW steps: the same sums in another order (one batch of 695 tokens or four of about
# 170) differ in float32's last bits, and AdamW's normalised steps carry that to about 5e-6.
HF_TOL = 2e-5


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    data = write_jsonl(root / "texts.jsonl", texts(N, seed=3))
    return {"data": data, "bert": tiny_bert(root / "bert"), "gpt2": tiny_gpt2(root / "gpt2")}


def lm_args(folders, *flags: str) -> list[str]:
    return ["--model", f"hf:{folders['gpt2']}", "--dataset", str(folders["data"]), *LM, *flags]


@pytest.fixture(scope="module")
def big_batch(folders, tmp_path_factory):
    """The GPT-2, 1 process x batch 16, in-process: the reference for 4 accumulated x 4 and 2 ranks x 8."""
    run_dir = tmp_path_factory.mktemp("big_batch")
    return in_process(run_dir, *lm_args(folders, "--batch-size", "16", "--max-steps", "8")), run_dir


# --------------------------------------------------------------------------- classify


def test_the_bert_learns_the_topics_and_transformers_loads_the_result(folders, tmp_path, capsys):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    run_dir = tmp_path / "bert"
    flags = ["--model", f"hf:{folders['bert']}", "--dataset", str(folders["data"]), *SPLIT, "--label-column", "label"]
    summary = in_process(run_dir, *flags, *"--epochs 5 --lr 2e-3 --warmup-steps 4 --max-length 64".split())
    assert summary["task"] == "classify" and summary["model"] == f"hf:{folders['bert']}"
    assert summary["test_accuracy"] >= 0.85, summary["test_accuracy"]  # chance 0.5; measured 0.97
    hf = AutoModelForSequenceClassification.from_pretrained(run_dir / "hf").eval()
    assert hf.config.id2label == {0: "nature", 1: "tech"} and hf.config.label2id == {"nature": 0, "tech": 1}
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "hf")
    batch = tokenizer(["the river and the pine", "a server with a kernel cache"], padding=True, return_tensors="pt")
    ours = load_model(run_dir)
    with torch.no_grad():
        theirs, mine = hf(**batch).logits, ours(**batch).logits
    assert torch.allclose(theirs, mine, atol=1e-6) and theirs.argmax(-1).tolist() == [0, 1]
    capsys.readouterr()
    main(["predict", str(run_dir), "--dataset", str(folders["data"])])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == N and sum(r["class_name"] == r["label"] for r in rows) / N >= 0.85


# --------------------------------------------------------------------------- token-weighted loss


def test_the_texts_are_padded_unevenly(folders):
    from anytrain.tasks.settle import load

    _, _, data = load(parse_config(lm_args(folders)))
    lengths = data.train.lengths
    assert (len(data.train), len(data.validation), len(data.test)) == (256, 33, 35)
    assert lengths.min() <= 4 and lengths.max() >= 60 and data.train.tokenizer.pad_token == "<|endoftext|>"
    inputs, targets = data.train.__getitems__([0, 1, 2])
    assert ((targets == -100) == (inputs["attention_mask"] == 0)).all()  # padding never has a label


def test_per_micro_batch_means_would_not_equal_the_big_batch(folders):
    """The control: the plain mean over each micro-batch's tokens, averaged over micro-batches, gives
    another gradient than the mean over all the tokens, by far more than the tolerance."""
    from transformers import AutoModelForCausalLM

    from anytrain.tasks.settle import load

    _, _, data = load(parse_config(lm_args(folders)))
    model = AutoModelForCausalLM.from_pretrained(folders["gpt2"])

    def grad(batches, **kwargs):
        model.zero_grad()
        for inputs, targets in batches:
            (model(**inputs, labels=targets, **kwargs).loss / len(batches)).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    big = grad([data.train.__getitems__(list(range(16)))])
    micro = grad([data.train.__getitems__(list(range(k, k + 4))) for k in range(0, 16, 4)])
    assert (big - micro).abs().max() > 1000 * WEIGHT_TOL


def test_token_weighted_accumulation_equals_one_big_batch(folders, big_batch, tmp_path, monkeypatch):
    one, one_dir = big_batch
    flags = ("--batch-size", "4", "--grad-accum-steps", "4", "--max-steps", "8")
    accum = in_process(tmp_path / "accum", *lm_args(folders, *flags))
    assert accum["optimizer_steps"] == one["optimizer_steps"] == 8
    diff = max_abs_diff(load_model(tmp_path / "accum").state_dict(), load_model(one_dir).state_dict())
    assert diff < HF_TOL, diff
    losses = [[m["loss"] for m in read_metrics(d) if m["kind"] == "train"] for d in (tmp_path / "accum", one_dir)]
    assert losses[0] == pytest.approx(losses[1], abs=WEIGHT_TOL)
    assert accum["val_loss"] == pytest.approx(one["val_loss"], abs=HF_TOL)
    # the control: without the step's token count each micro-batch is a mean of its own (the bug)
    monkeypatch.setattr(HFCausalLM, "step_shares", False)
    in_process(tmp_path / "plain", *lm_args(folders, *flags))
    plain = max_abs_diff(load_model(tmp_path / "plain").state_dict(), load_model(one_dir).state_dict())
    assert plain > 100 * HF_TOL, plain
    print(f"weights vs one batch of 16: token-weighted 4 x 4 {diff:.2e}, per-micro-batch means {plain:.2e}")


@pytest.mark.launch
def test_two_ranks_equal_one_rank_with_the_token_weighted_loss(folders, big_batch, tmp_path):
    one, one_dir = big_batch
    two_dir = tmp_path / "two"
    result = launch(
        "multi_cpu.yaml", *lm_args(folders, "--batch-size", "8", "--max-steps", "8"), "--output-dir", str(two_dir)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    two = read_summary(two_dir)
    assert two["scenario"]["num_processes"] == 2 and len(set(two["weights_sha256_per_rank"])) == 1
    diff = max_abs_diff(load_model(two_dir).state_dict(), load_model(one_dir).state_dict())
    assert diff < HF_TOL, diff
    assert two["val_loss"] == pytest.approx(one["val_loss"], abs=HF_TOL)
    print(f"weights, 2 ranks x 8 vs 1 x 16: {diff:.2e}; val loss {abs(two['val_loss'] - one['val_loss']):.2e}")
    assert two["val_loss"] < read_metrics(one_dir)[0]["loss"]  # it learned in 8 steps
    text = sample(str(one_dir), prompt="the river", tokens=12, seed=1)
    assert (
        text.startswith("the river")
        and len(text) > len("the river")
        and text == sample(str(one_dir), prompt="the river", tokens=12, seed=1)
    )


# --------------------------------------------------------------------------- resume, bf16


@pytest.mark.launch
def test_sigkill_mid_run_then_resume_is_bit_identical(folders, tmp_path):
    kill_step = random.Random("hf").randint(8, 25)
    print(f"kill step {kill_step} of 30")
    flags = "--batch-size 8 --grad-accum-steps 2 --max-steps 30 --epochs 10 --checkpoint-every-steps 4"
    args = lm_args(folders, *flags.split(), "--no-progress")
    kill_and_resume(tmp_path, args, kill_step, env={"OMP_NUM_THREADS": "1"})
    ref, res = load_model(tmp_path / "reference").state_dict(), load_model(tmp_path / "victim").state_dict()
    assert all(torch.equal(ref[k], res[k]) for k in ref), "weights differ"
    assert [(m["step"], m["loss"]) for m in read_metrics(tmp_path / "reference")] == [
        (m["step"], m["loss"]) for m in read_metrics(tmp_path / "victim")
    ]
    assert read_summary(tmp_path / "victim")["resumed_from"] is not None
    assert (tmp_path / "victim" / "hf" / "model.safetensors").is_file()


def test_bf16_autocast_on_cpu_fine_tunes_the_gpt2(folders, tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # what `accelerate launch` exports for bf16.yaml
    from transformers.models.gpt2.modeling_gpt2 import GPT2Model

    seen, lengths = [], set()
    original, backbone = torch.nn.functional.linear, GPT2Model.forward

    def watch(x, *args, **kwargs):  # GPT-2's output layer (its blocks use Conv1D), chunk by chunk (lmhead.py)
        out = original(x, *args, **kwargs)
        seen.append(out.dtype)  # autocast casts inside the op: its output tells
        return out

    def batch_width(self, input_ids=None, *args, **kwargs):
        lengths.add(input_ids.shape[-1])  # the padded length of the batch
        return backbone(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "linear", watch)
    monkeypatch.setattr(GPT2Model, "forward", batch_width)
    summary = in_process(tmp_path / "bf16", *lm_args(folders, "--batch-size", "8", "--max-steps", "6"))
    assert summary["scenario"]["mixed_precision"] == "bf16" and torch.bfloat16 in seen
    assert len(lengths) > 1 and all(n % 8 == 0 for n in lengths), lengths  # per batch, to a multiple of 8
    first = read_metrics(tmp_path / "bf16")[0]["loss"]
    assert summary["val_loss"] < first  # it learned in bf16


# --------------------------------------------------------------------------- bad input


def one_line_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_bad_input_is_one_line_naming_the_option_and_writes_nothing(folders, tmp_path, capsys, monkeypatch):
    data, bert = str(folders["data"]), folders["bert"]
    labelled = ["--dataset", data, "--text-column", "text", "--label-column", "label"]
    no_config = tmp_path / "no_config"
    no_config.mkdir()
    no_tokenizer = tmp_path / "no_tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(bert / name, no_tokenizer / name)
    numbers = write_jsonl(tmp_path / "numbers.jsonl", [{"n": k, "label": "ab"[k % 2]} for k in range(20)])
    vit = tmp_path / "vit"
    from transformers import ViTConfig

    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32).save_pretrained(vit)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(bert / name, vit / name)
    cases = [
        ([f"hf:{no_config}", *labelled], "no config.json"),
        ([f"hf:{tmp_path / 'absent'}", *labelled], "does not exist"),
        ([f"hf:{no_tokenizer}", *labelled], "no tokenizer in this folder"),
        ([f"hf:{vit}", *labelled], "a vit model has no sequence-classification head"),
        ([f"hf:{bert}", *labelled, "--max-length", "129"], "--max-length 129 exceeds the 128 positions"),
        ([f"hf:{bert}", "--dataset", str(numbers), "--text-column", "n", "--label-column", "label"], "is not text"),
        ([f"hf:{bert}", *labelled, "--task", "regress"], "models train --task classify, distill, dpo, grpo, kto, lm"),
    ]
    for argv, expected in cases:
        out = tmp_path / "out"
        err = one_line_error(capsys, ["--model", *argv, "--output-dir", str(out)])
        assert expected in err, (expected, err)
        assert not out.exists()
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    err = one_line_error(capsys, ["--model", f"hf:{bert}", *labelled, "--output-dir", str(tmp_path / "out")])
    assert "transformers is not installed; pip install 'anytrain[hf]'" in err


def test_a_head_for_another_label_count_is_replaced_by_a_new_one(folders):
    """The tiny BERT was saved with a 2-label head; 3 classes get a new 3-label head (as run_glue does)."""
    from anytrain import hf

    cfg = parse_config(["--model", f"hf:{folders['bert']}", "--max-length", "64"])
    tokenizer = hf.load_tokenizer(cfg)
    from anytrain.tasks.hf_text import HFClassification

    head = HFClassification.head
    config = hf.model_config(cfg, head, "classify", tokenizer.pad_token_id, ["a", "b", "c"])
    model = hf.load_model(cfg, head, config)
    assert model.classifier.out_features == 3 and model.config.id2label == {0: "a", 1: "b", 2: "c"}
