"""The fused loss of a causal LM (src/anytrain/tasks/causal_lm/head.py): the output layer and the
cross-entropy a chunk of tokens at a time, so no batch x length x vocabulary logits exist in training.

Against the model's own loss (transformers' ForCausalLM loss over the full logits), on the tiny GPT-2 (output
layer tied to the embedding) and the tiny Llama (untied), with chunks smaller than a row: the same loss
(float tolerance) and the same gradients of every parameter, also under bf16 autocast and with packed rows'
position ids; evaluation's per-row loss sums, target counts and correct tokens equal those from the logits.
The largest tensor any operation makes in a training step is one chunk's logits, not the batch's (counted
with a dispatch mode: the control, the model's own loss, makes the full logits). Generation (no labels) is
the model's own forward, and a model whose logits are rescaled keeps its own loss, said in one line."""

from __future__ import annotations

import copy

import pytest
import torch
from hfmodels import tiny_gpt2, tiny_llama
from torch.utils._python_dispatch import TorchDispatchMode

from anytrain.tasks.causal_lm import head as lmhead
from anytrain.tasks.hf_lm import HFCausalLM

transformers = pytest.importorskip("transformers")

ROWS, LENGTH, CHUNK = 4, 24, 10  # 4 x 23 next-token positions in chunks of 10 tokens


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def pair(request, tmp_path_factory):
    """The model with its own loss, and a copy with the fused one (chunks of CHUNK tokens)."""
    make = {"gpt2": tiny_gpt2, "llama": tiny_llama}[request.param]
    own = transformers.AutoModelForCausalLM.from_pretrained(make(tmp_path_factory.mktemp(request.param)))
    own.config.use_cache = False
    fused = copy.deepcopy(own)
    fused, why = lmhead.head_of(fused)
    assert why is None
    return own, fused


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(lmhead, "CHUNK_ELEMENTS", 0)
    monkeypatch.setattr(lmhead, "MIN_CHUNK", CHUNK)


def batch(vocabulary: int, seed: int = 0) -> tuple[dict, torch.Tensor]:
    """Rows of random tokens; row 1 padded after 15 tokens, row 0's first 6 tokens a prompt (no targets)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocabulary, (ROWS, LENGTH), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[0, :6] = -100
    return {"input_ids": ids, "attention_mask": mask}, labels


def model_loss_and_grads(model, inputs: dict, labels: torch.Tensor, items: float = 50.0) -> tuple[float, dict]:
    """The loss the model returns given the labels (fused or its own), and every parameter's gradient."""
    model.zero_grad()
    loss = model(**inputs, labels=labels, num_items_in_batch=items).loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


def largest_logits(model, inputs: dict, labels: torch.Tensor) -> int:
    """The most elements of any tensor of scores over the vocabulary (the last dimension; not the output layer's
    transposed weight) that an operation made in one forward and backward."""
    vocabulary, width = model.config.vocab_size, model.config.hidden_size

    class Largest(TorchDispatchMode):
        most = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                scores = isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == vocabulary
                if scores and t.numel() != width * vocabulary:
                    Largest.most = max(Largest.most, t.numel())
            return out

    with Largest():
        model(**inputs, labels=labels, num_items_in_batch=50.0).loss.backward()
    return Largest.most


def test_the_fused_loss_and_gradients_are_the_models_own(pair):
    own, fused = pair
    inputs, labels = batch(own.config.vocab_size)
    own_loss, own_grads = model_loss_and_grads(own, inputs, labels)
    fused_loss, fused_grads = model_loss_and_grads(fused, inputs, labels)
    diff = max((own_grads[n] - fused_grads[n]).abs().max().item() for n in own_grads)
    print(f"loss {own_loss:.7f} vs fused {fused_loss:.7f}; gradients within {diff:.1e}")
    assert fused_loss == pytest.approx(own_loss, rel=1e-6) and diff < 1e-6
    assert all(g.abs().sum() > 0 for n, g in fused_grads.items() if "lm_head" in n or "wte" in n)


def test_under_bf16_autocast_and_with_packed_position_ids_it_is_the_models_own(pair):
    own, fused = pair
    inputs, labels = batch(own.config.vocab_size, seed=1)
    inputs["position_ids"] = torch.arange(LENGTH).remainder(9).expand(ROWS, LENGTH)  # texts of 9 tokens a row
    del inputs["attention_mask"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        own_loss, own_grads = model_loss_and_grads(own, inputs, labels)
        fused_loss, fused_grads = model_loss_and_grads(fused, inputs, labels)
    scale = max(g.abs().max().item() for g in own_grads.values())
    diff = max((own_grads[n] - fused_grads[n]).abs().max().item() for n in own_grads)
    print(f"bf16: loss {own_loss:.5f} vs fused {fused_loss:.5f}; gradients within {diff:.1e} of {scale:.1e}")
    assert fused_loss == pytest.approx(own_loss, rel=2e-2) and diff < 0.05 * scale


def test_evaluation_gets_each_rows_sums_without_the_logits(pair):
    own, fused = pair
    inputs, labels = batch(own.config.vocab_size, seed=2)
    task = HFCausalLM.__new__(HFCausalLM)
    with torch.no_grad():
        expected = task.per_sample(own(**inputs), labels)
        outputs = fused(**inputs, labels=labels)
    assert outputs.logits is None
    got = task.per_sample(outputs, labels)
    assert torch.equal(got["tokens"], expected["tokens"]) and torch.equal(got["hits"], expected["hits"])
    assert torch.allclose(got["token_loss"], expected["token_loss"], rtol=1e-5)
    assert torch.allclose(got["loss"], expected["loss"], rtol=1e-5)


def test_no_tensor_holds_the_batchs_logits(pair):
    own, fused = pair
    inputs, labels = batch(own.config.vocab_size, seed=3)
    vocabulary, logits = own.config.vocab_size, ROWS * LENGTH * own.config.vocab_size
    fused_most, own_most = largest_logits(fused, inputs, labels), largest_logits(own, inputs, labels)
    print(f"largest logits: fused {fused_most:,} elements, own loss {own_most:,}; the batch's {logits:,}")
    assert own_most >= logits  # the control: the model's own loss makes them
    assert fused_most == CHUNK * vocabulary  # one chunk's


def test_generation_is_the_models_own_forward(pair):
    own, fused = pair
    inputs, _ = batch(own.config.vocab_size, seed=4)
    with torch.no_grad():
        assert torch.equal(own(**inputs).logits, fused(**inputs).logits)


def test_a_model_whose_logits_are_rescaled_keeps_its_own_loss(pair):
    own, _ = pair
    model = copy.deepcopy(own)
    model.config.final_logit_softcapping = 30.0
    model, why = lmhead.head_of(model)
    assert why == "its logits are rescaled (final_logit_softcapping)"
    assert lmhead.why_not(own, shards=True) == "FSDP and DeepSpeed shard the output layer"  # a run fact (RunFacts)
    assert lmhead.why_not(own) is None
    ids = torch.randint(0, 400, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # given labels, the model's own forward: its own loss from its full (softcapped) logits
        ours, theirs = model(input_ids=ids, labels=ids), model.wrapped(input_ids=ids, labels=ids)
    assert not isinstance(ours, lmhead.FusedOutput) and torch.equal(ours.loss, theirs.loss)
