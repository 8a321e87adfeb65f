"""--task grpo (issue 40): online RL with verifiable rewards through the one loop, on the tests' tiny chat Llama.

Sampling is a function of each completion's key (the same completions in one batch or two, and from the tempered
softmax); the masks read back what generate wrote (a completion ends at its first stop token; its tokens'
log-probabilities in training are those generate sampled from, left padding included); advantages (GRPO's and
RLOO's leave-one-out, by hand), clipping, KL and the three normalisations as stated; --advantage rloo settles
RLOOTrainer's defaults; reward functions with TRL's signature get the dataset's columns and are
refused in one line when they raise, return the wrong number of values or NaN; bad input is one line each; the
reward rises; and the step is exact: 4 accumulated micro-batches equal one batch, 2 ranks equal 1 (launched, with
what a reward function logs), a SIGKILLed run resumes bit for bit, its completions table too (launched). The reward
functions' TRL semantics and the completions table: test_grpo_rewards.py."""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import kill_and_resume, read_metrics, read_summary, run_cli_error
from hfchecks import (
    check_accumulated_steps,
    check_start_up_check_forgotten,
    check_two_ranks_of_half_the_batch,
    in_process,
)
from hfmodels import tiny_bert_mlm, tiny_llama

from anytrain.config import ConfigError, TrainConfig
from anytrain.tasks.causal_lm.generation import generate, left_padded, prompt_cache, read_back
from anytrain.tasks.causal_lm.head import head_of
from anytrain.tasks.causal_lm.logprobs import bare, completion_logps
from anytrain.tasks.causal_lm.sampler import NoisyScores, Sampling, Seen, completion_keys, gumbel, sampled_scores
from anytrain.tasks.grpo import loss as objective
from anytrain.tasks.grpo.rewards import Reward, load_rewards, scores, total
from anytrain.tasks.grpo.task import GroupRelative

transformers = pytest.importorskip("transformers")
NAN = float("nan")

REWARDS = '''
def ones(prompts, completions, completion_ids, **columns):
    """The share of the completion's characters that are the digit 1."""
    texts = [c[-1]["content"] for c in completions]
    return [t.count("1") / max(len(t), 1) for t in texts]


def checks_columns(prompts, completions, completion_ids, answer, topic, **columns):
    assert len(answer) == len(topic) == len(completions) and isinstance(prompts[0], list)
    return [None if t == "skip" else float(len(ids)) for t, ids in zip(topic, completion_ids)]


def raises_on_long(prompts, completions, completion_ids, **columns):
    if any(len(ids) > 3 for ids in completion_ids):
        raise ValueError("too long")
    return [0.0] * len(completions)


def too_few(prompts, completions, completion_ids, **columns):
    return [0.0]


def nan(prompts, completions, completion_ids, **columns):
    return [float("nan")] * len(completions)


def logs(prompts, completions, completion_ids, log_metric, log_extra, **columns):
    """Scores nothing (weight 0); logs two means in an order that depends on the completions (on the process)."""
    lengths = [len(ids) for ids in completion_ids]
    ones = sum(c[-1]["content"].count("1") for c in completions) / len(completions)
    pairs = [("mean_length", sum(lengths) / len(lengths)), ("ones_per_completion", ones)]
    for name, value in pairs if lengths[0] % 2 else pairs[::-1]:
        log_metric(name, value)
    log_extra("length", lengths)
    return [0.0] * len(completions)
'''


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo")
    rng = random.Random(0)
    rows = []
    for k in range(48):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        prompt = [{"role": "user", "content": f"{a} + {b} ="}]
        rows.append({"prompt": prompt, "answer": str(a + b), "topic": "skip" if k % 5 == 0 else "sum"})
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "rewards.py").write_text(REWARDS)
    return {
        "root": root,
        "model": tiny_llama(root / "llama"),
        "data": root / "prompts.jsonl",
        "rewards": root / "rewards.py",
    }


@pytest.fixture(scope="module")
def model(folders):
    m = transformers.AutoModelForCausalLM.from_pretrained(folders["model"])
    m.config.use_cache = False  # as anytrain trains it: generate turns its cache on itself
    return head_of(m)[0]  # the per-token log-probabilities, as anytrain trains a causal LM


def args(folders, *flags: str) -> list[str]:
    return [
        "--model", f"hf:{folders['model']}", "--dataset", str(folders["data"]), "--reward",
        f"{folders['rewards']}:ones", "--num-generations", "4", "--max-new-tokens", "6", "--batch-size", "4",
        "--lr", "3e-3", "--log-every-steps", "1", "--eval-every-steps", "0", "--seed", "3", *flags,
    ]  # fmt: skip


def prompts_of(folders, count: int) -> list[list[int]]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["model"])
    out = []
    for line in folders["data"].read_text().splitlines()[:count]:
        text = tokenizer.apply_chat_template(json.loads(line)["prompt"], tokenize=False, add_generation_prompt=True)
        out.append(tokenizer(text + "x" * (len(out) % 3), add_special_tokens=False).input_ids)  # uneven lengths
    return out


def settings(folders) -> Sampling:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["model"])
    pad = tokenizer.eos_token_id  # as anytrain pads a tokenizer without a pad token
    return Sampling(6, (tokenizer.convert_tokens_to_ids("<|im_end|>"),), pad)


# --------------------------------------------------------------------------- sampling and masks


def test_a_completion_is_a_function_of_its_key_not_of_its_batch(folders, model):
    prompts = prompts_of(folders, 4)
    keys = completion_keys(3, 0, 0, torch.arange(4), 2)
    doubled = [p for p in prompts for _ in range(2)]
    one = generate(model, doubled, keys, settings(folders)).completion_ids()
    halves = [generate(model, doubled[k : k + 4], keys[k : k + 4], settings(folders)).completion_ids() for k in (0, 4)]
    assert one == halves[0] + halves[1]  # 1 batch of 8 = 2 batches of 4 (left padding differs between them)
    assert len({tuple(c) for c in one}) > 4  # and the keys make different completions
    assert (
        generate(model, doubled, completion_keys(4, 0, 0, torch.arange(4), 2), settings(folders)).completion_ids()
        != one
    )


def test_generating_in_pieces_gives_the_same_completions_and_rows(folders, model):
    prompts = prompts_of(folders, 4)  # of uneven lengths: each piece is padded to its own widest
    keys = completion_keys(3, 0, 0, torch.arange(4), 2)
    doubled = [p for p in prompts for _ in range(2)]
    whole = generate(model, doubled, keys, settings(folders))
    pieces = generate(model, doubled, keys, settings(folders), chunk=3)  # --generate-batch 3: pieces of 3, 3, 2
    assert pieces.completion_ids() == whole.completion_ids()
    for name in ("ids", "mask", "positions", "completion", "truncated"):
        assert torch.equal(getattr(pieces, name), getattr(whole, name)), name
    assert pieces.width == whole.width


def test_generation_is_sized_to_the_free_memory(folders, model, monkeypatch):
    """--generate-batch 0: as many completions at a time as their key-value caches and a step's scores fit in half
    the free memory (all at once where they fit, at least one): a row's bytes by the model's config."""
    from anytrain.tasks.causal_lm import generation

    doubled = [p for p in prompts_of(folders, 4) for _ in range(2)]
    sampling = settings(folders)
    per_row = generation.row_bytes(model, max(map(len, doubled)) + 6)
    c = model.config
    cache = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4
    assert per_row == cache * (max(map(len, doubled)) + 6) + 128 * c.vocab_size
    for free, chunk in ((2 * 3 * per_row + 1, 3), (2 * 8 * per_row, 0), (0, 1)):  # 3 fit; all 8 fit; none fits
        monkeypatch.setattr(generation, "free_bytes", lambda device, free=free: free)
        assert generation.fitting(model, doubled, sampling) == chunk, free


def test_gumbel_noise_samples_the_tempered_softmax_within_the_nucleus():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    keys = torch.arange(40_000)
    picks = (logits / 0.7 + gumbel(keys, 5, 4)).argmax(1)
    frequencies = torch.bincount(picks, minlength=4).float() / len(keys)
    assert torch.allclose(frequencies, (logits / 0.7).softmax(0), atol=0.01), frequencies
    scores = NoisyScores(keys, 0, Sampling(1, (0,), 0, top_p=0.7))(
        torch.zeros(len(keys), 5), logits.expand(len(keys), -1)
    )
    assert set(scores.argmax(1).tolist()) == {0, 1}  # softmax 0.64, 0.24: the smallest set of mass 0.7 is tokens 0, 1


def test_the_noise_is_murmur3_in_int64_a_position_at_a_time_whatever_its_block():
    """sampler.noise hashes in int32 (products wrapping) a block of positions at once: the very floats of the
    finaliser in int64 without overflow, one position at a time, for any key, position (past 2**32 too) and size;
    and generate's processor reads each position's from its block (blocks of 1, 3 or all positions: one sample)."""
    from anytrain.tasks.causal_lm import sampler
    from anytrain.tasks.causal_lm.sampler import MASK32, SALT, mix32, noise

    def int64(keys, position, vocabulary):
        tokens = torch.arange(vocabulary, dtype=torch.int64)
        x = mix32(mix32(mix32(keys[:, None] ^ (position & MASK32)) ^ tokens[None, :]) ^ SALT)
        return (-torch.log(-torch.log((x.double() + 0.5) / 2.0**32))).float()

    generator = torch.Generator().manual_seed(1)
    edges = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1])
    for rows, vocabulary, first, count in ((5, 7, 0, 3), (3, 2049, 2**32 - 2, 4), (17, 400, 123, 5), (1, 1, 9, 1)):
        keys = torch.cat([edges, torch.randint(0, 2**32, (rows,), generator=generator)])
        block = noise(keys, range(first, first + count), vocabulary)
        assert torch.equal(block, torch.stack([int64(keys, p, vocabulary) for p in range(first, first + count)], 1))
    keys, scores = completion_keys(3, 0, 0, torch.arange(3), 2), torch.randn(6, 50)
    picks = {}
    for size in (50 * 6, 3 * 50 * 6, sampler.NOISE_BLOCK):  # blocks of 1, 3 and all 8 positions
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sampler, "NOISE_BLOCK", size)
            processor = NoisyScores(keys, 4, Sampling(8, (0,), 0))
            picks[size] = [processor(torch.zeros(6, 4 + p), scores).argmax(1) for p in range(8)]
    assert all(torch.equal(a, b) for got in picks.values() for a, b in zip(got, picks[sampler.NOISE_BLOCK]))
    assert torch.equal(picks[300][5], (scores + int64(keys, 5, 50)).argmax(1))


FILTERS = [  # each flag alone, then all of them with a temperature and top-p (TRL's order: transformers')
    {"top_k": 5},
    {"min_p": 0.3},
    {"repetition_penalty": 1.8},
    {"repetition_penalty": 0.6},
    {"temperature": 0.7, "top_k": 12, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.3},
]


def transformers_processors(given: dict, padding: torch.Tensor):
    """The logits processors transformers' generate runs for TRL's GRPOConfig with these settings (generation/utils.py:
    the repetition penalty leaving out each row's left padding, then temperature, top-k, top-p, min-p)."""
    from transformers import generation as g

    processors = []
    if given.get("repetition_penalty", 1.0) != 1.0:
        processors.append(g.RepetitionPenaltyLogitsProcessor(given["repetition_penalty"], prompt_ignore_length=padding))
    if given.get("temperature", 1.0) != 1.0:
        processors.append(g.TemperatureLogitsWarper(given["temperature"]))
    if given.get("top_k", 0):
        processors.append(g.TopKLogitsWarper(given["top_k"]))
    if given.get("top_p", 1.0) < 1.0:
        processors.append(g.TopPLogitsWarper(given["top_p"]))
    if given.get("min_p"):
        processors.append(g.MinPLogitsWarper(given["min_p"]))
    return g.LogitsProcessorList(processors)


@pytest.mark.parametrize("given", FILTERS, ids=lambda d: ", ".join(f"{k} {v}" for k, v in d.items()))
def test_each_sampling_flag_filters_as_its_transformers_processor(given):
    """On random logits of left-padded rows, over three generated tokens: the scores sampled from are transformers'
    processors' (the same tokens kept, the same values), the flag changes them, and the keyed noise samples their
    softmax."""
    generator = torch.Generator().manual_seed(0)
    rows, vocabulary, width = 6, 40, 9
    ids = torch.randint(0, vocabulary, (rows, width), generator=generator)
    padding = torch.tensor([0, 3, 1, 0, 5, 2])
    mask = (torch.arange(width)[None, :] >= padding[:, None]).long()
    ids = ids.masked_fill(mask == 0, 7)  # the pad id, a token some rows also read
    sampling, seen = Sampling(3, (0,), 7, **given), Seen(mask) if "repetition_penalty" in given else None
    theirs = transformers_processors(given, padding)
    for _ in range(3):
        logits = 3 * torch.randn(rows, vocabulary, generator=generator)
        ours = sampled_scores(logits, sampling, None if seen is None else seen(ids, vocabulary))
        expected = theirs(ids, logits.clone())
        assert torch.equal(ours, expected)
        plain = logits / given.get("temperature", 1.0)
        assert not torch.equal(ours, plain)  # the flag changed what is sampled
        assert ((ours == float("-inf")) | (ours == plain)).all() or "repetition_penalty" in given  # filters drop
        ids = torch.cat([ids, torch.randint(0, vocabulary, (rows, 1), generator=generator)], 1)  # the next token
    keys, sampling = torch.arange(20_000), Sampling(1, (0,), 7, **given)
    row = ids[:1, :width].expand(len(keys), -1)  # one row's prompt under 20,000 keys
    logits = (3 * torch.randn(1, vocabulary, generator=generator)).expand(len(keys), -1)
    picks = NoisyScores(keys, width, sampling, mask[:1].expand(len(keys), -1))(row, logits).argmax(1)
    frequencies = torch.bincount(picks, minlength=vocabulary).double() / len(keys)
    expected = transformers_processors(given, padding[:1])(ids[:1, :width], logits[:1].clone()).softmax(-1)[0].double()
    assert (frequencies[expected == 0] == 0).all() and (frequencies - expected).abs().max() < 0.015


def test_filtered_sampling_is_a_function_of_each_completions_key(folders, model, monkeypatch):
    """With every flag on: one completion is the same generated alone, in a batch of 4 or of 8, with each prompt read
    once (its cache shared) or per row; the repetition penalty reads each row's own prompt (no padding) also from
    a shared cache; top-k 1 is greedy."""
    from anytrain.tasks.causal_lm import sampler

    prompts = prompts_of(folders, 4)  # of uneven lengths: the rows' left padding differs with the batch
    doubled = [p for p in prompts for _ in range(2)]
    keys = completion_keys(3, 0, 0, torch.arange(4), 2)
    sampling = replace(settings(folders), temperature=0.8, top_k=20, min_p=0.02, repetition_penalty=1.5)
    firsts, real = [], sampler.Seen.__call__

    def recorded(self, input_ids, vocabulary):
        out = real(self, input_ids, vocabulary)
        if input_ids.shape[1] == len(self.prompt_mask[0]):  # a generate call's first token: the prompts alone
            firsts.append(out.clone())
        return out

    monkeypatch.setattr(sampler.Seen, "__call__", recorded)
    shared = generate(model, doubled, keys, sampling, shared=prompt_cache(model)).completion_ids()
    assert [set(row.nonzero()[:, 0].tolist()) for row in firsts[0]] == [set(p) for p in doubled]
    for chunk, cache in ((0, None), (4, None), (1, None), (4, prompt_cache(model))):
        assert generate(model, doubled, keys, sampling, chunk, cache).completion_ids() == shared, (chunk, cache)
    assert generate(model, doubled, keys, settings(folders)).completion_ids() != shared  # the flags sample otherwise
    greedy = generate(model, doubled, None, settings(folders)).completion_ids()
    assert generate(model, doubled, keys, replace(settings(folders), top_k=1)).completion_ids() == greedy


def test_a_completion_ends_at_its_first_stop_and_the_rest_is_padding():
    width, stop, pad = 2, 9, 0
    out = torch.tensor([[5, 6, 1, 9, 4, 9], [0, 6, 1, 2, 3, 4]])  # row 0 stops at its 2nd token; row 1 never
    done = read_back(out, torch.tensor([[1, 1], [0, 1]]), width, Sampling(4, (stop,), pad))
    assert done.completion.tolist() == [[True, True, False, False], [True, True, True, True]]
    assert done.truncated.tolist() == [False, True] and done.completion_ids() == [[1, 9], [1, 2, 3, 4]]
    assert done.ids[0].tolist() == [5, 6, 1, 9, pad, pad]  # what followed the stop is padding
    assert done.mask.tolist() == [[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]]
    assert done.positions[1].tolist() == [0, 0, 1, 2, 3, 4]  # the left padding takes no position


def test_training_reads_the_log_probabilities_generate_sampled_from(folders, model):
    """Greedy completions of left-padded prompts: each token's log-probability in the training forward (positions
    from the mask, as generate counts them) equals generate's own scores for it."""
    prompts, s = prompts_of(folders, 3), settings(folders)
    ids, mask = left_padded(prompts, s.pad)
    with torch.no_grad():
        extra = {"eos_token_id": list(s.stops), "pad_token_id": s.pad, "use_cache": True}
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, return_dict_in_generate=True,
            output_logits=True, **extra,
        )  # fmt: skip
        done = read_back(out.sequences, mask, ids.shape[1], s)
        ours = completion_logps(bare(model), done, 1.0)
    theirs = torch.stack(out.logits, 1).float().log_softmax(-1)
    picked = theirs.gather(-1, done.ids[:, ids.shape[1] :][:, : theirs.shape[1], None]).squeeze(-1)
    keep = done.completion[:, : theirs.shape[1]]
    assert torch.allclose(ours[:, : theirs.shape[1]][keep], picked[keep], atol=1e-4)


# --------------------------------------------------------------------------- advantages and the loss


def test_advantages_are_within_each_group_and_a_flat_group_gets_none():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5], dtype=torch.float64)
    group = objective.advantages(rewards, 4, "group", None)
    assert group[:4].tolist() == pytest.approx([0.866, -0.866, 0.866, -0.866], abs=1e-3)  # (r - 0.5) / std 0.577
    assert group[4:].tolist() == [0.0] * 4  # all equal: no signal
    assert objective.advantages(rewards, 4, "none", None)[:2].tolist() == [0.5, -0.5]
    assert objective.advantages(rewards, 4, "batch", torch.tensor(0.25))[0].item() == pytest.approx(0.5 / 0.2501)


def test_rloo_advantages_are_the_reward_less_the_mean_of_the_groups_other_rewards():
    """TRL RLOOTrainer's leave-one-out advantage, by hand: r_i - (sum - r_i) / (k - 1) over the k scorable ones."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, NAN, 0.0, 1.0, NAN, NAN, 2.0, NAN], dtype=torch.float64)
    rloo = objective.advantages(rewards, 4, "none", None, "rloo")
    assert rloo[:4].tolist() == pytest.approx([1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3])  # +-2/3
    assert rloo[4:8].tolist() == pytest.approx([1 - 1 / 2, 0.0, 0 - 2 / 2, 1 - 1 / 2])  # the None left out: k = 3
    assert rloo[8:].tolist() == [0.0] * 4  # one scorable: no other reward to take the baseline from
    grpo = objective.advantages(rewards, 4, "none", None)
    assert rloo[:4].tolist() == pytest.approx((grpo[:4] * 4 / 3).tolist())  # G / (G - 1) x grpo's
    pairs = torch.tensor([3.0, 1.0, 0.5, NAN], dtype=torch.float64)
    assert objective.advantages(pairs, 2, "none", None, "rloo").tolist() == [2.0, -2.0, 0.0, 0.0]  # G = 2
    same = lambda values: values  # noqa: E731 - one process: gathering is the values themselves
    normal = objective.advantages(rewards, 4, "none", None, "rloo", normalise=same)
    seen = [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.5, -1.0, 0.5]  # the advantages that are not NaN (mean 0)
    assert normal[:4].tolist() == pytest.approx([a / (statistics.stdev(seen) + 1e-4) for a in seen[:4]], abs=1e-6)
    scaled = objective.advantages(rewards, 4, "group", None, "rloo")
    assert scaled[0].item() == pytest.approx((2 / 3) / (statistics.stdev([1.0, 0.0, 0.0, 1.0]) + 1e-4), abs=1e-6)


def test_the_sum_ratio_is_the_completions_and_rloos_kl_is_no_term_of_the_loss():
    logps = torch.log(torch.tensor([[1.5, 0.5, 1.0, 1.0]]))
    old, keep = torch.zeros(1, 4), torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    s = {"importance": "sequence_sum", "epsilon": 0.2, "epsilon_high": 0.0, "kl_beta": 0.0, "kl_bias_correction": True}
    losses, stats = objective.token_losses(logps, old, None, torch.tensor([-1.0]), keep, s)
    assert losses.tolist()[0] == pytest.approx([0.8] * 4)  # ratio 1.5 x 0.5 x 1 = 0.75, clipped to 0.8 (A < 0)
    assert stats["clipped_low"].item() == 3  # the counted tokens
    ref = torch.log(torch.tensor([[1.0, 1.0, 2.0, 5.0]]))
    rloo = {**s, "kl_beta": 0.1, "advantage": "rloo"}
    with_kl, stats = objective.token_losses(logps, old, ref, torch.tensor([-1.0]), keep, rloo)
    assert torch.equal(with_kl, losses) and stats["kl"].item() == pytest.approx(-math.log(2))  # sum of old - ref
    grpo, _ = objective.token_losses(logps, old, ref, torch.tensor([-1.0]), keep, {**rloo, "advantage": "grpo"})
    assert not torch.allclose(grpo, losses)  # grpo's KL: a term of the loss


def test_rloo_settles_trls_rloo_defaults_for_the_options_not_given(folders):
    base = {"task": "grpo", "model": f"hf:{folders['model']}", "reward": ["answer"], "max_length": 64}
    cfg, notes = GroupRelative.settle(TrainConfig(**base, advantage="rloo", kl_beta=0.0, grpo_loss="dapo"))
    o = cfg.section("grpo")
    assert (o.importance, o.scale_rewards, o.grpo_loss, o.kl_beta) == ("sequence_sum", "none", "dapo", 0.0)
    assert notes == ("--advantage rloo: --importance sequence_sum, --scale-rewards none (TRL's RLOOTrainer defaults)",)
    assert GroupRelative.settle(TrainConfig(**base, advantage="rloo"))[0].section("grpo").kl_beta == 0.05
    plain = TrainConfig(**base)
    assert GroupRelative.settle(plain) == (plain, ())  # grpo's defaults stay TRL GRPOTrainer's
    refused = TrainConfig(**base, advantage="rloo", kl_bias_correction=False)
    with pytest.raises(ConfigError, match="^--no-kl-bias-correction: with --advantage rloo the KL is in the reward"):
        GroupRelative.check_settled(GroupRelative.settle(refused)[0], "")


def test_the_three_normalisations_count_what_they_say():
    keep = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert objective.step_count(keep, "dapo", 4).item() == 4  # tokens
    assert objective.step_count(keep, "grpo", 4).item() == 2  # completions
    assert objective.step_count(keep, "dr_grpo", 4).item() == 8  # completions x max new tokens
    losses = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]])
    assert objective.summed(losses, keep, "dapo").item() == 10  # every counted token
    assert objective.summed(losses, keep, "grpo").item() == 6  # 2 + 4: each completion's mean
    truncated = objective.counted(torch.ones(2, 4, dtype=torch.bool), torch.tensor([True, False]), True)
    assert truncated.tolist() == [[0.0] * 4, [1.0] * 4]  # --mask-truncated


def test_the_ratio_is_clipped_where_it_helps_and_the_kl_is_zero_at_the_reference():
    logps = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
    old, advantage, keep = torch.zeros(1, 3), torch.tensor([1.0]), torch.ones(1, 3)
    s = {"importance": "token", "epsilon": 0.2, "epsilon_high": 0.0, "kl_beta": 0.1, "kl_bias_correction": True}
    losses, stats = objective.token_losses(logps, old, logps, advantage, keep, s)
    assert losses.tolist()[0] == pytest.approx([-1.2, -0.5, -1.0])  # 1.5 clipped to 1.2; 0.5 not (min wins)
    assert stats["clipped_high"].item() == 1 and stats["clipped_low"].item() == 0 and stats["kl"].item() == 0
    gspo, _ = objective.token_losses(logps, old, None, advantage, keep, {**s, "importance": "sequence", "kl_beta": 0})
    ratio = torch.exp(torch.log(torch.tensor([1.5, 0.5, 1.0])).mean())  # one ratio for the whole completion
    assert gspo.tolist()[0] == pytest.approx([-ratio.item()] * 3)


# --------------------------------------------------------------------------- rewards and bad input


def test_reward_functions_get_the_datasets_columns_and_none_leaves_a_value_out(folders):
    rewards = load_rewards([f"{folders['rewards']}:checks_columns", "length:2"], [1.0, 0.5])
    chat = [{"role": "user", "content": "1 + 1 ="}]
    args = {
        "prompts": [chat] * 3, "completions": [[{"role": "assistant", "content": "2"}]] * 3,
        "completion_ids": [[5], [5, 6, 7], [5, 6]], "answer": ["2"] * 3, "topic": ["sum", "skip", "sum"],
    }  # fmt: skip
    table = scores(rewards, args, lambda k: f"row {k}")
    assert table[:, 0].tolist()[0] == 1.0 and torch.isnan(table[1, 0]) and table[2, 0].item() == 2.0
    assert table[:, 1].tolist() == [0.0, -0.5, 0.0]  # 0 up to 2 tokens, minus the share of 2 past them
    assert total(table, rewards).tolist() == [1.0, -0.25, 2.0]  # the None left out of row 1's sum


def test_the_bundled_questions_are_prompts_with_answers_the_answer_reward_checks():
    from anytrain.data.instructions import load_questions
    from anytrain.tasks.causal_lm.prompt_rows import is_prompts
    from anytrain.tasks.grpo.rewards import answer_reward

    ds = load_questions()
    assert is_prompts(ds.column_names) and len(ds) == 4000 and ds[0]["prompt"][-1]["role"] == "user"
    said = [[{"role": "assistant", "content": text}] for text in ("45", " 45\n", "4 5", "45.")]
    assert answer_reward(None, said, None, answer=["45"] * 4) == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "name, said",
    [
        ("raises_on_long", "--reward raises_on_long: raised ValueError: too long (on completion 1 of train row 7)"),
        ("too_few", "--reward too_few: returned 1 values for 3 completions (one each)"),
        ("nan", "--reward nan: returned nan for completion 0 of train row 7 (a number or None)"),
    ],
)
def test_a_reward_function_that_misbehaves_is_named_with_the_row(folders, name, said):
    rewards = [Reward(name, load_rewards([f"{folders['rewards']}:{name}"], [])[0].fn, 1.0)]
    args = {"prompts": ["p"] * 3, "completions": ["a", "bbbb", "c"], "completion_ids": [[1], [1, 2, 3, 4], [2]]}
    with pytest.raises(ConfigError) as err:
        scores(rewards, args, lambda k: f"completion {k} of train row 7")
    assert str(err.value) == said


def test_bad_input_is_one_line_each(folders, capsys, tmp_path):
    base = ["--model", f"hf:{folders['model']}", "--dataset", str(folders["data"]), "--output-dir", str(tmp_path / "r")]
    cases = [
        ([*base, "--task", "grpo"], "--reward: --task grpo needs at least one reward function"),
        ([*base, "--reward", str(tmp_path / "gone.py:f")], f"--reward {tmp_path / 'gone.py:f'}: file not found"),
        ([*base, "--reward", "answer", "--num-generations", "1"], "--num-generations must be in [2, inf), got 1"),
        ([*base, "--reward", "answer", "format:("], "--reward format:(: not a regular expression"),
        ([*base, "--reward", "answer", "--top-k", "-1"], "--top-k must not be negative, got -1"),
        ([*base, "--reward", "answer", "--min-p", "1.5"], "--min-p must be in [0, 1], got 1.5"),
        ([*base, "--reward", "answer", "--repetition-penalty", "0"], "--repetition-penalty must be positive, got 0.0"),
        (
            [*base, "--reward", "answer", "--reward-weights", "1", "2"],
            "--reward-weights: 2 weights for 1 reward functions",
        ),
    ]
    for argv, said in cases:
        assert said in run_cli_error(capsys, argv), argv
    no_prompt = tmp_path / "qa.jsonl"
    no_prompt.write_text(json.dumps({"question": "1 + 1", "answer": "2"}) + "\n")
    err = run_cli_error(capsys, [*base[:2], "--dataset", str(no_prompt), "--task", "grpo", "--reward", "answer",
                                 "--output-dir", str(tmp_path / "r")])  # fmt: skip
    assert "has no 'prompt' column (columns: question, answer)" in err
    bert = tiny_bert_mlm(tmp_path / "bert")  # an encoder: its attention sees the tokens it would predict
    err = run_cli_error(capsys, ["--model", f"hf:{bert}", *base[2:], "--task", "grpo", "--reward", "answer"])
    assert "BertForMaskedLM is not a causal LM (is_decoder=False: bidirectional attention" in err
    plain = tiny_llama(tmp_path / "plain", chat=False)
    err = run_cli_error(capsys, ["--model", f"hf:{plain}", *base[2:], "--reward", "answer"])
    assert "its tokenizer has no chat template, which chat prompts (lists of messages) need" in err
    assert not (tmp_path / "r").exists()


# --------------------------------------------------------------------------- it learns; it is exact


@pytest.fixture(scope="module")
def learnt(folders, model, tmp_path_factory):
    """The run's summary, its folder and what it printed."""
    from anytrain.tasks.causal_lm import generation

    run, printed = tmp_path_factory.mktemp("learnt") / "run", io.StringIO()
    real, chunks = generation.generate, []

    def generate(model, prompts, keys, sampling, chunk=0, shared=None):
        chunks.append((len(prompts), chunk, generation.fitting(model, prompts, sampling)))
        return real(model, prompts, keys, sampling, chunk, shared)

    with contextlib.redirect_stdout(printed), pytest.MonkeyPatch.context() as patch:
        patch.setattr("anytrain.tasks.causal_lm.rollout.generate", generate)  # the rollouts' chunks, recorded
        patch.setattr(generation, "free_bytes", lambda device: 2 * 20 * generation.row_bytes(model, 30))
        summary = in_process(run, *args(folders, "--max-steps", "16", "--num-generations", "8", "--lr", "1e-2"))
    assert all(chunk == fits for _, chunk, fits in chunks)  # --generate-batch 0: as many as fit in half the memory
    assert any(0 < chunk < rows for rows, chunk, _ in chunks)  # here fewer than a rollout's 32 (same completions)
    return summary, run, printed.getvalue()


def test_the_reward_rises_and_every_figure_is_said(learnt):
    summary, run, _ = learnt
    train = [m for m in read_metrics(run) if m["kind"] == "train"]
    first, last = sum(m["reward"] for m in train[:4]) / 4, sum(m["reward"] for m in train[-4:]) / 4
    print(f"reward (share of 1s) over the first 4 steps {first:.4f}, the last 4 {last:.4f}")
    assert last > 3 * first and last > 0.004  # a random model writes a 1 about once in 400 tokens
    assert summary["val_greedy_reward"] > summary["train_first"]["reward"]
    for key in ("reward_std", "reward_ones", "flat_groups", "completion_length", "completion_length_max", "truncated",
                "clipped_low", "clipped_high", "generating"):  # fmt: skip
        assert key in train[-1], key
    assert 0 < train[-1]["generating"] < 1 and summary["num_generations"] == 8 and summary["rewards"] == ["ones"]
    parts = [train[-1][f"time_{p}"] for p in ("generate", "tools", "rewards", "logps")]  # where a rollout's time goes
    assert parts[0] > 0 and parts[1] == 0 and sum(parts) <= train[-1]["generating"] + 1e-9


def test_evaluation_says_the_rewards_and_no_loss(learnt):
    """grpo evaluates by generating: its validation and test lines, metrics.jsonl's eval rows and summary.json hold
    the sampled and greedy rewards and no loss (minus the reward was a number that read like a result); the training
    lines keep the objective's value as their loss, and the best weights follow the validation reward (of two alike,
    the first: no loss breaks the tie)."""
    summary, run, printed = learnt
    assert "prompts: each distinct prompt read once per group (checked on the model" in printed  # --share-prompts
    assert "anytrain: tools:" not in printed  # no tools: no limit to say
    metrics = read_metrics(run)
    evals = [m for m in metrics if m["kind"] == "eval"]
    assert [(m["split"], m["step"]) for m in evals] == [("validation", 9), ("validation", 16), ("test", 16)]
    for row in evals:
        assert sorted(row) == ["epoch", "greedy_reward", "kind", "reward", "split", "step"], row
        assert 0 <= row["reward"] <= 1 and 0 <= row["greedy_reward"] <= 1  # the share of 1s
    best = max(evals[:2], key=lambda m: (m["reward"], -m["step"]))
    assert (summary["best_metric"], summary["best_val_reward"]) == ("reward", best["reward"])
    assert summary["final_weights_step"] == best["step"]
    for row, prefix in ((best, "val"), (evals[2], "test")):
        assert [summary[f"{prefix}_{k}"] for k in ("reward", "greedy_reward")] == [row["reward"], row["greedy_reward"]]
    assert not {"val_loss", "test_loss", "best_val_loss"} & summary.keys() and summary["grpo_loss"] == "dapo"
    train = [m for m in metrics if m["kind"] == "train"]
    assert len(train) == 16 and all(isinstance(m["loss"], float) and abs(m["loss"]) < 10 for m in train)
    said = [line for line in printed.splitlines() if "_reward " in line]
    assert [line.split(", val_reward ")[0] for line in said[:2]] == ["epoch 0: step 9", "epoch 1: step 16"]
    assert all(", val_greedy_reward " in line for line in said[:2]) and len(said) == 3
    assert said[2].startswith("anytrain: test_reward ") and ", test_greedy_reward " in said[2]
    assert not [line for line in said if "loss" in line]
    assert "follow the validation reward (higher is better) (the headline metric of grpo)" in printed


def test_accumulation_equals_one_batch_of_the_steps_completions(folders, tmp_path):
    check_accumulated_steps(args(folders), ["--grad-accum-steps", "4"], tmp_path, abs=1e-6)


def test_the_start_up_check_runs_one_rollout_and_step_that_count_for_nothing(folders, tmp_path, monkeypatch):
    """Issue 46: grpo owns its step, so the start-up check runs it (a rollout of the first prompts, then the loss) and
    grpo forgets it (after_check): the run's weights, every logged figure and its completions table equal those of the
    same run without the check; the reward functions were called once more, for it."""
    flags = args(folders, "--max-steps", "2", "--grad-accum-steps", "2", "--kl-beta", "0.1")
    check_start_up_check_forgotten(flags, tmp_path, monkeypatch, "grpo")


@pytest.mark.launch
def test_two_ranks_equal_one_rank_with_twice_the_prompts(folders, tmp_path):
    """Also what a reward function logs with log_metric, in an order that differs between the processes."""
    flags, figures = args(folders, "--reward", f"{folders['rewards']}:logs", "--reward-weights", "1", "0"), (
        "mean_length", "ones_per_completion", "reward", "completion_length")  # fmt: skip
    check_two_ranks_of_half_the_batch(flags, ["--batch-size", "2"], tmp_path, figures, abs=1e-9)
    assert len((tmp_path / "two" / "completions.jsonl").read_text().splitlines()) == 3 * 8  # the main process's


@pytest.mark.launch
def test_a_sigkilled_run_resumes_bit_for_bit_also_inside_a_rollout(folders, tmp_path):
    """Two steps per rollout and a checkpoint every 3: the resume starts inside a rollout, whose completions and
    old log-probabilities come back from the checkpoint (each process's own file); the sampling needs nothing. The
    completions table ends as the reference's."""
    flags = args(folders, "--max-steps", "8", "--checkpoint-every-steps", "3", "--grpo-iterations", "2")
    reference, victim = kill_and_resume(tmp_path, [*flags, "--keep-checkpoints", "9"], 4)
    a, b = read_summary(reference), read_summary(victim)
    assert a["last_weights_sha256"] == b["last_weights_sha256"]
    assert b["resumed_from"].endswith("step-000003")  # after the first of rollout 2's two steps
    assert (Path(b["resumed_from"]) / "task_0.safetensors").is_file()
    table = (reference / "completions.jsonl").read_text()  # the resumed run's rows sampled again replace the killed's
    assert (victim / "completions.jsonl").read_text() == table and len(table.splitlines()) == 4 * 8
