"""The character-level GPT: shapes, causality, weight tying, initialisation, counts, learning, sampling."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from anytrain.config import ModelConfig
from anytrain.gpt import GPT, build_gpt, generate
from anytrain.shape import DataShape

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread is as fast and steadier


TINY = {"vocab_size": 11, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 16}


def tiny_gpt(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(**{**TINY, **overrides})


def random_ids(batch: int, time: int, vocab: int = TINY["vocab_size"], seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, time), generator=torch.Generator().manual_seed(seed))


def test_logits_shape_and_dtype():
    model = tiny_gpt()
    logits = model(random_ids(3, 5))
    assert logits.shape == (3, 5, TINY["vocab_size"])
    assert logits.dtype == torch.float32
    assert model(random_ids(2, TINY["block_size"])).shape == (2, TINY["block_size"], TINY["vocab_size"])


def test_sequence_longer_than_block_size_is_rejected():
    with pytest.raises(ValueError, match="block_size"):
        tiny_gpt()(random_ids(1, TINY["block_size"] + 1))


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"n_embd": 10, "n_head": 3}, ("n_embd", "n_head")),
        ({"n_layer": 0}, ("n_layer",)),
        ({"vocab_size": -1}, ("vocab_size",)),
    ],
)
def test_bad_sizes_are_rejected(overrides, names):
    with pytest.raises(ValueError) as err:
        GPT(**{**TINY, **overrides})
    assert all(name in str(err.value) for name in names)


def test_causal_attention_ignores_later_tokens():
    model = tiny_gpt().eval()
    idx = random_ids(2, TINY["block_size"])
    t = 5
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % TINY["vocab_size"]
    before, after = model(idx), model(changed)
    torch.testing.assert_close(after[:, :t], before[:, :t], rtol=0, atol=1e-6)
    assert not torch.allclose(after[:, t], before[:, t], atol=1e-4)


def test_output_layer_is_tied_to_the_token_embedding(tmp_path):
    model = tiny_gpt()
    vocab_shaped = [name for name, p in model.named_parameters() if p.shape == (TINY["vocab_size"], TINY["n_embd"])]
    assert vocab_shaped == ["tok_emb.weight"]  # one parameter; no separate output weight
    assert not any(isinstance(m, torch.nn.Linear) and m.out_features == TINY["vocab_size"] for m in model.modules())
    # The output layer really uses the embedding: changing it changes the logits of an unchanged hidden state.
    idx = random_ids(1, 4)
    before = model(idx)
    with torch.no_grad():
        model.tok_emb.weight[3] += 1.0
    assert not torch.allclose(model(idx)[..., 3], before[..., 3])

    path = tmp_path / "model.safetensors"
    save_file(model.state_dict(), str(path))  # refuses state dicts where two names share one tensor
    fresh = tiny_gpt(seed=123)
    assert not torch.equal(fresh(idx), model(idx))
    fresh.load_state_dict(load_file(str(path)))
    assert torch.equal(fresh(idx), model(idx))


def test_gpt2_style_initialisation():
    n_layer = 2
    model = tiny_gpt(vocab_size=100, block_size=64, n_layer=n_layer, n_head=4, n_embd=64)
    residual = {f"blocks.{i}.{part}.proj.weight" for i in range(n_layer) for part in ("attn", "mlp")}
    checked = 0
    for name, p in model.named_parameters():
        if p.dim() == 1:  # LayerNorm weights (there are no biases)
            assert name.endswith(("ln1.weight", "ln2.weight", "ln_f.weight"))
            assert torch.equal(p, torch.ones_like(p))
            continue
        expected = 0.02 / math.sqrt(2 * n_layer) if name in residual else 0.02
        # The sample std of n normal draws has relative standard error ~1/sqrt(2n): allow 6 of them (n >= 4096 here).
        tolerance = 6 / math.sqrt(2 * p.numel())
        assert abs(p.std().item() / expected - 1) < tolerance, (name, p.std().item(), expected)
        assert abs(p.mean().item()) < 6 * expected / math.sqrt(p.numel()), name
        checked += 1
    assert checked == 2 + 4 * n_layer  # two embeddings; qkv, attn proj, fc, mlp proj per block
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())


def test_parameter_count_and_flops_by_hand():
    model = tiny_gpt(vocab_size=10, block_size=8, n_layer=2, n_head=2, n_embd=8)
    # Per block: ln1 8 + qkv 8*24 + attn proj 8*8 + ln2 8 + fc 8*32 + mlp proj 32*8
    #   = 8 + 192 + 64 + 8 + 256 + 256 = 784.
    # Token embedding 10*8 = 80 (also the output layer), final LayerNorm 8, position embedding 8*8 = 64.
    without_pos = 80 + 2 * 784 + 8
    assert model.num_parameters() == without_pos == 1656
    assert model.num_parameters(exclude_position_embedding=False) == without_pos + 64
    assert model.flops_per_token() == 6 * 1656 + 12 * 2 * 8 * 8 == 11472


def test_build_gpt_reads_the_model_section_and_the_shape():
    model = build_gpt(
        ModelConfig(n_layer=3, n_head=4, n_embd=24, dropout=0.1), DataShape("text", vocab_size=7, block_size=12)
    )
    assert (model.block_size, len(model.blocks), model.blocks[0].attn.n_head, model.tok_emb.weight.shape) == (
        12,
        3,
        4,
        (7, 24),
    )
    assert model.drop.p == 0.1


def test_tiny_gpt_learns_a_repeated_string():
    text = "the quick brown fox jumps over the lazy dog. " * 8
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    block = 16
    torch.manual_seed(0)
    model = GPT(len(chars), block_size=block, n_layer=2, n_head=2, n_embd=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(80):
        starts = torch.randint(0, len(data) - block - 1, (16,), generator=g).tolist()
        x = torch.stack([data[s : s + block] for s in starts])
        y = torch.stack([data[s + 1 : s + block + 1] for s in starts])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        x = torch.stack([data[s : s + block] for s in range(len(data) - block)])
        y = torch.stack([data[s + 1 : s + block + 1] for s in range(len(data) - block)])
        final = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    # Uniform guessing is ln(27) = 3.3; 80 steps reach about 0.07. Only the first characters of a window are ambiguous.
    assert final < 0.4, final


def test_generate_keeps_the_prompt_and_is_reproducible():
    model = tiny_gpt()
    prompt = random_ids(1, 3)
    out = generate(model, prompt, max_new_tokens=6, generator=torch.Generator().manual_seed(7))
    assert out.shape == (1, 9) and out.dtype == torch.long
    assert torch.equal(out[:, :3], prompt)
    assert ((out >= 0) & (out < TINY["vocab_size"])).all()
    again = generate(model, prompt, max_new_tokens=6, generator=torch.Generator().manual_seed(7))
    assert torch.equal(out, again)
    assert torch.equal(generate(model, prompt, max_new_tokens=0), prompt)


def test_top_k_1_is_greedy_and_long_prompts_are_cropped():
    model = tiny_gpt()
    block = TINY["block_size"]
    prompt = random_ids(1, block + 5)  # longer than the model's context
    out = generate(model, prompt, max_new_tokens=2 * block, temperature=0.7, top_k=1)
    assert out.shape == (1, 3 * block + 5)
    expected = prompt
    with torch.no_grad():
        for _ in range(2 * block):
            next_token = model(expected[:, -block:])[:, -1].argmax(dim=-1, keepdim=True)
            expected = torch.cat([expected, next_token], dim=1)
    assert torch.equal(out, expected)
    # top_k larger than the vocabulary is clamped rather than an error.
    assert generate(model, prompt, max_new_tokens=2, top_k=10_000).shape == (1, block + 7)


def test_generate_runs_in_eval_mode_and_restores_the_mode():
    model = tiny_gpt(dropout=0.5).train()
    prompt = random_ids(1, 4)
    first = generate(model, prompt, max_new_tokens=8, generator=torch.Generator().manual_seed(3))
    assert model.training
    # Dropout would draw from the global RNG and make the two samples differ.
    second = generate(model, prompt, max_new_tokens=8, generator=torch.Generator().manual_seed(3))
    assert torch.equal(first, second)
    model.eval()
    generate(model, prompt, max_new_tokens=1)
    assert not model.training


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_generate_rejects_non_positive_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        generate(tiny_gpt(), random_ids(1, 2), max_new_tokens=1, temperature=temperature)


def test_dropout_is_active_only_in_train_mode():
    model = tiny_gpt(dropout=0.3)
    idx = random_ids(2, 6)
    model.train()
    assert not torch.equal(model(idx), model(idx))
    model.eval()
    assert torch.equal(model(idx), model(idx))
