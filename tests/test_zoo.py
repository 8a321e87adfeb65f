"""The language-model surfaces across architectures (tests/zoo.py: tiny random models of 32 transformers
families): packing is exact or refused, the fused loss is the model's own (a mixture of experts' router
load-balancing loss included), and gradient checkpointing on an architecture that cannot is one line.

Packing: before the first step anytrain checks on the model itself that two texts packed into one row give each
text's logits alone (anytrain/packed.py). Most architectures keep the texts apart by their position ids; OPT,
BioGPT and XGLM take positions from them but attend across the row, and MPT ignores them (ALiBi): these get a
block-diagonal attention mask. BLOOM (ALiBi, no 4D masks) and Mamba (a state carried from text to text) are
refused. Wherever it trains, a packed batch has the loss and gradients of the same texts padded one a row."""

from __future__ import annotations

import pytest
import torch
from conftest import run_cli_error
from hfchecks import in_process
from hfmodels import gpt2_tokenizer
from textdata import texts, write_jsonl
from zoo import ARCHITECTURES, MOE, save_tiny, tiny_causal_lm

from anytrain import packed
from anytrain.config import ConfigError
from anytrain.data.packing import PackedRows
from anytrain.shape import IGNORE
from anytrain.tasks.causal_lm import head as lmhead

pytest.importorskip("transformers")

MASKED = {"opt", "mpt", "biogpt", "xglm"}  # kept apart by the block-diagonal mask
REFUSED = {"bloom", "mamba"}


def prepared(name: str, **overrides):
    """The zoo's model as anytrain trains a causal LM: no key-value cache, the fused loss where it applies."""
    model = tiny_causal_lm(name)
    model.config.use_cache = False
    for key, value in overrides.items():
        setattr(model.config, key, value)
    return lmhead.head_of(model)[0]


def loss_sum_and_grads(model, inputs: dict, targets: torch.Tensor, count: int) -> tuple[float, dict]:
    """The model's training loss (the sum over the targets divided by `count`, as the loop's token weighting
    gives it), times count, and its gradients."""
    model.zero_grad()
    loss = model(**inputs, labels=targets, num_items_in_batch=count).loss
    loss.backward()
    return loss.item() * count, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_packing_is_exact_or_refused(name, one_thread):
    # a mixture of experts' load-balancing term is a statistic of the batch's tokens (a packed row's padding
    # counts): off here, so the comparison is of the language-model loss alone
    model = prepared(name, **({"output_router_logits": False} if name in MOE else {}))
    if name in REFUSED:
        with pytest.raises(ConfigError, match=r"--packing: \w+ \(\w+\) does not keep packed texts apart"):
            packed.keep_apart(model)
        return
    way = packed.keep_apart(model)
    assert way.split()[-1] == ("mask" if name in MASKED else "positions")
    model.train()
    generator = torch.Generator().manual_seed(1)
    ids = [torch.randint(1, 400, (int(n),), generator=generator).tolist() for n in torch.randint(3, 30, (12,))]
    rows = PackedRows(ids, 64, 0)
    rows.mask = way  # as the task tells its rows: the batches carry the mask the model needs
    assert len(rows) < len(ids) and rows.sequences == len(ids)  # several texts a row
    count = sum(len(row) - 1 for row in ids)
    packed_sum, packed_grads = loss_sum_and_grads(model, *rows.__getitems__(list(range(len(rows)))), count)
    width = max(map(len, ids))
    padded = torch.tensor([row + [0] * (width - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    inputs = {"input_ids": padded, "attention_mask": mask}
    padded_sum, padded_grads = loss_sum_and_grads(model, inputs, padded.masked_fill(mask == 0, IGNORE), count)
    diff = max((packed_grads[k] - padded_grads[k]).abs().max().item() for k in padded_grads)
    assert packed_sum == pytest.approx(padded_sum, rel=1e-5) and diff < 1e-5, (packed_sum, padded_sum, diff)


@pytest.mark.parametrize("name", [*MOE])
def test_a_mixture_of_experts_keeps_its_load_balancing_loss(name, one_thread):
    """The fused loss adds the router's load-balancing loss as the model's own loss does: loss and every
    gradient equal, with padding; the term is no rounding (0.02 x about 2)."""
    own, fused = tiny_causal_lm(name).train(), prepared(name).train()
    assert lmhead.why_not(fused) is None
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 400, (3, 17), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 12:], mask[2, 5:] = 0, 0
    inputs, targets = {"input_ids": ids, "attention_mask": mask}, ids.masked_fill(mask == 0, IGNORE)
    results = [loss_sum_and_grads(model, inputs, targets, 30) for model in (own, fused)]
    diff = max((results[0][1][k] - results[1][1][k]).abs().max().item() for k in results[0][1])
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6) and diff < 1e-6, (results[0][0], results[1][0])
    with torch.no_grad():
        language_only = fused(**inputs, labels=targets, num_items_in_batch=30, output_router_logits=False).loss
    assert results[0][0] / 30 - language_only.item() > 0.02  # measured 0.04
    assert lmhead.describe_router(fused) == (
        "its router's load-balancing loss is added (router_aux_loss_coef 0.02), as its own"
    )


@pytest.mark.parametrize("name", sorted(set(ARCHITECTURES) - {"gemma2", "granite", "cohere"}))
def test_the_fused_loss_is_the_models_own(name, one_thread):
    """Loss and gradients from the output layer a chunk at a time equal the model's own from its full logits;
    the models that rescale their logits keep their own loss (said at start)."""
    own, fused = tiny_causal_lm(name).train(), prepared(name).train()
    ids = torch.randint(1, 400, (2, 21), generator=torch.Generator().manual_seed(3))
    results = [loss_sum_and_grads(model, {"input_ids": ids}, ids, 40) for model in (own, fused)]
    diff = max((results[0][1][k] - results[1][1][k]).abs().max().item() for k in results[0][1])
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5) and diff < 1e-5


def test_models_that_rescale_their_logits_keep_their_own_loss():
    for name, reason in (
        ("gemma2", "final_logit_softcapping"),
        ("granite", "logits_scaling"),
        ("cohere", "logit_scale"),
    ):
        assert lmhead.why_not(tiny_causal_lm(name)) == f"its logits are rescaled ({reason})"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    tokenizer = gpt2_tokenizer()
    found = {name: save_tiny(name, root / name, tokenizer) for name in ("opt", "bloom", "jetmoe")}
    return {**found, "data": write_jsonl(root / "texts.jsonl", texts(120, seed=5))}


def lm(folders, name: str, *flags: str) -> list[str]:
    return ["--model", f"hf:{folders[name]}", "--dataset", str(folders["data"]), "--task", "lm", *flags]


def test_a_packed_run_of_a_model_that_needs_the_mask_gets_it(folders, tmp_path, capsys):
    flags = ("--packing", "--max-length", "64", "--epochs", "3", "--batch-size", "4")
    summary = in_process(tmp_path / "opt", *lm(folders, "opt", *flags))
    assert "--packing: the texts of a row are kept apart by a block-diagonal attention mask" in capsys.readouterr().out
    assert summary["packed_texts_kept_apart_by"] == "mask" and summary["packed_sequences"] > summary["packed_rows"]
    assert summary["val_loss"] < 5.5  # it learns: ln 400 = 5.99 at the start, measured 5.28


def test_packing_or_checkpointing_a_model_that_cannot_is_one_line(folders, tmp_path, capsys):
    out = ["--output-dir", str(tmp_path / "run")]
    err = run_cli_error(capsys, [*lm(folders, "bloom", "--packing", "--max-length", "64"), *out])
    assert "--packing: BloomForCausalLM (bloom) does not keep packed texts apart" in err
    assert "train it without --packing" in err
    err = run_cli_error(capsys, [*lm(folders, "jetmoe", "--gradient-checkpointing"), *out])
    assert "--gradient-checkpointing: JetMoeForCausalLM (jetmoe) cannot recompute its blocks" in err
    assert not (tmp_path / "run").exists()
