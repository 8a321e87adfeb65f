"""Configuration: defaults, YAML file, flags overriding it, and one-line errors with exit code 2."""

from __future__ import annotations

import dataclasses

import pytest

from anytrain.cli import main
from anytrain.config import TrainConfig, build_parser, parse_config


def run_cli_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err  # one clear line, not a traceback
    return err


def test_defaults_are_the_dataclass_defaults():
    assert parse_config([]) == TrainConfig()


def test_yaml_file_then_flags_override(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 0.05\nbatch_size: 32\noptimizer: sgd\nhidden-sizes: [8, 4]\n")
    cfg = parse_config(["--config", str(path), "--batch-size", "16"])
    assert cfg.lr == 0.05 and cfg.optimizer == "sgd" and cfg.hidden_sizes == [8, 4]
    assert cfg.batch_size == 16  # the flag wins over the file


def test_help_lists_every_option_with_its_default():
    text = build_parser().format_help()
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        assert flag in text, flag
    assert "(default: 2e-3)" in text or "(default: 0.002)" in text
    assert "--config" in text


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--lr", "0"], "--lr must be positive"),
        (["--lr=-1e-3"], "--lr must be positive"),
        (["--batch-size", "0"], "--batch-size must be positive"),
        (["--lr", "fast"], "argument --lr: invalid float value"),
        (["--model", "transformer"], "--model: unknown model 'transformer' (choose mlp, cnn, resnet, gpt"),
        (["--optimizer", "lion"], "argument --optimizer: invalid choice"),
        (["--schedule", "linear"], "argument --schedule: invalid choice"),
        (["--no-such-option", "1"], "unrecognized arguments: --no-such-option"),
        (["--config", "/nonexistent/run.yaml"], "--config: file not found: /nonexistent/run.yaml"),
        (["--val-fraction", "0.6", "--test-fraction", "0.5"], "must leave some training data"),
        (["--persistent-workers", "--num-workers", "0"], "--persistent-workers needs --num-workers > 0"),
        (["--lr", "inf"], "--lr must be a finite number, got inf"),
        (["--lr", "nan"], "--lr must be a finite number, got nan"),
        (["--weight-decay=-inf"], "--weight-decay must be a finite number"),
        (["--ddp-bucket-mb=-5"], "--ddp-bucket-mb must not be negative"),
        (["--ddp-comm-hook", "int8"], "argument --ddp-comm-hook: invalid choice"),
    ],
)
def test_bad_flags_get_one_line_and_exit_2(capsys, argv, expected):
    assert expected in run_cli_error(capsys, argv)


def test_help_and_bad_flags_answer_without_importing_torch():
    """The package imports torch only for a run: `--help` and a one-line error come back at once."""
    import subprocess
    import sys

    code = ("import sys\nfrom anytrain.cli import main\ntry:\n    main(['--lr', '0'])\nexcept SystemExit as e:\n"
            "    print('exit', e.code, 'torch imported:', 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "--lr must be positive" in out.stderr
    assert out.stdout.strip() == "exit 2 torch imported: False"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("learning_rate: 0.1\n", "unknown option 'learning_rate'"),
        ("batch_size: many\n", "option 'batch_size' must be int, got 'many'"),
        ("lr: true\n", "option 'lr' must be float"),
        ("optimizer: lion\n", "option 'optimizer' must be one of adamw, sgd"),
        ("- just\n- a list\n", "must hold a mapping"),
        ("lr: [1, 2\n", "is not valid YAML"),
    ],
)
def test_bad_yaml_gets_one_line_naming_file_and_option(capsys, tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    err = run_cli_error(capsys, ["--config", str(path)])
    assert expected in err and "bad.yaml" in err


def test_bad_dataset_fails_before_training(capsys, tmp_path):
    err = run_cli_error(capsys, ["--dataset", str(tmp_path / "missing.csv"), "--output-dir", str(tmp_path / "run")])
    assert "--dataset: file not found" in err
    assert not (tmp_path / "run").exists()  # nothing written for a run that never started


def test_the_anytrain_command_takes_train_as_an_optional_subcommand(capsys):
    assert "--lr must be positive" in run_cli_error(capsys, ["train", "--lr", "0"])


def test_the_task_and_model_follow_the_data_unless_given():
    assert (TrainConfig().task, TrainConfig().model) == ("classify", "auto")  # settled by the data: mlp for tables
    assert (TrainConfig(dataset="shakespeare").task, TrainConfig(dataset="shakespeare").model) == ("lm", "gpt")
    assert TrainConfig(dataset="book.TXT").task == "lm" and TrainConfig(model="gpt").task == "lm"
    assert TrainConfig(dataset="digits", text_column="caption").task == "lm"
    assert TrainConfig(dataset="shakespeare", task="classify").model == "auto"  # an explicit task wins


def test_data_whose_training_rows_share_one_label_is_refused(capsys, tmp_path):
    (tmp_path / "one.csv").write_text("x,label\n" + "".join(f"{i},0\n" for i in range(40)))
    err = run_cli_error(capsys, ["--dataset", str(tmp_path / "one.csv"), "--num-classes", "3", "--output-dir", str(tmp_path / "run")])
    assert "every training row of" in err and "has the same label (0)" in err
    assert not (tmp_path / "run").exists()
