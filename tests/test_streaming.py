"""`--streaming`: a local parquet read as a stream across 2 ranks. A spy model (a factory of the
test's own) writes down the sample ids it trains on, so the test sees that every sample is
trained on exactly once per epoch, that epochs are reshuffled, and that 2 ranks x 8 trains like 1 rank x 16."""

from __future__ import annotations

import pytest
from conftest import launch, max_abs_diff, read_summary

import anytrain
from anytrain.cli import main

SPY = """
import os
from torch import nn

class Spy(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.linear = nn.Linear(shape.num_features, shape.num_classes)

    def forward(self, x):
        if self.training:  # one line per batch: the ids (feature 0) this rank trains on
            with open(os.path.join(os.environ["SPY_DIR"], f"seen-{os.environ.get('RANK', '0')}.txt"), "a") as f:
                f.write(" ".join(str(int(v)) for v in x[:, 0].tolist()) + "\\n")
        return self.linear(x)

def build(model, shape):
    return Spy(shape)
"""


def write_stream_data(folder):
    import datasets

    folder.mkdir()

    def rows(ids):
        return {"x": [[float(i), (i * 37 % 11) / 11.0] for i in ids], "label": [i % 2 for i in ids]}

    # JSON lines: datasets ends every pass over a *parquet* stream with a 5 s pause (its guard against an Arrow
    # shutdown crash)
    datasets.Dataset.from_dict(rows(range(160))).to_json(str(folder / "train.jsonl"))
    datasets.Dataset.from_dict(rows(range(1000, 1030))).to_json(str(folder / "validation.jsonl"))


@pytest.mark.launch
def test_a_stream_on_2_ranks_trains_on_every_sample_once_per_epoch(tmp_path):
    data = tmp_path / "data"
    write_stream_data(data)
    (tmp_path / "spy.py").write_text(SPY)
    common = [
        "--dataset",
        str(data),
        "--streaming",
        "--num-classes",
        "2",
        "--max-steps",
        "20",
        "--model",
        f"{tmp_path / 'spy.py'}:build",
        "--dropout",
        "0",
        "--lr",
        "0.01",
    ]
    runs = {}
    for ranks, config, batch in ((2, "multi_cpu.yaml", 8), (1, "cpu.yaml", 16)):
        spy = tmp_path / f"spy{ranks}"
        spy.mkdir()
        result = launch(
            config,
            *common,
            "--batch-size",
            str(batch),
            "--output-dir",
            str(tmp_path / f"run{ranks}"),
            env={"SPY_DIR": str(spy)},
        )
        assert result.returncode == 0, result.stderr[-3000:]
        runs[ranks] = [
            [[int(v) for v in line.split()] for line in (spy / f"seen-{r}.txt").read_text().splitlines()]
            for r in range(ranks)
        ]
    two = runs[2]
    assert [len(lines) for lines in two] == [20, 20] and all(
        len(batch) == 8 for lines in two for batch in lines
    )  # 160 / (2 x 8) = 10 steps an epoch
    for epoch in (0, 1):
        seen = [i for lines in two for batch in lines[10 * epoch : 10 * epoch + 10] for i in batch]
        assert sorted(seen) == list(range(160)), f"epoch {epoch}: every sample once"

    def order(e):
        return [i for step in range(10 * e, 10 * e + 10) for r in (0, 1) for i in two[r][step]]

    assert order(0) != order(1)  # reshuffled (datasets' shuffle buffer, set_epoch)
    assert [i for batch in runs[1][0][:10] for i in batch] == order(0)  # 1 rank reads the same stream in the same order
    summary = read_summary(tmp_path / "run2")
    assert (
        summary["data_path"].startswith("stream")
        and summary["optimizer_steps"] == 20
        and summary["epochs_completed"] == 2
    )
    assert summary["scenario"]["num_processes"] == 2
    diff = max_abs_diff(
        anytrain.load_model(tmp_path / "run1").state_dict(), anytrain.load_model(tmp_path / "run2").state_dict()
    )
    assert diff < 1e-5, diff


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--streaming"], "--streaming needs --max-steps"),
        (
            ["--streaming", "--max-steps", "5", "--num-classes", "2", "--dataset", "{train}"],
            "has no validation split, and a stream cannot be carved",
        ),
        (
            ["--streaming", "--max-steps", "5", "--dataset", "{data}"],
            "--num-classes: a stream's classes cannot be counted up front",
        ),
    ],
)
def test_streaming_refusals_are_one_line(tmp_path, capsys, argv, expected):
    write_stream_data(tmp_path / "data")
    argv = [a.format(data=tmp_path / "data", train=tmp_path / "data" / "train.jsonl") for a in argv]
    capsys.readouterr()  # datasets' own progress bars while writing the files
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--no-progress", "--no-plot", "--output-dir", str(tmp_path / "run")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1, err


def test_an_image_stream_trains_in_one_process(tmp_path, one_thread):
    from imagedata import write_imagefolder

    write_imagefolder(tmp_path / "data" / "train", size=8, mode="L")
    write_imagefolder(
        tmp_path / "data" / "validation", size=8, mode="L", count=300
    )  # the first 300 again: a mechanics check
    summary = anytrain.train(
        dataset=str(tmp_path / "data"),
        streaming=True,
        max_steps=60,
        model="mlp",
        hidden_sizes=[64],
        augment=["crop"],
        lr=0.01,
        progress=False,
        output_dir=str(tmp_path / "run"),
    )
    assert summary["data_path"].startswith("stream") and summary["image_mode"] == "L" and summary["image_size"] == 8
    assert summary["val_accuracy"] > 0.8, summary["val_accuracy"]  # ClassLabel column: 10 classes without --num-classes
