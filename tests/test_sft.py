"""Supervised fine-tuning on chats (`--task sft`, issue 28), offline, with a tiny Llama-style model whose
tokenizer has a ChatML template (tests/hfmodels.py).

The targets are the answers' tokens alone (each assistant turn's content and its end-of-turn token); a packed
batch of chats has the loss and gradients of the same chats padded one a row; the bundled `instructions`
set is learned and scored by generation, and the exact match anytrain reports is the one transformers'
own greedy generate gets from run_dir/hf on the test chats; `anytrain sample` answers through the chat
template as transformers does; accumulation = one big batch (with the control that per-micro-batch means
do not), 2 ranks = 1 (LoRA), a SIGKILL then --resume is bit-identical (LoRA and packing); bad input is one line.

Data: generated chats (src/anytrain/data/instructions.py): 320 for the equality checks, 2,000/200/200 to learn."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import read_metrics, run_cli_error
from hfchecks import (
    big_batch,
    check_accumulation,
    check_kill_and_resume,
    check_two_ranks,
    in_process,
    loss_and_grads,
    target_runs,
)
from hfmodels import chat_tokenizer, tiny_llama
from safetensors.torch import load_file
from textdata import write_jsonl

from anytrain.data import instructions
from anytrain.data.packing import PackedRows
from anytrain.sample import sample
from anytrain.tasks.causal_lm.chats import ChatRows, Renderer, tokenise
from anytrain.tasks.hf_sft import SupervisedFineTuning

pytest.importorskip("transformers")

N = 320
SFT = f"--val-fraction {32.5 / N} --test-fraction {32.5 / N} --max-length 128".split()
LORA = ("--lora-r", "8", "--lr", "1e-2")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    split = root / "split"
    split.mkdir()
    chats = instructions.rows(2400, seed=7)
    for name, part in (("train", chats[:2000]), ("validation", chats[2000:2200]), ("test", chats[2200:])):
        write_jsonl(split / f"{name}.jsonl", part)
    return {
        "chats": write_jsonl(root / "chats.jsonl", instructions.rows(N, seed=3)),
        "split": split,
        "llama": tiny_llama(root / "llama"),
        "plain": tiny_llama(root / "plain", chat=False),
    }


def args(folders, *flags: str) -> list[str]:
    return ["--model", f"hf:{folders['llama']}", "--dataset", str(folders["chats"]), *SFT, *flags]


def learned(tokenizer, row: dict, form: str = "messages") -> list[str]:
    """The decoded runs of target tokens of one row (rendered as one text)."""
    [piece] = Renderer(form, "messages", tokenizer, "rows", "train")(row, 0)
    return target_runs(tokenizer, *tokenise(tokenizer, *piece, form != "messages"))


def test_the_targets_are_the_answers_and_their_end_of_turn_tokens():
    tokenizer = chat_tokenizer()
    chat = [
        {"role": "system", "content": "Reply tersely."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": 'Spell "bako" backwards.'},
        {"role": "assistant", "content": "okab"},
    ]
    assert learned(tokenizer, {"messages": chat}) == ["4<|im_end|>\n", "okab<|im_end|>\n"]
    # prompt/completion text: the completion and the end-of-text token; as lists: the completion's turns
    pair = {"prompt": "Q: What is 2 + 2?\nA:", "completion": " 4"}
    assert learned(tokenizer, pair, "prompt-completion") == [" 4<|endoftext|>"]
    # a prompt ending in the space the byte-level BPE joins to the completion's first word (" the"): that token holds
    # completion characters, so it is learned
    spaced = {"prompt": "Q: Where is the stone?\nA: ", "completion": "the river"}
    assert learned(tokenizer, spaced, "prompt-completion") == [" the river<|endoftext|>"]
    turns = {"prompt": chat[:4], "completion": chat[4:]}
    assert learned(tokenizer, turns, "prompt-completion") == ["okab<|im_end|>\n"]
    [piece] = Renderer("messages", "messages", tokenizer, "rows", "train")({"messages": chat}, 0)
    ids, labels = tokenise(tokenizer, *piece, False)
    rows = ChatRows([ids], [labels], tokenizer.pad_token_id, None)
    assert rows.targets_per_row.tolist() == [len(tokenizer("4<|im_end|>\nokab<|im_end|>\n").input_ids)]


def test_a_packed_batch_of_chats_has_the_loss_and_gradients_of_the_chats_padded(folders):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folders["llama"])
    render = Renderer("messages", "messages", tokenizer, "rows", "train")
    encoded = [tokenise(tokenizer, *render(row, k)[0], False) for k, row in enumerate(instructions.rows(24, seed=5))]
    ids, labels = [e[0] for e in encoded], [e[1] for e in encoded]
    pad = tokenizer.eos_token_id  # anytrain pads with the end-of-text token where a tokenizer has no pad token
    packed = PackedRows(ids, 128, pad, labels)
    assert len(packed) < len(ids) and packed.sequences == len(ids)
    model = AutoModelForCausalLM.from_pretrained(folders["llama"]).train()
    model.config.use_cache = False  # as anytrain sets it for --packing
    packed_sum, packed_count, packed_grads = loss_and_grads(model, *packed.__getitems__(list(range(len(packed)))))
    padded = ChatRows(ids, labels, pad, None)
    padded_sum, padded_count, padded_grads = loss_and_grads(model, *padded.__getitems__(list(range(len(ids)))))
    assert packed_count == padded_count == padded.targets_per_row.sum() == packed.targets_per_row.sum()
    grad_diff = max((packed_grads[n] - padded_grads[n]).abs().max().item() for n in padded_grads)
    print(f"packed vs padded chats: loss sums {packed_sum:.6f} {padded_sum:.6f}, gradients within {grad_diff:.1e}")
    assert packed_sum == pytest.approx(padded_sum, rel=1e-5) and grad_diff < 1e-5


@pytest.fixture(scope="module")
def learnt(folders, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sft_run")
    flags = ["--model", f"hf:{folders['llama']}", "--dataset", str(folders["split"]), "--packing"]
    summary = in_process(run_dir, *flags, "--epochs", "3", "--batch-size", "32", "--lr", "3e-3")
    return summary, run_dir


def test_the_model_learns_the_instructions_and_reports_transformers_exact_match(folders, learnt):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    summary, run_dir = learnt
    assert summary["task"] == "sft" and summary["task_reason"] == "auto: a 'messages' column of messages"
    assert summary["chat_format"] == "messages" and summary["truncated_train_tokens"] == 0
    first = read_metrics(run_dir)[0]["loss"]
    assert summary["val_loss"] < first / 3, (first, summary["val_loss"])  # measured 5.9 -> 1.25
    assert summary["test_exact_match"] >= 0.1, summary  # measured 0.135 (0 before training)
    model = AutoModelForCausalLM.from_pretrained(run_dir / "hf").eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "hf")
    rows = [json.loads(line) for line in (folders["split"] / "test.jsonl").read_text().splitlines()]
    hits = 0
    for row in rows:  # transformers' own greedy answers to the test chats' last questions
        prompt = tokenizer.apply_chat_template(row["messages"][:-1], add_generation_prompt=True, return_tensors="pt")
        prompt = prompt["input_ids"] if not isinstance(prompt, torch.Tensor) else prompt
        out = model.generate(
            prompt, max_new_tokens=12, do_sample=False, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>")
        )
        hits += (
            tokenizer.decode(out[0, prompt.shape[1] :], skip_special_tokens=True).strip()
            == row["messages"][-1]["content"]
        )
    assert summary["test_exact_match"] == pytest.approx(hits / len(rows)), hits


def test_sample_answers_through_the_chat_template(folders, learnt):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, run_dir = learnt
    question = "What is 12 + 5?"
    ours = sample(str(run_dir), question, tokens=8, top_k=1, seed=0)  # top-1 sampling: greedy
    model = AutoModelForCausalLM.from_pretrained(run_dir / "hf").eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "hf")
    chat = [{"role": "user", "content": question}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")
    prompt = prompt["input_ids"] if not isinstance(prompt, torch.Tensor) else prompt
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = model.generate(prompt, max_new_tokens=8, do_sample=False, eos_token_id=stop)
    assert ours == tokenizer.decode(out[0, prompt.shape[1] :], skip_special_tokens=True) and ours.strip()


def test_sample_filters_as_transformers_does(folders, learnt):
    """--repetition-penalty is transformers' (greedy answers equal with it, and it changes them: the control); a tight
    --top-p or --min-p 1 keeps the likeliest token alone, so at temperature 50 the reply is the greedy one, where the
    bare temperature is not."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, run_dir = learnt
    question, run = "What is 12 + 5?", str(run_dir)
    model = AutoModelForCausalLM.from_pretrained(run_dir / "hf").eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "hf")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    prompt = torch.tensor([prompt["input_ids"] if not isinstance(prompt, list) else prompt])
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = model.generate(prompt, max_new_tokens=8, do_sample=False, eos_token_id=stop, repetition_penalty=3.0)
    penalised = sample(run, question, tokens=8, top_k=1, seed=0, repetition_penalty=3.0)
    greedy = sample(run, question, tokens=8, top_k=1, seed=0)
    assert penalised == tokenizer.decode(out[0, prompt.shape[1] :], skip_special_tokens=True) != greedy
    hot = [sample(run, question, tokens=8, temperature=50.0, seed=seed) for seed in range(3)]
    assert all(text != greedy for text in hot)  # the control: at temperature 50 anything goes
    for seed in range(3):
        assert sample(run, question, tokens=8, temperature=50.0, seed=seed, top_p=1e-6) == greedy
        assert sample(run, question, tokens=8, temperature=50.0, seed=seed, min_p=1.0) == greedy


def test_the_log_shows_generated_answers(folders, tmp_path, capsys):
    in_process(tmp_path / "run", *args(folders, "--max-steps", "2"))
    out = capsys.readouterr().out
    assert "generated answers:" in out and out.count("(expected '") >= 3


@pytest.fixture(scope="module")
def reference(folders, tmp_path_factory):
    return big_batch(args(folders), tmp_path_factory.mktemp("sft_big"))


def test_sft_accumulation_equals_one_big_batch(folders, reference, tmp_path, monkeypatch):
    check_accumulation(args(folders), reference, tmp_path, monkeypatch, SupervisedFineTuning)


@pytest.mark.launch
def test_sft_with_lora_on_two_ranks_equals_one_rank_with_twice_the_batch(folders, tmp_path):
    lora = args(folders, *LORA)
    check_two_ranks(lora, big_batch(lora, tmp_path / "big"), tmp_path)


@pytest.mark.launch
def test_a_packed_lora_sft_run_sigkilled_mid_run_resumes_bit_identical(folders, tmp_path):
    """The one LoRA kill-and-resume test (lm's LoRA saves and resumes through the same HFCausalLM code)."""
    check_kill_and_resume(args(folders, *LORA, "--packing"), tmp_path, "sft")
    held = load_file(str(next((tmp_path / "victim" / "checkpoints").glob("step-*")) / "model.safetensors"))
    assert held and all("lora_" in name for name in held), sorted(held)  # resumed from the adapters alone


def write_chats(path, chats: list) -> str:
    return str(write_jsonl(path, [{"messages": chat} for chat in chats]))


def test_bad_chats_are_one_line_and_write_nothing(folders, tmp_path, capsys):
    good = instructions.rows(40, seed=1)
    model, out = ["--model", f"hf:{folders['llama']}"], ["--output-dir", str(tmp_path / "run")]
    bot = [row["messages"] for row in good]
    bot[7] = [{"role": "user", "content": "hi"}, {"role": "bot", "content": "hello"}]
    err = run_cli_error(capsys, [*model, "--dataset", write_chats(tmp_path / "bot.jsonl", bot), *out])
    assert "row 7 of the train split of" in err and "unknown role 'bot' (roles: system, user, assistant, tool)" in err
    silent = [row["messages"] for row in good]
    silent[3] = [{"role": "user", "content": "hi"}]
    err = run_cli_error(capsys, [*model, "--dataset", write_chats(tmp_path / "silent.jsonl", silent), *out])
    assert "row 3 of the train split" in err and "no assistant turn, so nothing to learn from it" in err
    chats = str(folders["chats"])
    err = run_cli_error(capsys, ["--model", f"hf:{folders['plain']}", "--dataset", chats, *out])
    assert "its tokenizer has no chat template, which chats (lists of messages) need" in err
    err = run_cli_error(capsys, ["--dataset", chats, *out])
    assert "--task sft trains a transformers model: --model hf:FOLDER_OR_ID" in err
    mixed = write_jsonl(
        tmp_path / "mixed.jsonl", [{"prompt": "Q?", "completion": [{"role": "assistant", "content": "A"}]}] * 30
    )
    err = run_cli_error(capsys, [*model, "--dataset", str(mixed), *out])
    assert "prompt and completion must both be text or both be lists of messages" in err
    err = run_cli_error(
        capsys,
        [*model, "--dataset", str(folders["split"] / "test.jsonl"), "--task", "sft", "--text-column", "kind", *out],
    )
    assert "has neither a 'kind' column of messages nor prompt and completion columns" in err
    assert not (tmp_path / "run").exists()


def test_predict_on_an_sft_run_points_to_sample(learnt, tmp_path):
    from anytrain.config import ConfigError
    from anytrain.predict import predict

    _, run_dir = learnt
    with pytest.raises(ConfigError, match="answers prompts with `anytrain sample"):
        predict(str(run_dir), str(write_jsonl(tmp_path / "rows.jsonl", [{"messages": []}])))
