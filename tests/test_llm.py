"""Fine-tuning language models (issue 28): gradient checkpointing first.

--gradient-checkpointing recomputes each transformer block's activations in the backward pass instead of
keeping them: every block runs twice per training batch (counted here), and the weights after 8 AdamW
steps are those of the run that kept its activations. A model that is not a transformers one is refused
in one line. Peak memory is measured by benchmarks/llm_memory.py (figures, not a test).

Data: 324 generated texts (tests/textdata.py); the tiny GPT-2 of tests/hfmodels.py."""

from __future__ import annotations

import pytest
import torch
from conftest import max_abs_diff, read_metrics, run_cli_error
from hfchecks import in_process
from hfmodels import tiny_gpt2
from textdata import texts, write_jsonl

from anytrain import load_model

pytest.importorskip("transformers")

N = 324
LM = f"--text-column text --val-fraction {33.5 / N} --test-fraction {35.5 / N} --task lm --max-length 64".split()
STEPS = ("--batch-size", "8", "--max-steps", "8", "--log-every-steps", "1", "--lr", "2e-3")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm")
    return {"data": write_jsonl(root / "texts.jsonl", texts(N, seed=3)), "gpt2": tiny_gpt2(root / "gpt2")}


def args(folders, *flags: str) -> list[str]:
    return ["--model", f"hf:{folders['gpt2']}", "--dataset", str(folders["data"]), *LM, *STEPS, *flags]


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
    plain = in_process(tmp_path / "plain", *args(folders))
    plain_calls = kept[0]
    kept[0] = 0
    checkpointed = in_process(tmp_path / "ckpt", *args(folders, "--gradient-checkpointing"))
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
