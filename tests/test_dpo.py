"""Preference tuning (`--task dpo`, `--task reward`, issue 34), offline, with a tiny Llama-style model whose tokenizer
has a ChatML template (tests/hfmodels.py) and the bundled `preferences` pairs (src/anytrain/data/preferences.py).

Each loss is its formula on hand-made log-probabilities; the fused completion log-probabilities equal those of
the full logits (values and gradients), packed equal padded; the first step's loss is the formula's value when
the model is its own reference (log 2 for DPO); 4 accumulated x 4 pairs equal one batch of 16 (with the control
that per-micro-batch means do not, on a step of uneven micro-batches), 2 ranks equal 1; a SIGKILL then --resume is
bit-identical and reads the cached reference back; the LoRA reference is the base model's own log-probabilities
and a live reference equals the cached one; bad input is one line. The reward model learns the pairs and exports a
folder AutoModelForSequenceClassification loads, which `anytrain predict` scores texts with.

Data: 150 generated pairs (120 train, 15 validation, 15 test), or the 2,000 of the bundled set to learn."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from conftest import kill_and_resume, max_abs_diff, read_metrics, read_summary, run_cli_error
from hfchecks import STEPS, TOL, big_batch, check_two_ranks, in_process
from hfmodels import bert_tokenizer, tiny_bert_mlm, tiny_llama
from textdata import write_jsonl

from anytrain import load_model
from anytrain.data import preferences

pytest.importorskip("transformers")

N = 150
DPO = f"--val-fraction {15.5 / N} --test-fraction {15.5 / N} --max-length 128".split()
LN2 = math.log(2)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo")
    return {
        "pairs": write_jsonl(root / "pairs.jsonl", preferences.rows(N, seed=3)),
        "llama": tiny_llama(root / "llama"),
        "distilbert": tiny_distilbert(root / "distilbert"),
        "bert": tiny_bert_mlm(root / "bert"),
    }


def tiny_distilbert(folder):
    """A masked LM whose architecture has no causal-LM head in transformers (BERT has one: BertLMHeadModel)."""
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    tokenizer = bert_tokenizer()
    config = DistilBertConfig(vocab_size=len(tokenizer), dim=32, n_layers=1, n_heads=2, hidden_dim=64)
    DistilBertForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def args(folders, *flags: str) -> list[str]:
    return ["--model", f"hf:{folders['llama']}", "--dataset", str(folders["pairs"]), *DPO, *flags]


def train_losses(run_dir) -> list[float]:
    return [m["loss"] for m in read_metrics(run_dir) if m["kind"] == "train"]


# --------------------------------------------------------------------------- the formulas


def test_each_loss_is_its_formula_on_hand_made_log_probabilities():
    from anytrain.tasks.dpo.losses import LOSSES, Pairs

    pi_c, pi_r, ref_c, ref_r, len_c, len_r = [-3.0, -9.5], [-4.0, -2.5], [-3.5, -8.0], [-3.0, -4.0], [3, 5], [4, 2]
    p = Pairs(*(torch.tensor(v, dtype=torch.float64) for v in (pi_c, pi_r, ref_c, ref_r, len_c, len_r)))
    beta, gamma = 0.3, 0.7

    def logsigmoid(x: float) -> float:
        return -math.log1p(math.exp(-x))

    for k in range(2):
        dc, dr = pi_c[k] - ref_c[k], pi_r[k] - ref_r[k]
        mc, mr = pi_c[k] / len_c[k], pi_r[k] / len_r[k]
        odds = (mc - mr) - (math.log(1 - math.exp(mc)) - math.log(1 - math.exp(mr)))
        expected = {
            "sigmoid": (-logsigmoid(beta * (dc - dr)), beta * dc, beta * dr),
            "ipo": ((dc / len_c[k] - dr / len_r[k] - 1 / (2 * beta)) ** 2, beta * dc / len_c[k], beta * dr / len_r[k]),
            "simpo": (-logsigmoid(beta * (mc - mr) - gamma), beta * mc, beta * mr),
            "orpo": (-mc - beta * logsigmoid(odds), beta * mc, beta * mr),
        }
        for name, formula in LOSSES.items():
            got = [t[k].item() for t in formula(p, beta, gamma)]
            assert got == pytest.approx(expected[name], rel=1e-12), name


def test_a_reward_models_loss_is_bradley_terry():
    from anytrain.config import parse_config
    from anytrain.tasks.reward.task import RewardModel

    task = RewardModel(parse_config(["--task", "reward"]))
    scores = torch.tensor([[2.0], [-1.0], [0.5], [1.0]])  # chosen 2, -1; rejected 0.5, 1
    stats = task.per_sample(scores, torch.zeros(2, 2))
    assert stats["loss"].tolist() == pytest.approx([-math.log(1 / (1 + math.exp(-1.5))), math.log1p(math.exp(2.0))])
    assert stats["accuracy"].tolist() == [1.0, 0.0] and stats["margin"].tolist() == [1.5, -2.0]
    assert task.loss(scores, torch.zeros(2, 2)).item() == pytest.approx(stats["loss"].mean().item())


# --------------------------------------------------------------------------- the pairs and their log-probabilities


def encoded(tokenizer, rows: list[dict], form: str, packed: int = 0):
    import datasets

    from anytrain.tasks.causal_lm.pairs import PairRenderer, PairRows, encode

    ds, _ = encode(datasets.Dataset.from_list(rows), PairRenderer(form, tokenizer, "rows", "train"), 128)
    ids, answers = [s for p in ds["ids"] for s in p], [s for p in ds["answers"] for s in p]
    return PairRows(ids, answers, tokenizer.pad_token_id, None, packed)


def answers_of(tokenizer, rows) -> list[str]:
    return [tokenizer.decode([t for t, a in zip(*map(list, rows.sequence(k))) if a != -100]) for k in range(4)]


def test_every_pair_format_learns_the_answer_tokens_only(folders):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folders["llama"])
    tokenizer.pad_token = tokenizer.eos_token
    chats = preferences.rows(2, seed=5)
    explicit = encoded(tokenizer, chats, "explicit")
    assert answers_of(tokenizer, explicit) == [
        f"{row[k][0]['content']}<|im_end|>\n" for row in chats for k in ("chosen", "rejected")
    ]
    implicit = [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in chats]
    assert answers_of(tokenizer, encoded(tokenizer, implicit, "implicit")) == answers_of(tokenizer, explicit)
    texts = [
        {"prompt": "Q: 2 + 2 = ?\nA:", "chosen": " 4", "rejected": " 5"},
        {"prompt": "Hi", "chosen": " yo", "rejected": " no"},
    ]
    assert answers_of(tokenizer, encoded(tokenizer, texts, "explicit")) == [
        " 4<|endoftext|>",
        " 5<|endoftext|>",
        " yo<|endoftext|>",
        " no<|endoftext|>",
    ]
    joined = [{"chosen": t["prompt"] + t["chosen"], "rejected": t["prompt"] + t["rejected"]} for t in texts[:1]]
    # the shared beginning's last space begins the answers (as TRL splits them): the explicit pairs' answers
    implicit_texts = encoded(tokenizer, joined * 2, "implicit")
    assert answers_of(tokenizer, implicit_texts)[:2] == [" 4<|endoftext|>", " 5<|endoftext|>"]


def question_pairs(n: int, form: str) -> list[dict]:
    """n of the bundled pairs as text, "Q: question A: answer": implicit (chosen and rejected whole), or explicit
    with the prompt ending in the space before the answer."""
    rows = []
    for row in preferences.rows(n, seed=4):
        prompt = f"Q: {row['prompt'][-1]['content']} A: "
        chosen, rejected = row["chosen"][0]["content"], row["rejected"][0]["content"]
        if form == "implicit":
            rows.append({"chosen": prompt + chosen, "rejected": prompt + rejected})
        else:
            rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return rows


def answer_tokens(tokenizer, rows: list[dict], form: str) -> list[list[int]]:
    """Each sequence's answer tokens (chosen, rejected, chosen, ...), as the pairs are encoded for training."""
    pairs = encoded(tokenizer, rows, form)
    return [[t for t, a in zip(*map(list, pairs.sequence(k))) if a != -100] for k in range(2 * len(rows))]


def test_implicit_text_pairs_score_every_answer_token_of_a_byte_level_bpe(folders):
    """Implicit text pairs are split as TRL's extract_prompt splits them (" A: 16" against " A: 15": the prompt ends
    with the shared "1"); a byte-level BPE may join an answer's first characters to the prompt's last (" 16" one
    token): every token holding a character of the answer is the answer's, so none of it is lost."""
    from transformers import AutoTokenizer

    from anytrain.tasks.causal_lm.pairs import text_split

    tokenizer = AutoTokenizer.from_pretrained(folders["llama"])  # GPT-2's byte-level BPE (tests/hfmodels.py)
    tokenizer.pad_token = tokenizer.eos_token
    rows = question_pairs(60, "implicit")
    splits = [text_split(row["chosen"], row["rejected"]) for row in rows]
    texts = [row[k][cut:] for row, cut in zip(rows, splits) for k in ("chosen", "rejected")]
    assert any(not text.startswith(" ") for text in texts)  # answers sharing their first digits: split inside them
    got, end = answer_tokens(tokenizer, rows, "implicit"), tokenizer.eos_token
    whole = [tokenizer(row[k] + end)["input_ids"] for row in rows for k in ("chosen", "rejected")]
    lost = {k // 2 for k, (ids, text) in enumerate(zip(got, texts)) if not tokenizer.decode(ids).endswith(text + end)}
    assert not lost, f"{len(lost)} of {len(rows)} pairs lose an answer's character"
    assert all(ids == full[len(full) - len(ids) :] for ids, full in zip(got, whole))  # the text's own last tokens


def test_an_explicit_text_prompt_ending_in_a_space_scores_the_answers_first_token(folders):
    """The prompt ends with the space a byte-level BPE joins to the answer's first word: the token is the answer's
    (it holds answer characters), the space its only character from the prompt."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folders["llama"])
    tokenizer.pad_token = tokenizer.eos_token
    rows = question_pairs(60, "explicit")
    texts = [row[k] for row in rows for k in ("chosen", "rejected")]
    got = [tokenizer.decode(ids) for ids in answer_tokens(tokenizer, rows, "explicit")]
    end = tokenizer.eos_token
    lost = {k // 2 for k, (answer, text) in enumerate(zip(got, texts)) if answer not in (text + end, f" {text}{end}")}
    assert not lost, f"{len(lost)} of {len(rows)} pairs lose their answer's first token"  # 19 of 60 before the fix
    assert any(answer.startswith(" ") for answer in got)  # the BPE merged the space into some first tokens
    from anytrain.config import ConfigError

    with pytest.raises(ConfigError, match="row 0 .*: its prompt has no token of its own"):  # " the": one token
        encoded(tokenizer, [{"prompt": " th", "chosen": "e river", "rejected": "e stone"}], "explicit")


def sequence_log_probs(model, rows, weights: torch.Tensor):
    """The pairs' table through the causal-LM core, and the gradients of sum(weights x log-probabilities)."""
    from anytrain.tasks.causal_lm.logprobs import bare, sequence_logps

    model.zero_grad()
    inputs = rows.__getitems__(list(range(len(rows)))).inputs
    table = sequence_logps(bare(model), inputs)
    (table[:, 0] * weights).sum().backward()
    return table.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_fused_log_probabilities_equal_the_full_logits_and_packed_equal_padded(folders):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anytrain.tasks.causal_lm.head import head_of

    tokenizer = AutoTokenizer.from_pretrained(folders["llama"])
    tokenizer.pad_token = tokenizer.eos_token
    rows = preferences.rows(6, seed=1)
    padded, packed = encoded(tokenizer, rows, "explicit"), encoded(tokenizer, rows, "explicit", packed=256)
    plain = AutoModelForCausalLM.from_pretrained(folders["llama"])
    fused = head_of(AutoModelForCausalLM.from_pretrained(folders["llama"]))[0]
    weights = torch.linspace(-1, 2, 12)
    table, grads = sequence_log_probs(fused, padded, weights)
    packed_table, packed_grads = sequence_log_probs(fused, packed, weights)
    inputs = padded.__getitems__(list(range(6))).inputs  # the full logits, the textbook way
    logits = plain(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits[:, :-1].float()
    labels = inputs["labels"][:, 1:]
    token = logits.log_softmax(-1).gather(2, labels.clamp(min=0)[..., None])[..., 0] * (labels != -100)
    (token.sum(1) * weights).sum().backward()
    full = {n: p.grad for n, p in plain.named_parameters()}
    assert table[:, 1].tolist() == (labels != -100).sum(1).tolist()
    assert (table[:, 0] - token.sum(1).detach()).abs().max() < 1e-5
    assert max((grads[n] - full[n]).abs().max().item() / full[n].abs().max().item() for n in full) < 1e-5
    assert (packed_table - table).abs().max() < 1e-5
    assert max((packed_grads[n] - grads[n]).abs().max().item() / grads[n].abs().max().item() for n in grads) < 1e-5


def test_the_lora_reference_is_the_base_models_own_log_probabilities(folders):
    """--reference adapter: the task's table has the policy (the adapter on) and the reference (the adapter off,
    computed without gradients), and the adapter is trained afterwards."""
    import contextlib

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anytrain.tasks.causal_lm.head import head_of
    from anytrain.tasks.causal_lm.logprobs import bare, sequence_logps
    from anytrain.tasks.causal_lm.reference import Reference
    from anytrain.tasks.dpo.task import DirectPreference

    tokenizer = AutoTokenizer.from_pretrained(folders["llama"])
    tokenizer.pad_token = tokenizer.eos_token
    rows = encoded(tokenizer, preferences.rows(4, seed=2), "explicit")
    base = head_of(AutoModelForCausalLM.from_pretrained(folders["llama"]))[0]
    model = AutoModelForCausalLM.from_pretrained(folders["llama"])
    model = head_of(get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"])))[0]
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a trained adapter: not zero
            p.data.normal_(0, 0.5)
    task = DirectPreference.__new__(DirectPreference)  # the step's parts alone, no run around them
    task.reference, task.autocast = Reference("adapter"), contextlib.nullcontext
    batch = rows.__getitems__(list(range(4)))  # a typed batch: the inputs and the pairs' reference (not cached: NaN)
    assert type(batch).__name__ == "PairBatch" and batch.reference.shape == (4, 2) and batch.reference.isnan().all()
    inputs = batch.inputs
    table = task.table(bare(model), inputs, model)
    with torch.no_grad():
        own = sequence_logps(bare(base), inputs)
    assert (table[:, 2] - own[:, 0]).abs().max() < 1e-5  # the reference: the adapter off
    assert (table[:, 0] - own[:, 0]).abs().max() > 1e-2  # the policy: the adapter on
    assert table.requires_grad
    table[:, 0].sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)  # switched back on


# --------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def learnt(folders, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dpo_learn") / "run"
    flags = ("--packing", "--epochs", "4", "--batch-size", "8", "--lr", "3e-3", "--log-every-steps", "1")
    summary = in_process(run_dir, *args(folders, *flags))
    return summary, run_dir


def test_dpo_learns_the_bundled_preferences_from_log_2(learnt):
    summary, run_dir = learnt
    assert summary["task"] == "dpo" and summary["task_reason"] == "auto: chosen and rejected columns (explicit prompt)"
    assert summary["reference"] == "cached" and summary["dpo_loss"] == "sigmoid"
    assert summary["packed_texts_kept_apart_by"] == "positions"
    first = read_metrics(run_dir)[0]
    assert first["loss"] == pytest.approx(LN2, abs=1e-5)  # the model is its own reference before step 1
    assert summary["test_reward_accuracy"] >= 0.9 and summary["val_loss"] < 0.4, summary  # measured 1.0, 0.24
    assert summary["test_chosen_reward"] > summary["test_rejected_reward"]
    from anytrain.reload import read_weights_metadata, weights_file

    meta = read_weights_metadata(weights_file(str(run_dir)))[2]
    assert len(meta["stop_ids"]) == 2  # the end-of-text token and ChatML's <|im_end|>
    assert (run_dir / "reference_logps.safetensors").is_file() and (run_dir / "hf" / "model.safetensors").is_file()


def test_a_dpo_run_samples_through_the_chat_template(learnt):
    from anytrain.sample import sample

    _, run_dir = learnt
    assert isinstance(sample(str(run_dir), "What is 12 + 5?", tokens=4, top_k=1, seed=0), str)


@pytest.mark.parametrize("loss, first", [("ipo", (0 - 1 / (2 * 0.1)) ** 2), ("simpo", None), ("orpo", None)])
def test_every_loss_trains_in_the_loop(folders, tmp_path, loss, first):
    summary = in_process(
        tmp_path / "run", *args(folders, "--dpo-loss", loss, "--max-steps", "3", "--log-every-steps", "1")
    )
    assert summary["dpo_loss"] == loss and summary["reference"] == ("cached" if loss == "ipo" else "none")
    losses = train_losses(tmp_path / "run")
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    if first is not None:
        assert losses[0] == pytest.approx(first, rel=1e-5)  # policy = reference: ((0 - 0) - 1 / 2 beta)^2
    assert not (tmp_path / "run" / "reference_logps.safetensors").exists() or loss == "ipo"


@pytest.fixture(scope="module")
def one_batch(folders, tmp_path_factory):
    return big_batch(args(folders), tmp_path_factory.mktemp("dpo_big"))


def test_dpo_accumulation_equals_one_big_batch_on_an_uneven_last_step(folders, one_batch, tmp_path, monkeypatch):
    """120 training pairs in batches of 16: the 8th step holds 8 pairs, two micro-batches of 4 accumulated. The
    control (each micro-batch the mean over its own pairs, unweighted) gives that step half its gradient."""
    from anytrain import trainer
    from anytrain.tasks.dpo.task import DirectPreference

    one, one_dir = one_batch
    flags = ("--batch-size", "4", "--grad-accum-steps", "4", *STEPS)
    accum = in_process(tmp_path / "accum", *args(folders), *flags)
    assert accum["optimizer_steps"] == one["optimizer_steps"] == 8
    diff = max_abs_diff(load_model(tmp_path / "accum").state_dict(), load_model(one_dir).state_dict())
    assert diff < TOL, diff
    # every step's logged loss, the 8th too: two micro-batches' shares of its 8 pairs, summed over 4 (step_shares)
    assert train_losses(tmp_path / "accum") == pytest.approx(train_losses(one_dir), rel=2e-6)
    monkeypatch.setattr(DirectPreference, "step_shares", False)
    monkeypatch.setattr(trainer, "epoch_weights", lambda *_: None)  # nor the rows' weights (shares.py)
    in_process(tmp_path / "plain", *args(folders), *flags)
    plain = max_abs_diff(load_model(tmp_path / "plain").state_dict(), load_model(one_dir).state_dict())
    assert plain > 5 * TOL and plain > 100 * diff, (plain, diff)  # measured 2.5e-4 against 6.4e-7
    print(f"weights vs one batch of 16: pair-weighted 4 x 4 {diff:.2e}, per-micro-batch means {plain:.2e}")


def test_a_live_reference_equals_the_cached_one(folders, one_batch, tmp_path):
    one, one_dir = one_batch
    live = in_process(
        tmp_path / "live",
        *args(folders, "--reference", "live", "--batch-size", "16", "--max-steps", "8", "--log-every-steps", "1"),
    )
    assert live["reference"] == "live" and one["reference"] == "cached"
    assert train_losses(tmp_path / "live") == pytest.approx(train_losses(one_dir), rel=1e-5)
    assert max_abs_diff(load_model(tmp_path / "live").state_dict(), load_model(one_dir).state_dict()) < TOL


@pytest.mark.launch
def test_dpo_on_two_ranks_equals_one_rank_with_twice_the_batch(folders, tmp_path):
    """The cached reference computed half on each rank, then gathered. 112 training pairs: 14 batches of 8, 7 a
    rank (an odd count would make accelerate repeat a batch on one rank: even_batches)."""
    even = [*args(folders), "--val-fraction", str(19.5 / N), "--test-fraction", str(19.5 / N)]
    check_two_ranks(even, big_batch(even, tmp_path / "big"), tmp_path)


@pytest.mark.launch
def test_a_packed_dpo_run_sigkilled_mid_run_resumes_bit_identical_on_its_cached_reference(folders, tmp_path):
    import os

    flags = "--packing --batch-size 4 --grad-accum-steps 2 --max-steps 40 --epochs 5 --checkpoint-every-steps 4"
    run = [*args(folders), *flags.split(), "--log-every-steps", "1", "--no-progress"]
    cache = tmp_path / "victim" / "reference_logps.safetensors"
    reference, victim = kill_and_resume(
        tmp_path, run, random.Random("dpo").randint(8, 20), env={"OMP_NUM_THREADS": "1"}
    )
    assert cache.is_file() and os.path.getmtime(cache) < os.path.getmtime(victim / "summary.json")
    ref, res = load_model(reference).state_dict(), load_model(victim).state_dict()
    assert all(torch.equal(ref[k], res[k]) for k in ref), "weights differ"
    assert [(m["step"], m["loss"]) for m in read_metrics(reference)] == [
        (m["step"], m["loss"]) for m in read_metrics(victim)
    ]
    assert read_summary(victim)["resumed_from"] is not None


def test_a_resumed_run_reads_its_reference_back_rather_than_computing_it(folders, tmp_path, capsys):
    in_process(tmp_path / "run", *args(folders, "--max-steps", "1", "--checkpoint-every-steps", "1"))
    cache = tmp_path / "run" / "reference_logps.safetensors"
    written = cache.stat().st_mtime_ns
    capsys.readouterr()
    in_process(tmp_path / "run", *args(folders, "--max-steps", "2", "--resume"))
    out = capsys.readouterr().out
    assert "the reference log-probabilities read from" in out and "computing the reference" not in out
    assert cache.stat().st_mtime_ns == written


# --------------------------------------------------------------------------- bad input


def write_pairs(path, rows: list) -> str:
    return str(write_jsonl(path, rows))


def test_bad_pairs_and_options_are_one_line_and_write_nothing(folders, tmp_path, capsys):
    good = preferences.rows(40, seed=1)
    model, out = ["--model", f"hf:{folders['llama']}"], ["--output-dir", str(tmp_path / "run")]

    def error(rows: list, *flags: str) -> str:
        data = write_pairs(tmp_path / "pairs.jsonl", rows)
        return run_cli_error(capsys, [*model, "--dataset", data, *out, *flags])

    empty = [dict(r) for r in good]
    empty[5]["rejected"] = [{"role": "assistant", "content": " "}]
    assert "row 5 of the train split of" in error(empty) and "the rejected answer is missing or empty" in error(empty)
    same = [dict(r) for r in good]
    same[6]["rejected"] = same[6]["chosen"]
    assert "row 6 of the train split" in (err := error(same)) and "the chosen and rejected answers are the same" in err
    implicit = [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in good]
    implicit[7]["rejected"] = [{"role": "user", "content": "another question"}, *good[7]["rejected"]]
    err = error(implicit)
    assert "row 7 of the train split" in err and "implicit prompt: chosen and rejected must be the same chat" in err
    long = [dict(r) for r in good]
    long[8]["prompt"] = [{"role": "user", "content": "word " * 200}]
    err = error(long)
    assert "row 8 of the train split" in err and "leaves no room for the chosen answer at --max-length 128" in err
    err = error(good, "--beta", "0")
    assert err.endswith("--beta must be positive, got 0.0") or "--beta must be positive" in err
    err = error(good, "--dpo-loss", "simpo", "--reference", "live")
    assert "--reference live: --dpo-loss simpo has no reference model" in err
    err = run_cli_error(
        capsys, ["--model", f"hf:{folders['distilbert']}", "--dataset", str(folders["pairs"]), *out, "--task", "dpo"]
    )
    assert "has no causal-LM head in transformers, so it does not fit --task dpo" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("task", ["dpo", "sft", "lm"])
def test_an_encoder_is_refused_where_a_causal_lm_is_trained(folders, tmp_path, capsys, task):
    """BERT has a causal-LM class (BertLMHeadModel), but a masked-LM checkpoint's config says is_decoder=False: its
    attention is bidirectional, each token sees the ones it is to predict. Refused in one line, nothing written."""
    rows = {
        "dpo": [{"prompt": f"the river {k} is", "chosen": " cold", "rejected": " warm"} for k in range(20)],
        "sft": [{"prompt": f"the river {k} is", "completion": " cold"} for k in range(20)],
        "lm": [{"text": f"the river {k} is cold and the stone is warm"} for k in range(20)],
    }[task]
    data = write_pairs(tmp_path / "data.jsonl", rows)
    run = tmp_path / "run"
    argv = ["--task", task, "--model", f"hf:{folders['bert']}", "--dataset", data, "--output-dir", str(run)]
    err = run_cli_error(capsys, [*argv, "--max-length", "64"])
    assert f"--model hf:{folders['bert']}: BertForMaskedLM" in err
    assert "is not a causal LM" in err and "is_decoder=False" in err and "bidirectional" in err
    assert not run.exists()


def test_a_bert_decoder_is_a_causal_lm_and_an_encoder_may_score_pairs(folders, tmp_path):
    """is_decoder=True makes BERT's attention causal (BertLMHeadModel as a decoder); a reward model is a sequence
    classifier, for which a bidirectional encoder is the usual choice."""
    import shutil

    from anytrain import hf
    from anytrain.config import parse_config
    from anytrain.tasks.hf_lm import HFCausalLM
    from anytrain.tasks.reward.task import RewardModel

    decoder = shutil.copytree(folders["bert"], tmp_path / "decoder")
    config = json.loads((decoder / "config.json").read_text())
    (decoder / "config.json").write_text(json.dumps({**config, "is_decoder": True}))
    cfg = parse_config(["--task", "dpo", "--model", f"hf:{decoder}", "--max-length", "64"])
    assert hf.model_config(cfg, HFCausalLM.head, "dpo", None).is_decoder
    cfg = parse_config(["--task", "reward", "--model", f"hf:{folders['bert']}", "--max-length", "64"])
    assert hf.model_config(cfg, RewardModel.head, "reward", None, ["reward"]).num_labels == 1


# --------------------------------------------------------------------------- the reward model


@pytest.mark.parametrize(
    "extra, accuracy",
    [((), 0.8), (("--lora-r", "8", "--lr", "1e-2"), 0.65)],  # LoRA: adapters and the score head (peft's SEQ_CLS)
    ids=["full", "lora"],
)
def test_a_reward_model_learns_the_pairs_exports_and_predicts(folders, tmp_path, extra, accuracy):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from anytrain.predict import predict

    run_dir = tmp_path / "reward"
    flags = ("--max-steps", "20", "--batch-size", "8", "--lr", "3e-3", *extra)
    summary = in_process(run_dir, "--task", "reward", *args(folders, *flags))
    assert summary["task"] == "reward" and summary["test_accuracy"] >= accuracy, summary
    assert (run_dir / "adapter").is_dir() == bool(extra)  # LoRA: the adapter beside the merged model in hf/
    model = AutoModelForSequenceClassification.from_pretrained(run_dir / "hf").eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "hf")
    assert model.config.num_labels == 1
    texts = ["<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n", "hello"]
    path = write_jsonl(tmp_path / "texts.jsonl", [{"text": t} for t in texts])
    rows = predict(str(run_dir), str(path))
    with torch.no_grad():
        expected = [model(**tokenizer(t, return_tensors="pt")).logits[0, 0].item() for t in texts]
    assert [r["reward"] for r in rows] == pytest.approx(expected, abs=1e-5)


# --------------------------------------------------------------------------- the SFT -> DPO study (examples/)


def study():
    """examples/sft_then_dpo.py, imported as a module (its runs are minutes long: the guide gives its figures)."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("sft_then_dpo", ROOT / "examples" / "sft_then_dpo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_study_scores_prompts_asked_in_neither_training_set(monkeypatch):
    from anytrain.data import instructions

    example = study()
    rows = example.held_out(300)
    asked = [row["prompt"][-1]["content"] for row in rows]
    seen = {m["content"] for row in instructions.rows() for m in row["messages"] if m["role"] == "user"}
    seen |= {row["prompt"][-1]["content"] for row in preferences.rows()}
    assert len(rows) == 300 and not seen & set(asked)
    # the score: exact match with the chosen answer, the near-miss share, per kind
    replies = [row["chosen"][0]["content"] if k % 2 else row["rejected"][0]["content"] for k, row in enumerate(rows)]
    replies[1] = "no"  # one odd row neither right nor the near miss
    monkeypatch.setattr(example, "answers", lambda folder, given: replies)
    scored = example.score(None, rows)
    assert scored["exact_match"] == pytest.approx(149 / 300) and scored["near_miss"] == pytest.approx(150 / 300)
    kinds = {row["kind"] for row in rows}
    assert set(scored["by_kind"]) == kinds and all(0 < v < 1 for v in scored["by_kind"].values())


def test_the_studys_noisy_demonstrations_end_in_the_near_miss_at_the_share_asked(tmp_path):
    from anytrain.data import instructions

    example = study()
    assert example.demonstrations(tmp_path, 0.0) == "instructions"  # no noise: the bundled set itself
    clean = instructions.rows()
    noisy = [json.loads(line) for line in open(example.demonstrations(tmp_path, 0.45))]
    assert len(noisy) == len(clean)
    changed = [k for k, (a, b) in enumerate(zip(clean, noisy)) if a["messages"] != b["messages"]]
    assert 0.42 < len(changed) / len(clean) < 0.48
    for k in changed:  # only the last answer differs, and it is wrong
        before, after = clean[k]["messages"], noisy[k]["messages"]
        assert before[:-1] == after[:-1] and before[-1]["content"] != after[-1]["content"]
