"""Kahneman-Tversky Optimization (`--task kto`), offline, with a tiny Llama-style model whose tokenizer has a ChatML
template (tests/hfmodels.py) and the bundled `preferences` pairs, as pairs or unpaired (two rows in three desirable).

Each loss is TRL's formula on hand-made log-ratios; rows are tokenised as TRL tokenises them and pairs unpaired as
TRL unpairs them; the KL pairs are a seeded cycle of each split, and every layout of an optimizer step (ranks,
accumulation) holds the same rows; the first step's loss is 1/2 (the model is its own reference, z = 0), and the run
learns the preferences (reward margin up, loss down) and samples; accumulated micro-batches equal one big batch,
with the control that a KL estimate per micro-batch does not; a live reference equals the cached one, LoRA's is the
model with its adapter off; 2 ranks equal 1 and a SIGKILL then --resume is bit-identical (launched); bad input is one
line. The conformance of the step to the formula: tests/conformance/test_conformance_kto.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import max_abs_diff, read_metrics, read_summary, run_cli_error
from hfchecks import STEPS, TOL, big_batch, check_kill_and_resume, check_two_ranks, in_process
from hfmodels import tiny_llama
from textdata import write_jsonl

from anytrain import load_model
from anytrain.data import preferences

transformers = pytest.importorskip("transformers")

N = 150
KTO = f"--val-fraction {15.5 / N} --test-fraction {15.5 / N} --max-length 128 --beta 1".split()  # the KL term counts
OWN = ("chosen_reward", "chosen_logps", "rejected_reward", "rejected_logps", "reward_margin", "kl")


def unpaired(rows: list[dict]) -> list[dict]:
    """Two rows in three desirable (the chosen answer), the third undesirable (the rejected one)."""
    return [{"prompt": r["prompt"], "completion": r["chosen"] if k % 3 else r["rejected"], "label": bool(k % 3)}
            for k, r in enumerate(rows)]  # fmt: skip


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("kto")
    pairs = preferences.rows(N, seed=3)
    return {
        "pairs": write_jsonl(root / "pairs.jsonl", pairs),
        "unpaired": write_jsonl(root / "unpaired.jsonl", unpaired(pairs)),
        "llama": tiny_llama(root / "llama"),
    }


def args(folders, data: str = "unpaired", *flags: str) -> list[str]:
    return ["--task", "kto", "--model", f"hf:{folders['llama']}", "--dataset", str(folders[data]), *KTO, *flags]


def train_lines(run_dir) -> list[dict]:
    return [m for m in read_metrics(run_dir) if m["kind"] == "train"]


# --------------------------------------------------------------------------- the formulas and the data


def test_each_loss_is_trls_formula_on_hand_made_log_ratios():
    """TRL 1.16 KTOTrainer._compute_loss: kto 1 - σ(β(r - z)) desirable, 1 - σ(β(z - r)) undesirable; apo_zero_unpaired
    1 - σ(βr) and σ(βr); each weighted by its class's weight."""
    from anytrain.tasks.kto.losses import weighted

    r = torch.tensor([0.7, -1.2, 2.0, -0.3], dtype=torch.float64)
    desirable = torch.tensor([True, True, False, False])
    z, beta, weights = torch.tensor(0.4, dtype=torch.float64), 0.5, (1.5, 0.25)
    sig = torch.sigmoid
    kto = [1.5 * (1 - sig(beta * (r[0] - z))), 1.5 * (1 - sig(beta * (r[1] - z))),
           0.25 * (1 - sig(beta * (z - r[2]))), 0.25 * (1 - sig(beta * (z - r[3])))]  # fmt: skip
    apo = [1.5 * (1 - sig(beta * r[0])), 1.5 * (1 - sig(beta * r[1])), 0.25 * sig(beta * r[2]), 0.25 * sig(beta * r[3])]
    assert torch.allclose(weighted("kto", r, desirable, z, beta, weights), torch.stack(kto))
    assert torch.allclose(weighted("apo_zero_unpaired", r, desirable, z, beta, weights), torch.stack(apo))
    zero = weighted("kto", torch.zeros(4), desirable, torch.tensor(0.0), beta, (1.0, 1.0))
    assert torch.equal(zero, torch.full((4,), 0.5))  # the first step: the model is its reference, z = 0


def trl_split(tokenizer, prompt, completion) -> tuple[list[int], list[int]]:
    """TRL 1.16 KTOTrainer._prepare_dataset: EOS added to a text completion that lacks it; the prompt and prompt +
    completion tokenised (a chat by its template, the prompt with its generation prompt); the completion from where
    they part (common_prefix_length)."""
    if isinstance(prompt, str):
        end = tokenizer.eos_token
        completion = completion if completion.endswith(end) else completion + end
        alone, whole = tokenizer(prompt)["input_ids"], tokenizer(prompt + completion)["input_ids"]
    else:
        alone = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
        whole = tokenizer.apply_chat_template(prompt + completion, tokenize=True, return_dict=True)
        alone, whole = alone["input_ids"], whole["input_ids"]
    k = next((i for i, (a, b) in enumerate(zip(alone, whole)) if a != b), min(len(alone), len(whole)))
    return whole[:k], whole[k:]


def read_rows(folders, tmp_path, rows: list[dict]):
    from anytrain.config import parse_config
    from anytrain.tasks.kto.rows import kto_splits

    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    cfg = parse_config(["--task", "kto", "--dataset", str(data), "--max-length", "128", "--val-fraction", "0.25",
                        "--test-fraction", "0.25", "--seed", "3"])  # fmt: skip
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["llama"])
    return kto_splits(cfg, tokenizer, None, None, 1)[0], tokenizer


def stored(rows, i: int) -> tuple[list[int], list[int]]:
    """Row i's completion sequence as (prompt ids, completion ids), and its KL pair's."""
    out = []
    for k in (2 * i, 2 * i + 1):
        ids, labels = rows.sequence(k)
        learned = labels != -100
        out.append((ids[~learned].tolist(), ids[learned].tolist()))
    return out


def test_rows_are_tokenised_and_pairs_unpaired_as_trl_does(folders, tmp_path):
    """Text and chats, unpaired and paired: each row's completion tokens are TRL's (a text completion ends with the
    end-of-text token, once), a pair gives its desirable row then its undesirable one, and each KL pair is the row's
    prompt with its partner's completion."""
    from anytrain.tasks.kto.rows import partners

    texts = [{"prompt": "Q: Is it? A: wh", "completion": "at.", "label": True},
             {"prompt": "Q: Where? A:", "completion": " Our house.<|endoftext|>", "label": False},
             {"prompt": "Q: Who?", "completion": " us.", "label": True},
             {"prompt": "Q: And? A:", "completion": " Use it.", "label": False}] * 2  # fmt: skip
    chats = unpaired(preferences.rows(8, seed=1))
    pairs = preferences.rows(4, seed=2)
    for given, expected in ((texts, texts), (chats, chats), (pairs, unpaired_pairs(pairs))):
        data, tokenizer = read_rows(folders, tmp_path, given)
        for split in ("train", "validation", "test"):
            rows = getattr(data, split)
            partner = partners(len(rows), 3, split)
            for i in range(len(rows)):
                (prompt, completion), (kl_prompt, kl_completion) = stored(rows, i)
                source = source_row(rows, i, expected, tokenizer)
                assert (prompt, completion) == trl_split(tokenizer, source["prompt"], source["completion"])
                assert bool(rows.labels[i]) == source["label"]
                assert kl_prompt == prompt and kl_completion == stored(rows, int(partner[i]))[0][1]
    assert trl_split(tokenizer, "Q: Where? A:", " Our house.<|endoftext|>")[1].count(tokenizer.eos_token_id) == 1


def unpaired_pairs(pairs: list[dict]) -> list[dict]:
    """TRL's unpair_preference_dataset, a pair's rows side by side: its chosen answer desirable, its rejected not."""
    sides = ("chosen", "rejected")
    return [{"prompt": p["prompt"], "completion": p[k], "label": k == "chosen"} for p in pairs for k in sides]


def source_row(rows, i: int, expected: list[dict], tokenizer) -> dict:
    """The expected row whose TRL tokens are row i's (the splits are carved from a shuffle: found by its tokens)."""
    ids = rows.sequence(2 * i)[0].tolist()
    found = [r for r in expected if sum(trl_split(tokenizer, r["prompt"], r["completion"]), []) == ids]
    assert found, ids
    return found[0]


def test_kl_pairs_are_a_seeded_cycle_and_every_step_layout_holds_the_same_rows():
    """Row i's KL completion is its successor's in a seeded cycle of the split: no row its own partner, every
    completion used once. 120 rows, 16 a step: one rank, two ranks, accumulation and both give each step the same rows
    (the step's first micro-batch carries its rank's share), and a filler (shares.Rounds) carries none."""
    from anytrain.tasks.kto.batches import KTORows, Layout
    from anytrain.tasks.kto.rows import partners

    partner = partners(120, 7, "train")
    seen, k = [], 0
    for _ in range(120):
        seen.append(k)
        k = int(partner[k])
    assert k == 0 and sorted(seen) == list(range(120)) and not (partner == np.arange(120)).any()
    assert np.array_equal(partner, partners(120, 7, "train")) and not np.array_equal(partner, partners(120, 8, "train"))
    trl = partners(10, 7, "train", batch=4)  # --kl-pairs trl: each batch's completions rotated by one (TRL's)
    assert trl.tolist() == [3, 0, 1, 2, 7, 4, 5, 6, 9, 8]
    rows = KTORows.of([[1]] * 10, [[k + 2] for k in range(10)], [k % 2 == 0 for k in range(10)], trl, 8, 0, None, 0,
                      "train", Layout(10, 4, 1, 1, 7, shuffled=False))  # fmt: skip
    rows.set_epoch(3)  # TRL's order too: every epoch reads the rows as they are
    assert rows.rows_at(list(range(10))) == list(range(10)) and rows.sequence(1)[0].tolist() == [1, 5]
    for batch, processes, accum in ((16, 1, 1), (8, 2, 1), (4, 1, 4), (4, 2, 2), (2, 2, 4)):
        layout, steps = Layout(120, batch, processes, accum, 0), {}
        counts: dict[int, list[int]] = {}
        for p in range(math.ceil(120 / batch)):
            positions = list(range(p * batch, min((p + 1) * batch, 120)))
            mine = layout.step(positions)
            assert mine[(p // processes) % accum] == positions  # its own micro-batch, in its place
            steps.setdefault(p // (processes * accum), set()).update(q for micro in mine for q in micro)
            counts.setdefault(p // (processes * accum), []).append(len(mine))
        assert steps == {s: set(range(16 * s, min(16 * s + 16, 120))) for s in range(8)}, (batch, processes, accum)
        for p in range(math.ceil(120 / batch)):  # every rank runs as many KL passes: the most any rank has
            positions = list(range(p * batch, min((p + 1) * batch, 120)))
            assert layout.most(positions) == max(counts[p // (processes * accum)])
        assert layout.step([0]) == [] and layout.most([0]) == max(counts[7])  # a filler: the epoch's last step


# --------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def learnt(folders, tmp_path_factory):
    """The bundled pairs, unpaired: 240 training rows, 3 epochs of 30 steps."""
    run_dir = tmp_path_factory.mktemp("kto_learn") / "run"
    flags = ("--epochs", "3", "--batch-size", "8", "--lr", "3e-3", "--log-every-steps", "1")
    return in_process(run_dir, *args(folders, "pairs", *flags)), run_dir


def test_kto_learns_the_bundled_preferences_from_one_half(learnt):
    summary, run_dir = learnt
    assert summary["task"] == "kto" and summary["kto_format"] == "explicit chats"
    assert summary["train_rows"] == 240 and summary["train_desirable"] == summary["train_undesirable"] == 120
    assert summary["reference"] == "cached" and summary["kto_loss"] == "kto" and summary["best_metric"] == "loss"
    lines = train_lines(run_dir)
    first = lines[0]
    assert first["loss"] == pytest.approx(0.5, abs=1e-6)  # the model is its own reference: r = 0, z = 0
    assert first["chosen_reward"] == pytest.approx(0.0, abs=1e-5) and first["kl"] == pytest.approx(0.0, abs=1e-5)
    assert all(set(OWN) <= line.keys() for line in lines) and len(lines) == 90
    assert summary["val_loss"] < 0.25 and summary["test_reward_margin"] > 3, summary  # measured 0.14, 6.5 (beta 1)
    assert summary["test_chosen_reward"] > summary["test_rejected_reward"]
    assert summary["test_rejected_logps"] < summary["test_chosen_logps"]
    assert (run_dir / "reference_logps.safetensors").is_file() and (run_dir / "hf" / "model.safetensors").is_file()


def test_a_kto_run_samples_through_the_chat_template(learnt):
    from anytrain.sample import sample

    _, run_dir = learnt
    assert isinstance(sample(str(run_dir), "What is 12 + 5?", tokens=4, top_k=1, seed=0), str)


@pytest.fixture(scope="module")
def one_batch(folders, tmp_path_factory):
    return big_batch(args(folders), tmp_path_factory.mktemp("kto_big"))


def test_accumulation_equals_one_big_batch_and_a_kl_per_micro_batch_does_not(folders, one_batch, tmp_path, monkeypatch):
    """120 training rows in batches of 16: the 8th step holds 8 rows, two micro-batches of 4 accumulated. The KL
    estimate is the step's (its first micro-batch reads the step's KL pairs); the control, each micro-batch's own KL
    estimate (TRL's under accumulation), takes other steps."""
    from anytrain.tasks.kto.batches import Layout

    one, one_dir = one_batch
    flags = ("--batch-size", "4", "--grad-accum-steps", "4", *STEPS)
    accum = in_process(tmp_path / "accum", *args(folders), *flags)
    assert accum["optimizer_steps"] == one["optimizer_steps"] == 8
    diff = max_abs_diff(load_model(tmp_path / "accum").state_dict(), load_model(one_dir).state_dict())
    assert diff < TOL, diff
    lines, big = train_lines(tmp_path / "accum"), train_lines(one_dir)
    assert [m["loss"] for m in lines] == pytest.approx([m["loss"] for m in big], rel=2e-6)
    assert [m["kl"] for m in lines] == pytest.approx([m["kl"] for m in big], rel=1e-5, abs=1e-6)
    assert max(m["kl"] for m in big) > 0.1  # the KL term is live (measured up to 0.9)
    monkeypatch.setattr(Layout, "step", lambda self, positions: [positions])  # each micro-batch its own z
    in_process(tmp_path / "micro", *args(folders), *flags)
    micro = max_abs_diff(load_model(tmp_path / "micro").state_dict(), load_model(one_dir).state_dict())
    assert micro > 5 * TOL and micro > 100 * diff, (micro, diff)
    print(f"weights vs one batch of 16: 4 x 4 {diff:.2e}, a KL estimate per micro-batch {micro:.2e}")


def test_a_live_reference_equals_the_cached_one(folders, one_batch, tmp_path):
    one, one_dir = one_batch
    live = in_process(
        tmp_path / "live", *args(folders, "unpaired", "--reference", "live", "--batch-size", "16", *STEPS)
    )
    assert live["reference"] == "live" and one["reference"] == "cached"
    assert [m["loss"] for m in train_lines(tmp_path / "live")] == pytest.approx(
        [m["loss"] for m in train_lines(one_dir)], rel=1e-5
    )
    assert max_abs_diff(load_model(tmp_path / "live").state_dict(), load_model(one_dir).state_dict()) < TOL
    assert live["val_loss"] == pytest.approx(one["val_loss"], abs=1e-6)


def test_lora_trains_against_the_model_with_its_adapter_off_and_apo_has_no_kl(folders, tmp_path):
    flags = ("--lora-r", "4", "--kto-loss", "apo_zero_unpaired", "--batch-size", "1", "--max-steps", "3")
    summary = in_process(tmp_path / "run", *args(folders, "unpaired", *flags, "--log-every-steps", "1"))
    assert summary["reference"] == "adapter" and summary["kto_loss"] == "apo_zero_unpaired"
    lines = train_lines(tmp_path / "run")
    assert lines[0]["loss"] == pytest.approx(0.5, abs=1e-6) and "kl" not in lines[0] and "val_kl" not in summary
    assert summary["trainable_parameters"] < summary["parameters"] / 2
    assert not (tmp_path / "run" / "reference_logps.safetensors").exists()


@pytest.mark.launch
def test_kto_on_two_ranks_equals_one_rank_with_twice_the_batch(folders, tmp_path):
    """120 training rows: 15 batches of 8, so the second rank's last is a filler; the KL estimate adds both ranks'
    sums, and the evaluation's is its split's (each rank a share of it)."""
    two = check_two_ranks(args(folders), big_batch(args(folders), tmp_path / "big"), tmp_path)
    one = read_summary(tmp_path / "big")
    assert two["val_kl"] == pytest.approx(one["val_kl"], abs=1e-5) and one["val_kl"] > 0
    lines, big = train_lines(tmp_path / "two"), train_lines(tmp_path / "big")
    for key in OWN:
        assert [m[key] for m in lines] == pytest.approx([m[key] for m in big], rel=1e-4, abs=1e-5), key


@pytest.mark.launch
def test_a_kto_run_sigkilled_mid_run_resumes_bit_identical(folders, tmp_path):
    check_kill_and_resume(args(folders), tmp_path, "kto")
    victim = tmp_path / "victim"
    assert (victim / "reference_logps.safetensors").is_file()
    figures = [
        [{k: m[k] for k in ("step", "loss", *OWN)} for m in train_lines(d)] for d in (tmp_path / "reference", victim)
    ]
    assert figures[0] == figures[1]  # the task's figures too


# --------------------------------------------------------------------------- choosing the task and bad input


def test_auto_picks_kto_for_unpaired_rows_only(folders, tmp_path):
    from anytrain.config import parse_config
    from anytrain.tasks.settle import settle

    def key(path) -> str:
        return settle(parse_config(["--model", f"hf:{folders['llama']}", "--dataset", str(path)])).key

    rows = unpaired(preferences.rows(6, seed=1))
    assert key(folders["unpaired"]) == "hf:kto" and key(folders["pairs"]) == "hf:dpo"
    assert (
        key(write_jsonl(tmp_path / "sft.jsonl", [{k: r[k] for k in ("prompt", "completion")} for r in rows]))
        == "hf:sft"
    )


def test_bad_rows_and_options_are_one_line_and_write_nothing(folders, tmp_path, capsys):
    good = unpaired(preferences.rows(40, seed=1))
    model, out = ["--model", f"hf:{folders['llama']}"], ["--output-dir", str(tmp_path / "run")]

    def error(rows: list, *flags: str) -> str:
        data = write_jsonl(tmp_path / "rows.jsonl", rows)
        return run_cli_error(capsys, [*model, "--dataset", str(data), "--task", "kto", *out, *flags])

    no_label = [{k: r[k] for k in ("prompt", "completion")} for r in good]
    assert "has no label column (columns: prompt, completion)" in error(no_label)
    ints = [{**r, "label": int(r["label"])} for r in good]
    err = error(ints)
    assert "row 0 of the train split" in err and "its label is 0, not true or false" in err
    err = error([{**r, "label": True} for r in good])
    assert "every row of the train split" in err and "is desirable (label true); kto needs both" in err
    empty = [dict(r) for r in good]
    empty[5]["completion"] = [{"role": "assistant", "content": " "}]
    assert "row 5 of the train split" in (err := error(empty)) and "the completion is missing or empty" in err
    assert "--beta must be positive" in error(good, "--beta", "0")
    assert "--desirable-weight must be positive" in error(good, "--desirable-weight", "0")
    assert "--undesirable-weight must be positive" in error(good, "--undesirable-weight", "-1")
    err = error(good, "--batch-size", "1")
    assert "error: --batch-size 1: --kto-loss kto estimates its KL term" in err and "2 rows or more" in err
    assert "--reference adapter: the model with its adapter off needs LoRA" in error(good, "--reference", "adapter")
    err = error(good, "--loss-type", "sigmoid")  # TRL's name for --kto-loss
    assert "--kto-loss/--loss-type: invalid choice: 'sigmoid' (choose from 'kto', 'apo_zero_unpaired')" in err
    assert not (tmp_path / "run").exists()
