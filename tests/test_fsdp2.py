"""FSDP2 (accelerate_configs/fsdp.yaml) where accelerate leaves anytrain on its own, found by the first run on a GPU
(an H200, scripts/gpu_truth.py): accelerate 1.15 prepares an FSDP2 model without the autocast it gives every other
model, and its weights are DTensors (each rank holds a shard), which the best-weights copy, its restore and the
weights' fingerprint must gather or shard. accelerate ignores its FSDP plugin on a CPU, so these tests shard with
torch's own fully_shard on one gloo rank, as accelerate's FSDP2 path does on GPUs."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from anytrain.best import BestWeights
from anytrain.models import Standardize
from anytrain.outputs import weights_fingerprint
from anytrain.scenario import with_autocast

BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, output_dtype=torch.bfloat16)


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def sharded(policy: MixedPrecisionPolicy | None = None) -> torch.nn.Module:
    """The default MLP's shape in small: a float32 standardisation (buffers), then linear layers."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        Standardize(torch.zeros(4), torch.ones(4)), torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )
    return fully_shard(model, mp_policy=policy or MixedPrecisionPolicy())


def test_an_fsdp2_model_in_bf16_gets_the_autocast_accelerate_leaves_out(one_rank):
    x = torch.randn(2, 4)
    with pytest.raises(RuntimeError, match="mat1 and mat2 must have the same dtype"):  # the H200's error
        sharded(BF16)(x)
    model = sharded(BF16)
    with_autocast(model, torch.autocast("cpu", dtype=torch.bfloat16))
    out = model(x)
    out.float().sum().backward()
    assert out.shape == (2, 3) and model[1].weight.grad.full_tensor().abs().sum() > 0


def test_the_best_weights_of_a_sharded_model_are_whole_and_go_back_into_its_shards(one_rank, tmp_path):
    from safetensors.torch import load_file, save_file

    model = sharded()
    assert isinstance(model[1].weight, DTensor)
    expected = {k: v.full_tensor().clone() for k, v in model.state_dict().items() if isinstance(v, DTensor)}
    fingerprint = weights_fingerprint(model.state_dict())
    best = BestWeights(keep=True)
    best.take(model, step=10)
    assert all(not isinstance(t, DTensor) for t in best.tensors.values())
    save_file(best.tensors, str(tmp_path / "best.safetensors"))  # what a checkpoint holds: failed on the H200
    assert torch.equal(load_file(str(tmp_path / "best.safetensors"))["1.weight"], expected["1.weight"])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # training moves on
    assert weights_fingerprint(model.state_dict()) != fingerprint
    assert best.restore(model, step=20)
    assert weights_fingerprint(model.state_dict()) == fingerprint
    assert all(torch.equal(model.state_dict()[k].full_tensor(), v) for k, v in expected.items())
