"""Model parallelism (anytrain.model_parallel), on the CPU: the naive and pipelined splits compute
the same outputs and gradients as the unsplit model, train to the same accuracy, and reject bad
options with a clear error. All in-process."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from anytrain import TrainConfig, load_model
from anytrain.config import ConfigError
from anytrain.model_parallel import (
    PipelinedTwoStageModel,
    TwoStageModel,
    balanced_split,
    main,
    pick_devices,
    split_model,
    train_model_parallel,
)
from anytrain.shape import DataShape
from anytrain.trainer import train
from anytrain.usermodel import make_model

FEATURES, CLASSES, BATCH = 16, 5, 10  # BATCH = 10 does not divide evenly into 3, 4 or 7 micro-batches


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is faster and steadier


def small_model(kind: str) -> nn.Sequential:
    torch.manual_seed(0)
    cfg = TrainConfig(
        model=kind, hidden_sizes=[24, 12], channels=[3], dropout=0.0
    )  # no dropout: outputs are deterministic
    mean, std = torch.randn(FEATURES), torch.rand(FEATURES) + 0.5  # a Standardize layer that does something
    return make_model(
        cfg.model, DataShape("tabular", num_classes=CLASSES, num_features=FEATURES, feature_mean=mean, feature_std=std)
    )


def batch(n: int = BATCH):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, FEATURES, generator=g) * 3, torch.randint(CLASSES, (n,), generator=g)


def outputs_and_grads(model: nn.Module, inputs, targets):
    model.zero_grad()
    outputs = model(inputs)
    nn.functional.cross_entropy(outputs, targets).backward()
    return outputs.detach(), [p.grad.clone() for p in model.parameters()]


MLP_LAYERS, CNN_LAYERS = len(small_model("mlp")), len(small_model("cnn"))


@pytest.mark.parametrize(
    "micro_batches", [None, 1, 2, 3, 4, 7, BATCH], ids=lambda m: "naive" if m is None else f"mb{m}"
)
@pytest.mark.parametrize(
    "kind, split_at", [("mlp", s) for s in range(1, MLP_LAYERS)] + [("cnn", s) for s in range(1, CNN_LAYERS)]
)
def test_split_outputs_and_gradients_equal_the_single_device_model(kind, split_at, micro_batches):
    reference = small_model(kind)
    model = copy.deepcopy(reference)
    split = (
        TwoStageModel(model, split_at)
        if micro_batches is None
        else PipelinedTwoStageModel(model, split_at, micro_batches)
    )
    inputs, targets = batch()
    ref_out, ref_grads = outputs_and_grads(reference, inputs, targets)
    out, grads = outputs_and_grads(split, inputs, targets)
    assert len(grads) == len(ref_grads) == len(list(reference.parameters()))
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if micro_batches is None:  # the naive split runs exactly the same operations
        assert torch.equal(out, ref_out) and all(torch.equal(g, w) for g, w in zip(grads, ref_grads))


def test_split_keeps_every_layer_once_in_order():
    model = small_model("mlp")
    layers = list(model)
    split = PipelinedTwoStageModel(model, split_at=3, micro_batches=2)
    assert list(split.stage1) == layers[:3] and list(split.stage2) == layers[3:]
    merged = split.to_sequential()
    assert list(merged.state_dict()) == list(small_model("mlp").state_dict())  # original names, for save/load


def test_default_split_balances_parameters_and_placement_is_printed_plainly():
    cfg = (
        TrainConfig()
    )  # digits MLP: Standardize, Linear(64, 256), ReLU, Dropout, Linear(256, 256), ReLU, Dropout, Linear(256, 10)
    model = make_model(cfg.model, DataShape("tabular", num_classes=10, num_features=64))
    assert balanced_split(list(model)) == 4  # 16,640 | 68,362 beats 82,432 | 2,570
    split = TwoStageModel(model)
    assert split.split_at == 4
    assert split.placement() == (
        "model parallel, naive: stage 1 (layers 0-3, 16,640 params) and stage 2 (layers 4-7, 68,362 params), "
        "both on cpu (no GPU found)"
    )


@pytest.mark.parametrize(
    "gpus, first, second",
    [(0, "cpu", "cpu"), (1, "cuda:0", "cuda:0"), (2, "cuda:0", "cuda:1"), (8, "cuda:0", "cuda:1")],
)
def test_device_choice_for_any_number_of_gpus(gpus, first, second):
    dev1, dev2, why = pick_devices(gpus, use_cpu=False)
    assert (str(dev1), str(dev2)) == (first, second) and why


def test_an_accelerate_launch_on_the_cpu_keeps_both_stages_on_the_cpu(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")  # what `accelerate launch --cpu` or use_cpu: true sets
    assert pick_devices(2)[:2] == (torch.device("cpu"), torch.device("cpu"))
    monkeypatch.setenv("ACCELERATE_USE_CPU", "False")
    assert pick_devices(2)[:2] == (torch.device("cuda:0"), torch.device("cuda:1"))


def test_no_gpu_here_means_both_stages_on_the_cpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    split = PipelinedTwoStageModel(small_model("mlp"), micro_batches=2)
    assert split.devices == (torch.device("cpu"), torch.device("cpu"))
    assert all(p.device.type == "cpu" for p in split.parameters())


@pytest.mark.parametrize("split_at", [0, -1, MLP_LAYERS, MLP_LAYERS + 5])
def test_split_point_out_of_range_is_a_clear_error(split_at):
    with pytest.raises(ConfigError, match=rf"--split-at {split_at} is out of range: the model has {MLP_LAYERS} layers"):
        TwoStageModel(small_model("mlp"), split_at)


@pytest.mark.parametrize("micro_batches", [0, -2])
def test_zero_micro_batches_is_a_clear_error(micro_batches):
    with pytest.raises(ConfigError, match="--micro-batches must be a positive integer"):
        PipelinedTwoStageModel(small_model("mlp"), micro_batches=micro_batches)


def test_more_micro_batches_than_samples_is_a_clear_error():
    split = PipelinedTwoStageModel(small_model("mlp"), micro_batches=BATCH + 1)
    with pytest.raises(
        ConfigError, match=rf"--micro-batches {BATCH + 1} is more than the {BATCH} samples in this batch"
    ):
        split(batch()[0])


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ConfigError, match="--mode must be one of single, naive, pipelined"):
        split_model(small_model("mlp"), "tensor")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--split-at", "99"], "model_parallel: error: --split-at 99 is out of range: the model has 8 layers (0-7)"),
        (["--micro-batches", "0"], "model_parallel: error: --micro-batches must be a positive integer, got 0"),
        (
            ["--micro-batches", "33"],
            "model_parallel: error: --micro-batches 33 is more than the 32 samples of a batch (--batch-size)",
        ),
        # digits: 1,259 / 179 / 359 samples in batches of 32, so the smallest batch (the test split's last) holds 7
        (
            ["--micro-batches", "8"],
            "model_parallel: error: --micro-batches 8 is more than the 7 samples of the smallest test batch",
        ),
        (["--mode", "tensor"], "model_parallel: error: argument --mode: invalid choice: 'tensor'"),
        (["--epochs", "0"], "model_parallel: error: --epochs must be positive, got 0"),
    ],
)
def test_command_line_bad_options_exit_2_with_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*args, *([] if "--epochs" in args else ["--epochs", "1"])])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_command_line_trains_prints_placement_and_saves_loadable_weights(tmp_path, capsys):
    main(["--epochs", "1", "--hidden-sizes", "32", "--micro-batches", "3", "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert (
        "model parallel, pipelined, 3 micro-batches: stage 1 (layers 0-3, 2,080 params) and stage 2 (layer 4, 330 "
        "params)" in out
    )
    model = load_model(tmp_path)  # the unsplit model, as the trainer saves it
    assert isinstance(model, nn.Sequential) and model(torch.zeros(2, 64)).shape == (2, 10)


def test_every_variant_trains_like_the_trainer_on_the_digits(tmp_path):
    # model_parallel.py ends with the last step's weights: the trainer is told to keep those too
    cfg = TrainConfig(epochs=6, dropout=0.0, final_weights="last", progress=False, output_dir=str(tmp_path / "trainer"))
    trainer = train(cfg)  # the data-parallel trainer, one process
    results = {}
    for mode, micro_batches in [("single", 1), ("naive", 1), ("pipelined", 4), ("pipelined", 5)]:
        model, summary, _ = train_model_parallel(cfg, mode, micro_batches=micro_batches, verbose=False)
        state = (model.to_sequential() if isinstance(model, TwoStageModel) else model).state_dict()
        results[mode, micro_batches] = summary, state
    single, single_state = results["single", 1]
    # Same data, order, initial weights, optimizer and schedule as the trainer: the same model.
    assert single["test_accuracy"] == trainer["test_accuracy"] >= 0.95
    assert single["test_loss"] == pytest.approx(trainer["test_loss"], rel=1e-5)
    for (mode, micro_batches), (summary, state) in results.items():
        assert summary["test_accuracy"] >= 0.95
        assert abs(summary["test_accuracy"] - single["test_accuracy"]) <= 0.01, (mode, micro_batches)
        for name, tensor in state.items():
            if mode == "naive":  # identical operations: bit for bit
                assert torch.equal(tensor, single_state[name]), name
            else:  # micro-batches sum the gradient in another order: float32 rounding only
                torch.testing.assert_close(tensor, single_state[name], rtol=1e-3, atol=1e-4)
