"""Your own model: `--model package.module:factory` or `--model file.py:factory`, objects passed to
`anytrain.train()`, and one line naming --model for every way a factory can fail."""

from __future__ import annotations

import pytest
from conftest import ROOT, max_abs_diff
from torch import nn

import anytrain
from anytrain.cli import main
from anytrain.config import ConfigError

EXAMPLE = ROOT / "examples" / "own_model.py"
QUICK = ["--epochs", "1", "--no-progress", "--no-plot"]


def cli_error(capsys, tmp_path, *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main([*argv, *QUICK, "--output-dir", str(tmp_path / "run")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err  # one line, not a traceback
    return err


FACTORIES = {
    "raises.py": "def build(model, shape):\n    raise ValueError('no such layer size')\n",
    "wrong_shape.py": "from torch import nn\ndef build(model, shape):\n    return nn.Linear(shape.num_features, 3)\n",
    "not_module.py": "def build(model, shape):\n    return 42\n",
    "breaks.py": "from torch import nn\ndef build(model, shape):\n    return nn.Linear(7, shape.num_classes)\n",
    "syntax.py": "def build(model, shape)\n    return None\n",
}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            "nosuch_pkg.nets:build",
            "--model nosuch_pkg.nets:build: cannot import nosuch_pkg.nets (ModuleNotFoundError: No module named "
            "'nosuch_pkg')",
        ),
        ("missing.py:build", "--model missing.py:build: file not found: missing.py"),
        (f"{EXAMPLE}:nothing", f"--model {EXAMPLE}:nothing: {EXAMPLE} has no attribute 'nothing'"),
        ("raises.py:build", "--model raises.py:build: the factory raised ValueError: no such layer size"),
        (
            "wrong_shape.py:build",
            "--model wrong_shape.py:build: the model maps inputs of shape (2, 64) to (2, 3); expected logits of shape "
            "(2, 10) (batch, num_classes)",
        ),
        ("not_module.py:build", "--model not_module.py:build: the factory returned int, not a torch.nn.Module"),
        (
            "breaks.py:build",
            "--model breaks.py:build: the model failed on a batch of inputs of shape (2, 64): RuntimeError: mat1 and "
            "mat2 shapes cannot be multiplied",
        ),
        ("resnet", "--model resnet needs image data (an Image column or a folder of images)"),
        ("syntax.py:build", "--model syntax.py:build: cannot import syntax.py (SyntaxError: expected ':'"),
    ],
)
def test_a_factory_that_cannot_be_used_is_one_line_naming_model(capsys, tmp_path, monkeypatch, spec, expected):
    for name, text in FACTORIES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    assert expected in cli_error(capsys, tmp_path, "--model", spec)
    assert not (tmp_path / "run" / "config.yaml").exists()  # refused before the run folder was started


def test_the_example_refuses_text_in_one_line(capsys, tmp_path):
    err = cli_error(
        capsys, tmp_path, "--dataset", "shakespeare", "--task", "lm", "--model", f"{EXAMPLE}:build", "--max-steps", "1"
    )
    assert "the factory raised ValueError: WideNet classifies tables and images" in err


def test_a_factory_in_a_package_of_the_working_directory(tmp_path, monkeypatch, one_thread):
    package = tmp_path / "mynets"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from torch import nn\n"
        "def linear(model, shape):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(shape.num_features, shape.num_classes))\n"
    )
    monkeypatch.chdir(tmp_path)
    summary = anytrain.train(
        {"epochs": 8, "lr": 0.01, "progress": False}, model="mynets:linear", output_dir=str(tmp_path / "run")
    )
    assert summary["model"] == "mynets:linear" and summary["parameters"] == 64 * 10 + 10
    assert summary["test_accuracy"] > 0.85  # a linear classifier on raw digits pixels (measured 0.94)
    assert set(anytrain.load_model(tmp_path / "run").state_dict()) == {"1.weight", "1.bias"}  # rebuilt from the factory


def test_objects_from_python_train_and_load_back(tmp_path, one_thread):
    import datasets

    digits = datasets.Dataset.from_parquet(str(ROOT / "src" / "anytrain" / "data" / "digits.parquet"))
    splits = digits.train_test_split(test_size=0.2, seed=0)  # a DatasetDict with train and test
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    summary = anytrain.train(model=model, dataset=splits, epochs=10, progress=False, output_dir=str(tmp_path / "run"))
    assert summary["model"] == "object:Sequential" and summary["dataset"] == "DatasetDict object"
    assert summary["test_accuracy"] > 0.9  # raw 0..16 pixels, no standardisation (measured 0.97)
    with pytest.raises(
        ConfigError,
        match=r"was passed to anytrain.train\(\) as a Python object; build it again and pass it: load_model\(run_dir, "
        r"model=...\)",
    ):
        anytrain.load_model(tmp_path / "run")
    fresh = anytrain.load_model(
        tmp_path / "run", model=nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    )
    assert max_abs_diff(fresh.state_dict(), model.state_dict()) == 0.0  # the object itself was trained
    with pytest.raises(ConfigError, match="config: unknown option 'epoch'"):
        anytrain.train(epoch=3)


# The example on 1 and 2 ranks (with augmented images): tests/test_images.py
