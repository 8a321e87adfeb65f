"""The causal-LM core (anytrain/tasks/causal_lm/, issue 46) across architectures: per-token log-probabilities at a
temperature through the chunked output layer equal log_softmax(logits / T) of the full logits, and so do their
gradients (a rescaled model takes its own logits); padding holds 0, whatever the model thinks of it; generation
follows its own complete config, whatever the model's generation_config.json says, and stops at every end id the
model's generation config names."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from hfmodels import gpt2_tokenizer
from zoo import tiny_causal_lm

from anytrain.shape import IGNORE
from anytrain.tasks.causal_lm.generation import Sampling, completion_keys, generate, prompt_runs, stop_ids
from anytrain.tasks.causal_lm.head import LogpsRequest, head_of
from anytrain.tasks.causal_lm.logprobs import bare, completion_logps, labels_from, shares_prompts

pytest.importorskip("transformers")

# Llama-like, Qwen2 (biases on q/k/v), GPT-2 (learned positions, tied), a mixture of experts, Gemma 2 (softcapped
# logits: its own forward's logits), Falcon with ALiBi (no position ids)
ARCHITECTURES = ["llama", "qwen2", "gpt2", "mixtral", "gemma2", "falcon"]


def batch(vocabulary: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two left-padded rows (ids, mask, labelled positions): the second row's first 3 tokens are padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocabulary, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    learned = torch.zeros_like(ids, dtype=torch.bool)
    learned[:, 7:] = True  # a completion's positions
    learned[0, 10:] = False  # its padding after the stop
    return ids, mask, learned


def full_logps(model, ids, mask, learned, temperature: float) -> torch.Tensor:
    """The reference: the model's own full logits, / T, log_softmax, the labelled tokens picked (float64)."""
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    logits = type(model).forward(model, input_ids=ids, attention_mask=mask, position_ids=positions).logits
    logps = (logits[:, :-1].double() / temperature).log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(logps * learned[:, 1:], (1, 0))


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_token_log_probabilities_at_a_temperature_are_the_full_logits_and_so_are_their_gradients(name, one_thread):
    model = tiny_causal_lm(name)
    model.config.use_cache = False
    if name == "mixtral":
        model.config.output_router_logits = False  # the log-probabilities alone, no load-balancing term
    model, why = head_of(model)
    fused = why is None
    assert fused == (name != "gemma2")  # gemma 2's logits are softcapped: its own forward's
    reference = copy.deepcopy(model)
    ids, mask, learned = batch(model.config.vocab_size)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    for temperature in (1.0, 0.7):
        model.zero_grad()
        reference.zero_grad()
        inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        ours = model(LogpsRequest(inputs, labels_from(ids, learned), temperature)).logps
        theirs = full_logps(reference, ids, mask, learned, temperature)
        assert ours.shape == ids.shape and ours.dtype == torch.float32
        assert torch.allclose(ours.double(), theirs, atol=2e-5), (ours - theirs).abs().max()
        assert (ours[~learned] == 0).all()  # padding and prompt: exactly 0
        (ours * weights).sum().backward()
        (theirs * weights).sum().backward()
        grads = [(p.grad, q.grad) for p, q in zip(model.parameters(), reference.parameters()) if q.grad is not None]
        assert all(torch.allclose(a, b.float(), atol=2e-5, rtol=1e-3) for a, b in grads), name


def test_padding_holds_zero_even_where_the_model_finds_the_pad_token_impossible(one_thread):
    """A completion's padding gets no log-probability: nothing there for exp() to overflow (grpo's ratio and KL)."""
    from anytrain.tasks.causal_lm.generation import Completions

    model = head_of(tiny_causal_lm("llama"))[0]
    with torch.no_grad():
        model.get_output_embeddings().weight[0] = -1e4  # the pad token (id 0): log-probability about -1e5
    ids, mask, learned = batch(model.config.vocab_size)
    ids[0, 10:] = 0
    done = Completions(
        ids, mask, (mask.cumsum(1) - 1).clamp(min=0), learned[:, 7:], torch.zeros(2, dtype=torch.bool), 7
    )
    logps = completion_logps(bare(model), done, 0.7)
    assert logps.shape == (2, 5) and (logps[0, 3:] == 0).all() and torch.isfinite(logps).all()
    assert (logps[0, :3] < 0).all()


# --------------------------------------------------------------------------- generation


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The same weights saved twice: plainly, and with a generation_config.json that would change every sample."""
    root = tmp_path_factory.mktemp("causal")
    tokenizer = gpt2_tokenizer()
    model = tiny_causal_lm("qwen2", vocab_size=len(tokenizer))
    plain, loaded = root / "plain", root / "loaded"
    for folder in (plain, loaded):
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    own = {
        "do_sample": True,
        "top_k": 2,
        "repetition_penalty": 3.0,
        "no_repeat_ngram_size": 1,
        "eos_token_id": [0, 7, 9],
    }
    (loaded / "generation_config.json").write_text(json.dumps(own))  # as Qwen's and Llama's ship one
    return {"plain": plain, "loaded": loaded, "tokenizer": tokenizer}


def test_the_models_generation_config_changes_nothing_that_is_sampled(folders, one_thread):
    from transformers import AutoModelForCausalLM

    plain, loaded = (AutoModelForCausalLM.from_pretrained(folders[k]) for k in ("plain", "loaded"))
    assert loaded.generation_config.repetition_penalty == 3.0  # transformers loaded it
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13], [14]] * 2
    sampling = Sampling(12, (399,), 0, temperature=1.3)  # a stop no completion reaches: every token counts
    keys = completion_keys(0, 0, 0, torch.arange(4), 2)
    for k in (keys, None):  # sampled and greedy
        ours = generate(loaded, prompts, k, sampling).completion_ids()
        assert ours == generate(plain, prompts, k, sampling).completion_ids()
        assert any(len(set(c)) < len(c) for c in ours)  # a token repeated: no_repeat_ngram_size 1 was not applied
    assert loaded.generation_config.repetition_penalty == 3.0  # and the model keeps its own config


def test_completions_stop_at_the_end_ids_of_the_models_generation_config(folders):
    from transformers import AutoConfig

    from anytrain.config import TrainConfig
    from anytrain.tasks.causal_lm.generation import model_eos

    tokenizer = folders["tokenizer"]
    for key, expected in (("loaded", [0, 7, 9]), ("plain", [0])):
        cfg = TrainConfig().replace(model=f"hf:{folders[key]}")
        eos = model_eos(cfg, AutoConfig.from_pretrained(folders[key]))
        assert stop_ids(tokenizer, eos, chats=False) == expected


def test_labels_from_marks_only_the_learned_positions():
    ids = torch.tensor([[4, 5, 6]])
    assert labels_from(ids, torch.tensor([[False, True, True]])).tolist() == [[IGNORE, 5, 6]]


def test_a_text_prompt_longer_than_the_model_takes_is_refused_not_cut(tmp_path, capsys):
    from conftest import run_cli_error
    from hfmodels import tiny_llama

    model = tiny_llama(tmp_path / "llama")  # 128 positions
    capsys.readouterr()
    rows = [{"prompt": "a b c d", "answer": "1"}] * 19 + [{"prompt": " ".join(["word"] * 200), "answer": "2"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    flags = ["--model", f"hf:{model}", "--dataset", str(tmp_path / "p.jsonl"), "--reward", "answer",
             "--max-new-tokens", "16", "--output-dir", str(tmp_path / "run")]  # fmt: skip
    said = run_cli_error(capsys, flags)
    assert "has a prompt of" in said and "more than the 112 a prompt may have (the model's 128 positions less " in said
    assert "prompts are never cut" in said and not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- a group's prompt read once


def grouped_rows(vocabulary: int):
    """Six completions of three prompts (7, 7 and 4 tokens, padded on the left to 7), in runs of 3, 1 and 2 as
    grpo's groups come (a micro-batch may split one); completions of up to 5 tokens, two stopping early."""
    from anytrain.tasks.causal_lm.generation import Completions

    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(1, vocabulary, (3, 7), generator=g).repeat_interleave(torch.tensor([3, 1, 2]), 0)
    mask = torch.ones(6, 12, dtype=torch.long)
    mask[4:, :3] = 0  # the third prompt: 4 tokens
    completion = torch.ones(6, 5, dtype=torch.bool)
    completion[1, 2:], completion[5, 4:] = False, False
    mask[:, 7:] = completion.long()
    ids = torch.cat([prompts, torch.randint(1, vocabulary, (6, 5), generator=g)], 1).masked_fill(mask == 0, 0)
    return Completions(ids, mask, (mask.cumsum(1) - 1).clamp(min=0), completion, torch.zeros(6, dtype=torch.bool), 7)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_a_prompt_read_once_for_its_group_gives_the_same_log_probabilities_and_gradients(name, one_thread):
    """grpo's --share-prompts: each distinct prompt's key-value cache computed once and repeated to its completions
    gives each completion token the log-probability, and each weight the gradient, of every row read whole; the
    model reads 3 prompts, not 6 (the tokens of its calls counted); the check on the model says it may."""
    model = tiny_causal_lm(name)
    if name == "mixtral":
        model.config.output_router_logits = False  # the log-probabilities alone, no load-balancing term
    model = head_of(model)[0]
    reads: list[int] = []

    def call(given):
        reads.append((given.inputs if isinstance(given, LogpsRequest) else given)["input_ids"].numel())
        return bare(model)(given)

    shared, why = shares_prompts(call, model)
    assert shared is not None and "each distinct prompt read once" in why, why
    rows = grouped_rows(model.config.vocab_size)
    firsts, run = prompt_runs(rows.ids[:, :7], rows.mask[:, :7])
    assert firsts.tolist() == [0, 3, 4] and run.tolist() == [0, 0, 0, 1, 2, 2]
    weights = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    for temperature in (1.0, 0.7):
        got = []
        for how in (None, shared):
            model.zero_grad()
            reads.clear()
            logps = completion_logps(call, rows, temperature, how)
            (logps * weights).sum().backward()
            got.append((logps.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None], sum(reads)))
        (plain, plain_grads, plain_reads), (once, once_grads, once_reads) = got
        assert torch.allclose(once, plain, atol=2e-5), (once - plain).abs().max()
        assert (once[~rows.completion] == 0).all() and len(once_grads) == len(plain_grads)
        assert all(torch.allclose(a, b, atol=2e-5, rtol=1e-3) for a, b in zip(once_grads, plain_grads)), name
        assert plain_reads == 6 * 12 and once_reads == 3 * 6 + 6 * 6  # 3 prompts but their last tokens, then the rest


def test_a_model_that_cannot_read_a_prompt_once_is_said_so(one_thread):
    """Mamba keeps a state, not a key-value cache to repeat; gradient checkpointing would recompute the blocks with
    the cache: both read every row whole, and the check says why."""
    mamba = head_of(tiny_causal_lm("mamba"))[0]
    shared, why = shares_prompts(bare(mamba), mamba)
    assert shared is None and why.startswith("its forward with a key-value cache failed: AttributeError"), why
    llama = tiny_causal_lm("llama")
    llama.gradient_checkpointing_enable()
    llama = head_of(llama)[0]
    shared, why = shares_prompts(bare(llama), llama)
    assert shared is None and why == "gradient checkpointing recomputes the blocks, and a key-value cache with them"
    alone = grouped_rows(400).rows(torch.tensor([0, 3, 4]))
    assert prompt_runs(alone.ids[:, :7], alone.mask[:, :7]) is None  # no prompt shared: nothing to do


def test_a_prompt_padded_on_the_left_generates_what_it_generates_alone(one_thread):
    """generate is given each token's position from the mask: the fused output layer's forward hides the model's
    signature from transformers, which then counted positions from the padding, so a model whose positions are not
    relative (XGLM's sinusoids; the zoo's others take them from the mask or are relative) read a padded prompt at
    other positions than its log-probabilities were taken at, and wrote other tokens."""
    model = head_of(tiny_causal_lm("xglm"))[0]
    sampling = Sampling(max_new_tokens=5, stops=(0,), pad=0)
    short, long = [5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]
    together = generate(model, [long, short], None, sampling)
    alone = generate(model, [short], None, sampling)
    assert together.ids[1, together.width :].tolist() == alone.ids[0, alone.width :].tolist()


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_generation_reads_a_groups_prompt_once_and_writes_the_same_tokens(name, one_thread):
    """generate with `shared`: each distinct prompt but its last token read once, its cache repeated to its rows,
    then transformers' generate goes on from it: the same sampled tokens (keyed noise), the prompts' tokens read
    once (the first call's tokens counted)."""
    model = head_of(tiny_causal_lm(name))[0]
    shared, why = shares_prompts(bare(model), model)
    assert shared is not None, why
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(1, 400, (n,), generator=g).tolist() for n in (9, 5)]
    prompts = [prompts[0]] * 3 + [prompts[1]] * 2
    keys = completion_keys(7, 0, 0, torch.tensor([0, 1]), 3)[:5]
    sampling = Sampling(max_new_tokens=6, stops=(0,), pad=0, temperature=0.9)
    reads: list[int] = []
    count = lambda m, a, k: reads.append(k["input_ids"].numel())  # noqa: E731 - generate calls the model itself
    hook = model.wrapped.register_forward_pre_hook(count, with_kwargs=True)
    plain = generate(model, prompts, keys, sampling)
    first_plain = reads[0]
    reads.clear()
    once = generate(model, prompts, keys, sampling, shared=shared)
    hook.remove()
    assert torch.equal(plain.ids, once.ids) and torch.equal(plain.mask, once.mask)
    assert first_plain == 5 * 9 and reads[:2] == [2 * 8, 5]  # the prompts but their last tokens once, then 1 a row


def test_the_check_takes_bf16s_rounding_and_refuses_a_leak(one_thread, monkeypatch):
    """shares_prompts' tolerance (1e-3 of the scale) between bf16's rounding (this model under autocast: 3e-4, which
    a tolerance of 1e-4 refused) and a leak: a shared pass that lets the completions attend to the prompts' padding
    changes the log-probabilities by 3.5e-2 of their scale, and the check refuses it."""
    from anytrain.tasks.causal_lm import logprobs
    from anytrain.tasks.causal_lm.generation import Completions

    model = head_of(tiny_causal_lm("llama", seed=2))[0]
    own = model.forward

    def autocast(*args, **kwargs):  # as accelerate runs a bf16 model's forward
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return own(*args, **kwargs)

    model.forward = autocast
    shared, why = shares_prompts(bare(model), model)
    assert shared is not None, why
    real = logprobs.shared_logps

    def leaky(call, rows, *rest):
        seen = Completions(rows.ids, torch.ones_like(rows.mask), rows.positions, rows.completion, rows.truncated,
                           rows.width)  # fmt: skip
        return real(call, seen, *rest)

    monkeypatch.setattr(logprobs, "shared_logps", leaky)
    shared, why = shares_prompts(bare(model), model)
    assert shared is None and why.startswith("its log-probabilities change by") and "(tolerance 0.001)" in why, why
