"""Fine-tuning language models (issue 28): gradient checkpointing and LoRA.

--gradient-checkpointing recomputes each transformer block's activations in the backward pass instead of
keeping them: every block runs twice per training batch (counted here), and the weights after 8 AdamW
steps are those of the run that kept its activations. Peak memory: benchmarks/llm.py (figures).

LoRA through peft (--lora-r): the tiny GPT-2's own weights stay as they were loaded, its 8 linear
projections get adapters of rank 8 (16,384 of 150,272 parameters, said at start and in summary.json), and
the run learns. Checkpoints hold the adapters only, and a SIGKILLed run resumes bit-identical from them (tested
once, on sft's packed LoRA run: tests/test_sft.py); 4 accumulated
batches of 4 equal one batch of 16, and 2 ranks x 8 equal it (the token-weighted loss as in full
fine-tuning). At the end, run_dir/adapter loads with PeftModel.from_pretrained on the base model and
run_dir/hf (merged) with AutoModelForCausalLM.from_pretrained, both with the outputs of load_model(run).

Bad input is one line. Data: 324 generated texts (tests/textdata.py); the tiny GPT-2 of tests/hfmodels.py."""

from __future__ import annotations

import pytest
import torch
from conftest import max_abs_diff, read_metrics, run_cli_error
from hfchecks import big_batch, check_accumulation, check_two_ranks, in_process, loss_and_grads
from hfmodels import tiny_gpt2
from safetensors.torch import load_file
from textdata import texts, write_jsonl

from anytrain import load_model
from anytrain.tasks.hf_lm import HFCausalLM

pytest.importorskip("transformers")

N = 324
LM = f"--text-column text --val-fraction {33.5 / N} --test-fraction {35.5 / N} --task lm --max-length 64".split()
STEPS = ("--batch-size", "8", "--max-steps", "8", "--log-every-steps", "1", "--lr", "2e-3")
LORA = ("--lora-r", "8", "--lr", "1e-2")
TRAINABLE = 2 * 8 * ((64 + 192) + (64 + 64) + (64 + 256) + (256 + 64))  # 2 blocks x r x (in + out) of 4 projections


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm")
    return {"data": write_jsonl(root / "texts.jsonl", texts(N, seed=3)), "gpt2": tiny_gpt2(root / "gpt2")}


def args(folders, *flags: str) -> list[str]:
    return ["--model", f"hf:{folders['gpt2']}", "--dataset", str(folders["data"]), *LM, *flags]


# --------------------------------------------------------------------------- gradient checkpointing


def counted_blocks(monkeypatch) -> list[int]:
    """Counts the forwards of GPT-2 blocks' MLPs that build a graph (training, and the backward's recomputation).
    The MLP, not the block: transformers checkpoints a block only through the block's own forward."""
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

    calls, original = [0], GPT2MLP.forward

    def forward(self, *a, **k):
        calls[0] += torch.is_grad_enabled()
        return original(self, *a, **k)

    monkeypatch.setattr(GPT2MLP, "forward", forward)
    return calls


def test_gradient_checkpointing_recomputes_and_trains_the_same_weights(folders, tmp_path, monkeypatch, capsys):
    kept = counted_blocks(monkeypatch)
    plain = in_process(tmp_path / "plain", *args(folders, *STEPS))
    plain_calls = kept[0]
    kept[0] = 0
    checkpointed = in_process(tmp_path / "ckpt", *args(folders, *STEPS, "--gradient-checkpointing"))
    assert "gradient checkpointing: each block's activations are recomputed" in capsys.readouterr().out
    # the loss check on a batch of 2 (no backward), then 8 steps x 2 blocks: kept, or run again in the backward pass
    assert (plain_calls, kept[0]) == (2 + 16, 2 + 32)
    diff = max_abs_diff(load_model(tmp_path / "ckpt").state_dict(), load_model(tmp_path / "plain").state_dict())
    print(f"weights after 8 steps, checkpointed vs kept activations: {diff:.2e}")
    assert diff < 1e-6
    losses = [
        [m["loss"] for m in read_metrics(d) if m["kind"] == "train"] for d in (tmp_path / "ckpt", tmp_path / "plain")
    ]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6) and len(losses[0]) == 8
    assert checkpointed["gradient_checkpointing"] is True and plain["gradient_checkpointing"] is False
    assert checkpointed["val_loss"] == pytest.approx(plain["val_loss"], rel=1e-6)


def test_gradient_checkpointing_of_a_model_that_is_not_a_transformers_one_is_one_line(capsys, tmp_path):
    err = run_cli_error(capsys, ["--gradient-checkpointing", "--output-dir", str(tmp_path / "run")])
    assert "--gradient-checkpointing recomputes the blocks of transformers models (--model hf:...) only" in err
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- LoRA


def lora_args(folders, *flags: str) -> list[str]:
    return args(folders, *LORA, *flags)


@pytest.fixture(scope="module")
def trained(folders, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lora_run")
    return in_process(
        run_dir, *lora_args(folders, "--epochs", "3", "--batch-size", "16", "--log-every-steps", "1")
    ), run_dir


def test_only_the_adapters_train_and_the_run_learns(folders, trained):
    summary, run_dir = trained
    assert (summary["trainable_parameters"], summary["parameters"]) == (TRAINABLE, 150_272) and TRAINABLE == 16_384
    first = read_metrics(run_dir)[0]["loss"]
    assert summary["val_loss"] < first - 0.15, (first, summary["val_loss"])  # measured 5.95 -> 5.60
    # the model's own weights are those it was loaded with
    base = load_file(str(folders["gpt2"] / "model.safetensors"))
    saved = load_file(str(run_dir / "model.safetensors"))
    for name, tensor in base.items():
        layer = name.removesuffix(".weight").removesuffix(".bias")
        wrapped = f"base_model.model.{layer}.base_layer.{name.rsplit('.', 1)[1]}"
        assert torch.equal(saved.get(wrapped, saved.get(f"base_model.model.{name}")), tensor), name
    # a checkpoint holds the 16 adapter matrices, not the frozen weights
    latest = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
    held = load_file(str(latest / "model.safetensors"))
    assert len(held) == 16 and all(".lora_A." in k or ".lora_B." in k for k in held)
    assert sum(t.numel() for t in held.values()) == TRAINABLE


def test_the_adapter_and_the_merged_model_give_the_runs_outputs(folders, trained):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, run_dir = trained
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "hf")
    ids = tokenizer(["the river runs past the old mill", "servers compile the kernel"], padding=True)
    inputs = {"input_ids": torch.tensor(ids["input_ids"]), "attention_mask": torch.tensor(ids["attention_mask"])}
    with torch.no_grad():
        ours = load_model(run_dir)(**inputs).logits
        adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folders["gpt2"]), run_dir / "adapter")
        merged = AutoModelForCausalLM.from_pretrained(run_dir / "hf")
        base = AutoModelForCausalLM.from_pretrained(folders["gpt2"])
        outputs = [model.eval()(**inputs).logits for model in (adapter, merged, base)]
    assert (outputs[0] - ours).abs().max() < 1e-5 and (outputs[1] - ours).abs().max() < 1e-5
    assert (outputs[2] - ours).abs().max() > 1e-2  # the adapters changed what the model says


def test_wrapping_says_the_trainable_share_and_nothing_else(folders):
    import warnings

    from transformers import AutoModelForCausalLM

    from anytrain import lora

    said = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # peft 0.21 asks transformers 5 a deprecated property while wrapping
        found = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "targets": "all-linear"}
        lora.wrap(AutoModelForCausalLM.from_pretrained(folders["gpt2"]), found, "AutoModelForCausalLM", said.append)
    assert said == ["LoRA r=8: 16,384 of 150,272 parameters trainable (10.90%)"]
    assert [str(w.message) for w in caught] == []


@pytest.fixture(scope="module")
def reference(folders, tmp_path_factory):
    return big_batch(lora_args(folders), tmp_path_factory.mktemp("lora_big"))


def test_lora_accumulation_equals_one_big_batch(folders, reference, tmp_path, monkeypatch):
    check_accumulation(lora_args(folders), reference, tmp_path, monkeypatch, HFCausalLM)


@pytest.mark.launch
def test_lora_on_two_ranks_equals_one_rank_with_twice_the_batch(folders, reference, tmp_path):
    check_two_ranks(lora_args(folders), reference, tmp_path)


def test_bad_lora_options_are_one_line_and_write_nothing(folders, tmp_path, capsys):
    out = ["--output-dir", str(tmp_path / "run")]
    err = run_cli_error(capsys, ["--lora-r", "8", *out])
    assert "--lora-r: LoRA adapts transformers models (--model hf:...) only" in err
    err = run_cli_error(capsys, [*lora_args(folders, "--lora-targets", "c_attn,q_proj"), *out])
    assert (
        "--lora-targets: the model has no linear layer named q_proj; its linear layers: c_attn, c_fc, c_proj, lm_head"
        in err
    )
    classify = ["--model", f"hf:{folders['gpt2']}", "--dataset", str(folders["data"]), "--text-column", "text"]
    err = run_cli_error(capsys, [*classify, "--label-column", "label", "--lora-r", "8", *out])
    said = (
        "--lora-r: --task classify does not train LoRA adapters (tasks that do: lm, kto, sft, dpo, reward, grpo, "
        "distill)"
    )
    assert said in err
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- packing


def test_a_packed_batch_has_the_loss_and_gradients_of_its_texts_padded_one_a_row(folders):
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anytrain.data.packing import PackedRows

    tokenizer = AutoTokenizer.from_pretrained(folders["gpt2"])
    texts = [json.loads(line)["text"] for line in folders["data"].read_text().splitlines()[:16]]
    ids = [tokenizer(text)["input_ids"] for text in texts]
    pad = tokenizer.eos_token_id  # GPT-2 has no pad token: anytrain pads with its end-of-text (hf.load_tokenizer)
    packed = PackedRows(ids, 128, pad)  # the model's 128 positions: every text whole
    assert len(packed) < len(ids) and packed.sequences == len(ids)  # several whole texts a row
    model = AutoModelForCausalLM.from_pretrained(folders["gpt2"]).train()
    model.config.use_cache = False  # as anytrain sets it for --packing: a cache turns off the mask per text
    inputs, targets = packed.__getitems__(list(range(len(packed))))
    packed_sum, packed_count, packed_grads = loss_and_grads(model, inputs, targets)
    width = max(map(len, ids))
    padded = torch.tensor([row + [pad] * (width - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    padded_sum, padded_count, padded_grads = loss_and_grads(
        model, {"input_ids": padded, "attention_mask": mask}, padded.masked_fill(mask == 0, -100)
    )
    assert packed_count == padded_count == sum(len(row) - 1 for row in ids)
    grad_diff = max((packed_grads[n] - padded_grads[n]).abs().max().item() for n in padded_grads)
    print(f"packed vs padded: loss sums {packed_sum:.6f} {padded_sum:.6f}, gradients within {grad_diff:.1e}")
    assert packed_sum == pytest.approx(padded_sum, rel=1e-5) and grad_diff < 1e-5
    # the control: the same rows without their position ids attend across texts, and the loss differs
    crossed_sum, _, _ = loss_and_grads(model, {"input_ids": inputs["input_ids"]}, targets)
    assert abs(crossed_sum - packed_sum) > 0.5 + 1000 * abs(packed_sum - padded_sum)  # measured 2.7 and 0


def test_packed_training_keeps_every_token_and_accumulates_like_one_big_batch(folders, tmp_path, monkeypatch):
    short = ("--max-length", "16", "--packing")  # most texts are longer than 16 tokens: split, not truncated
    summary = in_process(
        tmp_path / "packed", *args(folders, *short, "--batch-size", "16", "--epochs", "2", "--lr", "2e-3")
    )
    assert summary["truncated_train_tokens"] == 0 and summary["packed_sequences"] > summary["train_samples"] / 2
    assert summary["val_loss"] < read_metrics(tmp_path / "packed")[0]["loss"] - 0.5  # it learns
    reference = big_batch(args(folders, *short), tmp_path / "big")
    check_accumulation(args(folders, *short), reference, tmp_path, monkeypatch, HFCausalLM)


def test_without_packing_the_start_says_what_truncation_drops(folders, tmp_path, capsys):
    summary = in_process(tmp_path / "cut", *args(folders, "--max-length", "16", "--max-steps", "1"))
    dropped, kept = summary["truncated_train_tokens"], summary["train_tokens"]
    assert dropped > 0 and summary["truncated_train_texts"] > 0
    out = capsys.readouterr().out
    assert f"--max-length 16 truncates the training texts: {dropped:,} of {dropped + kept:,} tokens" in out


def test_packing_for_another_model_or_task_is_one_line(folders, tmp_path, capsys):
    out = ["--output-dir", str(tmp_path / "run")]
    err = run_cli_error(capsys, ["--packing", *out])
    assert "--packing packs texts for transformers causal LMs (--model hf:...) only" in err
    classify = ["--model", f"hf:{folders['gpt2']}", "--dataset", str(folders["data"]), "--text-column", "text"]
    err = run_cli_error(capsys, [*classify, "--label-column", "label", "--packing", *out])
    assert "--packing: --task classify does not pack texts (tasks that do: lm, kto, sft, dpo)" in err
    err = run_cli_error(
        capsys, [*args(folders, "--packing", "--max-length", "256"), *out]
    )  # rows longer than positions
    assert "--max-length 256 exceeds the 128 positions of hf:" in err
    assert not (tmp_path / "run").exists()


def test_a_transformers_lm_reads_the_text_column_by_default(folders, tmp_path):
    """--text-column left empty: 'text', as for every language model (and as --help says)."""
    flags = ("--task", "lm", "--max-length", "64", "--max-steps", "1")
    summary = in_process(
        tmp_path / "run", "--model", f"hf:{folders['gpt2']}", "--dataset", str(folders["data"]), *flags
    )
    assert summary["task"] == "lm" and summary["train_tokens"] > 0
