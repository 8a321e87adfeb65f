"""Configuration: defaults, YAML file, flags overriding it, and one-line errors with exit code 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import run_cli_error

from anytrain.config import OPTIONS, SECTIONS, ConfigError, TrainConfig, build_parser, parse_config


def options_task(cfg):
    """The task the options settle before any labels are read: --task when given, else lm where the language
    model's `detect` recognises text from the options alone (it reads no file for that); None for labelled data,
    whose labels then decide (classify, regress or multilabel: tests/test_tasks.py)."""
    from anytrain.data.describe import Source
    from anytrain.tasks.lm import LanguageModel
    from anytrain.tasks.settle import bundled_columns

    cfg = bundled_columns(cfg)
    if cfg.data.task != "auto":
        return cfg.data.task
    return "lm" if LanguageModel.detect(Source(cfg)) else None


def test_defaults_are_the_dataclass_defaults():
    assert parse_config([]) == TrainConfig()
    assert {name: o.default for name, o in OPTIONS.items()} == TrainConfig().flat()


def test_every_option_lives_in_one_section_with_its_facts():
    assert list(SECTIONS) == ["data", "model", "optim", "eval", "run", "kto", "dpo", "grpo", "distill", "multilabel"]
    assert len({o.flag for o in OPTIONS.values()}) == len(OPTIONS)  # one flag each
    assert {o.section for o in OPTIONS.values()} == set(SECTIONS)
    cfg = TrainConfig(lr=0.05, model="cnn", hidden_sizes=[8], eval_every_steps=3, seed=7)
    assert (cfg.optim.lr, cfg.model.name, cfg.model.hidden_sizes, cfg.eval.eval_every_steps, cfg.run.seed) == (
        0.05,
        "cnn",
        [8],
        3,
        7,
    )
    # what may change on --resume is a fact of the option, not a list elsewhere
    assert OPTIONS["epochs"].resumable and OPTIONS["output_dir"].resumable and not OPTIONS["lr"].resumable
    with pytest.raises(ConfigError, match="config: unknown option 'learning_rate'"):
        TrainConfig(learning_rate=0.1)


def test_sectioned_and_flat_yaml_give_the_same_config(tmp_path):
    flat, sectioned = tmp_path / "flat.yaml", tmp_path / "sectioned.yaml"
    flat.write_text("dataset: shakespeare\nmodel: gpt\nn_layer: 2\nlr: 0.01\neval_every_steps: 5\noutput_dir: runs/x\n")
    sectioned.write_text(
        "data:\n  dataset: shakespeare\nmodel:\n  name: gpt\n  n_layer: 2\noptim:\n  lr: 0.01\n"
        "eval:\n  eval_every_steps: 5\nrun:\n  output_dir: runs/x\n"
    )
    cfg = parse_config(["--config", str(sectioned)])
    assert cfg == parse_config(["--config", str(flat)])
    assert (cfg.model.name, cfg.model.n_layer, cfg.optim.lr, options_task(cfg)) == ("gpt", 2, 0.01, "lm")
    # the run folder's config.yaml is the sectioned form, and reads back as the same config
    assert yaml.safe_load(yaml.safe_dump(cfg.to_dict()))["optim"]["lr"] == 0.01
    assert parse_config(["--config", str(sectioned), "--lr", "0.5"]).optim.lr == 0.5  # a flag still wins


def test_every_example_config_loads_unchanged():
    examples = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))
    assert examples
    expected = {"shakespeare_cpu": ("lm", "gpt"), "shakespeare_gpu": ("lm", "gpt"), "speakers_cpu": (None, "bag")}
    expected["hf_speakers"] = (None, "hf:distilbert/distilbert-base-uncased")  # None: the labels decide
    assert {path.stem for path in examples} >= set(expected)
    for path in examples:
        cfg = parse_config(["--config", str(path)])
        got = (options_task(cfg), cfg.model.name)
        assert got == expected.get(path.stem, got), path


def test_yaml_file_then_flags_override(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 0.05\nbatch_size: 32\noptimizer: sgd\nhidden-sizes: [8, 4]\n")
    cfg = parse_config(["--config", str(path), "--batch-size", "16"])
    assert cfg.optim.lr == 0.05 and cfg.optim.optimizer == "sgd" and cfg.model.hidden_sizes == [8, 4]
    assert cfg.optim.batch_size == 16  # the flag wins over the file


def test_help_lists_every_option_with_its_default():
    text = build_parser().format_help()
    for o in OPTIONS.values():
        assert o.flag in text, o.flag
    assert "(default: 2e-3)" in text or "(default: 0.002)" in text
    assert "--config" in text and "optim options:" in text  # grouped by section
    batch = text.split("--batch-size BATCH_SIZE\n")[1].split("--grad-accum-steps GRAD_ACCUM_STEPS")[0]
    batch = re.sub(r"(?<=-) ", "", " ".join(batch.split()))  # one line, as argparse wrapped it (also at a hyphen)
    assert batch.startswith("samples per process per forward pass: the global batch is batch_size x processes x ")
    grpo = "for grpo, prompts per process and optimizer step, each answered --num-generations times, the step's "
    assert grpo + "completions split into --grad-accum-steps micro-batches" in batch  # prompts, not samples


def help_of(capsys, argv: list[str]) -> str:
    """What `train.py ARGV --help` prints (exit code 0)."""
    from anytrain.cli import main

    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def flags_shown(text: str) -> set[str]:
    """The flags --help lists an entry for (the first flag of each entry, at its line's start)."""
    return set(re.findall(r"^  (--[a-z0-9-]+)", text, re.M))


def section_flags(*sections: str) -> set[str]:
    """The flags of the sections' options, those registry tasks share (ALSO: --beta, --reference) included."""
    from anytrain.config.schema import ALSO

    shared = {o.flag for options in ALSO.values() for o in options if o.section in sections}
    return {"--config"} | {o.flag for o in OPTIONS.values() if o.section in sections} | shared


COMMON = ("data", "model", "optim", "eval", "run")  # every section that is not a task's own
COMMON_HELP_LINES = 330  # measured 309 (the five sections and a line per task section); every section: 470


def test_help_without_a_task_shows_the_common_options_and_a_line_per_task_section(capsys):
    text = help_of(capsys, [])
    assert flags_shown(text) == section_flags(*COMMON)  # not --dpo-loss, --num-generations, --threshold
    for task in ("dpo", "grpo", "multilabel"):
        assert f"{task}'s own options: python src/train.py --task {task} --help\n" in text
        assert f"{task} options:" not in text
    assert len(text.splitlines()) < COMMON_HELP_LINES
    assert len(text.splitlines()) < 0.7 * len(build_parser().format_help().splitlines())
    assert help_of(capsys, ["--task", "auto"]) == text


@pytest.mark.parametrize("given", ["flag", "flag=", "yaml", "flat yaml"])
def test_help_of_a_task_shows_the_common_options_and_its_own_only(capsys, tmp_path, given):
    """--task grpo --help, as a flag or in the --config file: the five sections and grpo's, not dpo's or
    multilabel's, and no line pointing elsewhere."""
    (tmp_path / "run.yaml").write_text("data:\n  task: grpo\n" if given == "yaml" else "task: grpo\n")
    argv = {"flag": ["--task", "grpo"], "flag=": ["--task=grpo"]}.get(given, ["--config", str(tmp_path / "run.yaml")])
    text = help_of(capsys, argv)
    shown = flags_shown(text)
    assert shown == section_flags(*COMMON, "grpo")
    assert {"--num-generations", "--reward", "--lr", "--batch-size"} <= shown
    assert not {"--dpo-loss", "--simpo-gamma", "--threshold"} & shown
    assert "grpo options:" in text and "dpo options:" not in text and "own options: python" not in text
    full = build_parser().format_help()
    assert len(text.splitlines()) < len(full.splitlines()) - 20  # dpo's and multilabel's sections left out
    assert len(text.splitlines()) < len(help_of(capsys, []).splitlines()) + len(
        full.split("grpo options:")[1].splitlines()
    )


@pytest.mark.parametrize("task", ["dpo", "multilabel", "classify", "lm", "sft", "reward", "regress", "tag"])
def test_help_of_each_task_shows_its_own_section_and_no_others(capsys, task):
    text = help_of(capsys, ["--task", task])
    own = (task,) if task in SECTIONS else ()
    assert flags_shown(text) == section_flags(*COMMON, *own)
    assert "own options: python" not in text
    assert len(text.splitlines()) < (
        COMMON_HELP_LINES if not own else 0.75 * len(build_parser().format_help().splitlines())
    )


def test_the_flags_help_leaves_out_are_still_flags():
    assert parse_config(["--dpo-loss", "ipo"]).section("dpo").dpo_loss == "ipo"  # --task auto may pick dpo
    assert parse_config(["--task", "classify", "--num-generations", "4"]).section("grpo").num_generations == 4


def test_help_of_an_own_task_shows_its_options_section(capsys):
    """--task FILE.py:Class: the common sections and its own (examples/distill.py: --teacher, --temperature, which
    sets grpo's --temperature aside, ...); the next help without a task is the registry's again."""
    distill = str(Path(__file__).parents[1] / "examples" / "distill.py") + ":Distill"
    text = help_of(capsys, ["--task", distill])
    assert flags_shown(text) == section_flags(*COMMON, "kd")
    assert {"--teacher", "--temperature"} <= flags_shown(text)
    assert "kd options:" in text and "--num-generations" not in flags_shown(text)
    plain = help_of(capsys, [])
    assert "kd options" not in plain and "grpo's own options: python src/train.py --task grpo --help" in plain


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--lr", "0"], "--lr must be positive"),
        (["--lr=-1e-3"], "--lr must be positive"),
        (["--batch-size", "0"], "--batch-size must be positive"),
        (["--lr", "fast"], "argument --lr: invalid float value"),
        (
            ["--model", "transformer"],
            "--model: unknown model 'transformer' (choose mlp, cnn, resnet, encoder, bag, gpt",
        ),
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


@pytest.mark.launch
def test_help_and_bad_flags_answer_without_importing_torch():
    """The package imports torch only for a run: `--help` and a one-line error come back at once."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom anytrain.cli import main\n"
        "for argv in (['--lr', '0'], ['--help'], ['--task', 'grpo', '--help'], ['--task', 'dpo', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit as e:\n"
        "        print('exit', e.code, 'torch imported:', 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "--lr must be positive" in out.stderr
    said = [line for line in out.stdout.splitlines() if line.startswith("exit ")]
    assert said == ["exit 2 torch imported: False"] + ["exit 0 torch imported: False"] * 3
    assert "--num-generations" in out.stdout and "--dpo-loss" in out.stdout  # the helps were printed


@pytest.mark.parametrize(
    "text, expected",
    [
        ("learning_rate: 0.1\n", "unknown option 'learning_rate'"),
        ("batch_size: many\n", "option 'batch_size' must be int, got 'many'"),
        ("lr: true\n", "option 'lr' must be float"),
        ("optimizer: lion\n", "option 'optimizer' must be one of adamw, sgd"),
        ("optim:\n  learning_rate: 0.1\n", "unknown option 'learning_rate' in section 'optim'"),
        ("optim:\n  lr: fast\n", "option 'lr' must be float"),
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
    from anytrain.shape import DataShape
    from anytrain.tasks.settle import bundled_columns, settle
    from anytrain.usermodel import model_name

    task = options_task

    assert task(TrainConfig()) is None and task(TrainConfig(dataset="shakespeare")) == "lm"
    assert task(TrainConfig(dataset="book.TXT")) == "lm" and task(TrainConfig(model="gpt")) == "lm"
    assert task(TrainConfig(dataset="digits", text_column="caption")) == "lm"
    # text with a named label column is classified; the same text without one is modelled
    assert task(TrainConfig(dataset="reviews.parquet", text_column="review", label_column="stars")) is None
    assert task(parse_config(["--dataset", "r.parquet", "--text-column", "review", "--label-column", "y"])) is None
    assert task(TrainConfig(dataset="shakespeare", task="classify")) == "classify"  # an explicit task wins
    # the bundled labelled text set names its columns: on its own it classifies text by speaker
    speakers = settle(parse_config(["--dataset", "shakespeare-speakers"]))
    assert (speakers.cfg.data.task, speakers.cfg.data.text_column, speakers.cfg.data.label_column) == (
        "classify",
        "text",
        "speaker",
    )
    assert bundled_columns(TrainConfig(dataset="shakespeare-speakers", label_column="play")).data.label_column == "play"
    assert task(TrainConfig(dataset="shakespeare-speakers", task="lm")) == "lm"
    # --model auto is one rule, by the kind of data: mlp for tables, resnet for images, gpt for text
    auto = TrainConfig().model
    assert [model_name(auto, DataShape(kind)) for kind in ("tabular", "image", "text")] == ["mlp", "resnet", "gpt"]
    assert model_name(TrainConfig(model="cnn").model, DataShape("tabular")) == "cnn"


def test_data_whose_training_rows_share_one_label_is_refused(capsys, tmp_path):
    (tmp_path / "one.csv").write_text("x,label\n" + "".join(f"{i},0\n" for i in range(40)))
    err = run_cli_error(
        capsys, ["--dataset", str(tmp_path / "one.csv"), "--num-classes", "3", "--output-dir", str(tmp_path / "run")]
    )
    assert "every training row of" in err and "has the same label (0)" in err
    assert not (tmp_path / "run").exists()


def test_an_own_tasks_option_may_share_a_registry_tasks_name_and_each_run_gets_its_own():
    """grpo's --temperature (sampling) and examples/distill.py's --temperature (softening) in one process: each
    config reads the option of the task it trains, and the registry's comes back after the own task's run."""
    distill = str(Path(__file__).parents[1] / "examples" / "distill.py") + ":Distill"
    own = TrainConfig(task=distill, temperature=2.0)
    assert own.section("kd").temperature == 2.0 and "grpo" not in SECTIONS
    grpo = TrainConfig(task="grpo", temperature=0.7)
    assert grpo.section("grpo").temperature == 0.7 and "kd" not in SECTIONS
    assert list(SECTIONS) == ["data", "model", "optim", "eval", "run", "kto", "dpo", "grpo", "distill", "multilabel"]
    assert TrainConfig(temperature=0.5).section("grpo").temperature == 0.5  # --task auto: the registry's options
    # the own task's config made before keeps its options (a distiller reads its teacher's classify run meanwhile)
    assert own.flat()["temperature"] == 2.0 and own.replace(lr=0.1).section("kd").temperature == 2.0


def test_reading_another_runs_config_leaves_the_run_being_configured_as_it_was(tmp_path):
    """A distiller reads its teacher's config.yaml (anytrain.read_config) while its own run is configured: the
    registry's --temperature (grpo) that the teacher's config brings back must not displace the distiller's."""
    import anytrain
    from anytrain.config import save_config

    distill = str(Path(__file__).parents[1] / "examples" / "distill.py") + ":Distill"
    save_config(TrainConfig(task="classify", seed=7), tmp_path / "config.yaml")  # the teacher's run
    own = TrainConfig(task=distill, teacher="runs/teacher", temperature=2.0)  # the run being configured
    teacher = anytrain.read_config(tmp_path)
    assert teacher.data.task == "classify" and teacher.run.seed == 7
    assert "kd" in SECTIONS and "grpo" not in SECTIONS
    assert own.flat()["teacher"] == "runs/teacher" and own.replace(lr=0.5).section("kd").temperature == 2.0


def test_a_repeatable_list_option_adds_a_repeated_flag_and_any_other_takes_the_last():
    """--reward answer --reward format:X is two reward functions, as `--reward answer format:X` is (the guide says
    the flag is repeatable; argparse's default keeps the last one only, silently); any other list option's last
    flag wins, as a scalar's does, so a flag typed after a base command overrides it."""
    repeated = parse_config(["--task", "grpo", "--reward", "answer", "--reward", "format:[0-9]+"])
    assert repeated.section("grpo").reward == ["answer", "format:[0-9]+"]
    assert parse_config(["--task", "grpo", "--reward", "answer", "length:9"]).section("grpo").reward[1] == "length:9"
    assert parse_config(["--hidden-sizes", "64", "32"]).model.hidden_sizes == [64, 32]
    assert parse_config(["--hidden-sizes", "64", "--hidden-sizes", "32"]).model.hidden_sizes == [32]


def test_a_flag_registry_tasks_share_sets_each_and_each_keeps_its_own_default():
    """dpo and kto both take --beta and --reference (TRL's names): one flag; given, every section that has it takes
    it; not given, each keeps its own default; the run's task's value is the one `get`, flat() and the checks read."""
    from anytrain.config.schema import ALSO, option_of

    assert {"beta", "reference"} <= set(ALSO)
    given = parse_config(["--task", "kto", "--beta", "0.3"])
    assert given.section("kto").beta == given.section("dpo").beta == 0.3 and given.get("beta") == 0.3
    kto, dpo = parse_config(["--task", "kto"]), parse_config(["--task", "dpo"])
    assert kto.get("beta") == kto.section("kto").beta and dpo.get("beta") == dpo.section("dpo").beta
    assert option_of("beta", "kto").section == "kto" and option_of("beta", "dpo").section == "dpo"
    assert kto.replace(lr=1e-3).section("kto") == kto.section("kto")  # replace keeps each section's default
    with pytest.raises(ConfigError, match="--beta must be positive"):
        parse_config(["--task", "kto", "--beta", "-1"])
