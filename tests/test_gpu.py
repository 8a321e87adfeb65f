"""The LLM paths under CUDA (issue 42; skipped without a GPU, run by scripts/gpu_truth.py): the fused LM-head loss
equals the model's own on the GPU, in fp32 and under bf16 autocast, for a tied (GPT-2) and an untied (Llama)
output layer; and a packed batch has the loss and gradients of its texts padded one a row with CUDA's attention
kernels (scaled-dot-product attention picks other kernels on a GPU than on a CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
from hfchecks import loss_and_grads
from hfmodels import tiny_gpt2, tiny_llama
from textdata import texts

from anytrain.tasks.causal_lm import head as lmhead

transformers = pytest.importorskip("transformers")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
pytestmark = [pytest.mark.gpu, needs_cuda]
MAKERS = {"gpt2": tiny_gpt2, "llama": tiny_llama}


def cuda_model(kind: str, folder):
    model = transformers.AutoModelForCausalLM.from_pretrained(MAKERS[kind](folder)).to("cuda").train()
    model.config.use_cache = False  # as anytrain trains causal LMs
    return model


@pytest.mark.parametrize("kind", list(MAKERS))
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_fused_loss_on_cuda_is_the_models_own(kind, precision, tmp_path, monkeypatch):
    monkeypatch.setattr(lmhead, "CHUNK_ELEMENTS", 0)
    monkeypatch.setattr(lmhead, "MIN_CHUNK", 10)  # chunks smaller than a row
    own = cuda_model(kind, tmp_path / kind)
    fused = copy.deepcopy(own)
    fused, why = lmhead.head_of(fused)
    assert why is None
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, own.config.vocab_size, (4, 24), generator=g).cuda()
    labels = ids.clone()
    labels[0, :6] = -100
    results = []
    for model in (own, fused):
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        results.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (own_loss, own_grads), (fused_loss, fused_grads) = results
    scale = max(g.abs().max().item() for g in own_grads.values())
    diff = max((own_grads[n] - fused_grads[n]).abs().max().item() for n in own_grads)
    print(f"{kind} {precision} on cuda: loss {own_loss:.6f} vs fused {fused_loss:.6f}; grads within {diff:.1e}")
    tolerance = {"fp32": (1e-5, 1e-4), "bf16": (2e-2, 0.05)}[precision]  # TF32 matmuls allowed in fp32
    assert fused_loss == pytest.approx(own_loss, rel=tolerance[0]) and diff < tolerance[1] * scale


@pytest.mark.parametrize("kind", list(MAKERS))
def test_a_packed_batch_on_cuda_has_the_loss_and_gradients_of_its_texts_padded(kind, tmp_path):
    from transformers import AutoTokenizer

    from anytrain import packed
    from anytrain.data.packing import PackedRows

    model = cuda_model(kind, tmp_path / kind)
    way = packed.keep_apart(model)  # checked on CUDA's kernels, as anytrain checks it at the start of a run
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / kind)
    ids = [tokenizer(row["text"])["input_ids"][:60] for row in texts(16, seed=3)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    packed_rows = PackedRows(ids, 128, pad)
    packed_rows.mask = way  # the block-diagonal mask in the batch, where the model needs it
    assert len(packed_rows) < len(ids)  # several whole texts a row
    inputs, targets = packed_rows.__getitems__(list(range(len(packed_rows))))
    on_cuda = {k: v.cuda() for k, v in inputs.items()}
    packed_sum, packed_count, packed_grads = loss_and_grads(model, on_cuda, targets.cuda())
    width = max(map(len, ids))
    padded = torch.tensor([row + [pad] * (width - len(row)) for row in ids]).cuda()
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids]).cuda()
    padded_sum, padded_count, padded_grads = loss_and_grads(
        model, {"input_ids": padded, "attention_mask": mask}, padded.masked_fill(mask == 0, -100)
    )
    assert packed_count == padded_count == sum(len(row) - 1 for row in ids)
    scale = max(g.abs().max().item() for g in padded_grads.values())
    diff = max((packed_grads[n] - padded_grads[n]).abs().max().item() for n in padded_grads)
    sums = f"loss sums {packed_sum:.5f} {padded_sum:.5f}"
    print(f"{kind} on cuda (kept apart by {way}), packed vs padded: {sums}, grads within {diff:.1e}")
    assert packed_sum == pytest.approx(padded_sum, rel=1e-4) and diff < 1e-3 * scale
