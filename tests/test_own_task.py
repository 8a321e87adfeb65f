"""Your own task from one file (`--task FILE.py:Class`, issue 33): a task class written to a temporary file
trains through the one loop with its own option, gives the same weights on 1 and 2 ranks, resumes
bit-identically after a real SIGKILL, and predicts; the same class without `loss` is refused in one line;
a run whose task file has moved says where it was.

Runs: one in this process (the reference for the 2 ranks, and what predict and the resume check read), one
2-rank launch and two background runs (a reference and a victim killed, then resumed); each trains 512 rows of a
small table for a few epochs. The launches are marked `launch`; the rest is `make check`'s."""

from __future__ import annotations

import ast
import json
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import kill_and_resume, launch, max_abs_diff, read_summary, run_cli_error

from anytrain import load_model
from anytrain.cli import main

TASK = textwrap.dedent(
    '''
    """Cross-entropy with label smoothing, each class weighted by its running loss (the classes it gets wrong count
    more): a classification task of one's own, with its own option, its own step and state kept across a kill."""
    import json
    from dataclasses import dataclass

    import torch
    from torch.nn import functional as F

    from anytrain import HIGHER, LOWER, DataShape, Task, load_labelled, make_model, option, predict_rows


    @dataclass(frozen=True)
    class SmoothingOptions:
        smoothing: float = option(0.1, "the share of each target spread over the other classes", bounds="[0, 1)")


    class Smoothed(Task):
        name = "smoothed"
        goals = {"loss": LOWER, "accuracy": HIGHER}
        headline = "accuracy"
        offers = frozenset({"predict"})
        options = SmoothingOptions

        def load_data(self, given=None):
            self.data = load_labelled(self.cfg, given)
            return self.data

        def build_model(self, given=None):
            return make_model(self.cfg.model, self.data.shape, given)

        def model_from_metadata(self, meta, given=None):
            return make_model(self.cfg.model, meta["data_shape"], given)

        def loss(self, outputs, targets):
            return F.cross_entropy(outputs, targets, label_smoothing=self.cfg.section("smoothed").smoothing)

        def on_run_start(self, ctx):
            self.running = [1.0] * self.data.num_classes  # each class's running mean loss

        def train_step(self, ctx, batch):
            inputs, targets = batch
            smoothing = self.cfg.section("smoothed").smoothing
            losses = F.cross_entropy(ctx.forward(inputs, targets), targets, reduction="none", label_smoothing=smoothing)
            k, wide = len(self.running), torch.float64  # float64: the same sums whatever the rows' split over ranks
            sums = torch.zeros(2, k, device=losses.device, dtype=wide)
            sums[0].index_add_(0, targets, losses.detach().to(wide))
            sums[1].index_add_(0, targets, torch.ones_like(losses, dtype=wide))
            sums = ctx.accelerator.reduce(sums, "sum")  # over every rank's batch: the same weights everywhere
            running = torch.tensor(self.running, device=losses.device, dtype=wide)
            seen = sums[1] > 0
            running[seen] = 0.9 * running[seen] + 0.1 * sums[0][seen] / sums[1][seen]
            self.running = running.tolist()
            return (losses * (running / running.mean()).float()[targets]).mean()

        def state_dict(self):
            return {"running": self.running}

        def load_state_dict(self, state):
            self.running = state["running"]

        def per_sample(self, outputs, targets):
            hits = (outputs.argmax(-1) == targets).float()
            return {"loss": F.cross_entropy(outputs, targets, reduction="none"), "accuracy": hits}

        def metrics(self, sums, count):
            return {name: value.item() / count for name, value in sums.items()}

        def example_targets(self, shape, batch):
            return torch.zeros(batch, dtype=torch.long)

        def predict_inputs(self, dataset, meta, folder):
            return predict_rows(dataset, meta["input_columns"], meta["num_features"])

        def predict_batch(self, model, inputs, meta):
            probabilities = model(inputs).softmax(-1)
            return [{"class_id": k, "probability": p} for p, k in zip(*probabilities.max(-1))]
    '''
).replace("for p, k in zip(*probabilities.max(-1))", "for p, k in zip(*(t.tolist() for t in probabilities.max(-1)))")


def write_table(path: Path, rows: int, seed: int) -> Path:
    """Three classes of 8 features, separable but not trivially (a linear rule plus noise)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8)).round(4)
    label = (x[:, :3] + 0.5 * rng.normal(size=(rows, 3))).argmax(1)
    lines = [",".join([f"x{k}" for k in range(8)] + ["label"])]
    lines += [",".join([*map(str, row), str(y)]) for row, y in zip(x.tolist(), label.tolist())]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("own_task")
    task = root / "smoothing.py"
    task.write_text(TASK)
    table = write_table(root / "table.csv", 640, seed=0)  # 512 train, 64 validation, 64 test
    return {"root": root, "task": task, "table": table, "new": write_table(root / "new.csv", 5, seed=1)}


def args(files: dict, batch: int) -> list[str]:
    return [
        "--task", f"{files['task']}:Smoothed", "--smoothing", "0.2", "--dataset", str(files["table"]),
        "--val-fraction", "0.1", "--test-fraction", "0.1", "--model", "mlp", "--hidden-sizes", "32", "--dropout", "0",
        "--optimizer", "sgd", "--lr", "0.1", "--epochs", "3", "--batch-size", str(batch),
        "--final-weights", "last", "--log-every-steps", "1", "--seed", "3", "--no-progress",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def one(files) -> Path:
    """The 1-process run, trained here (what `train.py` would run, through its main)."""
    main([*args(files, 32), "--output-dir", str(files["root"] / "one")])
    return files["root"] / "one"


@pytest.mark.launch
def test_an_own_task_trains_with_its_option_and_equals_on_one_and_two_ranks(one, files):
    two = launch("multi_cpu.yaml", *args(files, 16), "--output-dir", str(files["root"] / "two"))
    assert two.returncode == 0, (two.stdout + two.stderr)[-3000:]
    two = files["root"] / "two"
    summary = read_summary(one)
    assert summary["task"] == "smoothed" and summary["best_metric"] == "accuracy"
    assert summary["test_accuracy"] > 0.7  # learned: three balanced classes are 0.33 by chance
    assert read_summary(two)["scenario"]["num_processes"] == 2
    assert max_abs_diff(load_model(one).state_dict(), load_model(two).state_dict()) <= 1e-6
    saved = (one / "config.yaml").read_text()
    assert "smoothed:\n  smoothing: 0.2" in saved and f"task: {files['task']}:Smoothed" in saved


def test_its_option_changes_the_loss_and_the_resume_check_knows_it(files, one, capsys):
    err = run_cli_error(capsys, [*args(files, 32), "--smoothing", "0.3", "--output-dir", str(one), "--resume"])
    assert "smoothing: 0.2 -> 0.3" in err
    assert "--smoothing must be in [0, 1), got 1.5" in run_cli_error(capsys, [*args(files, 32), "--smoothing", "1.5"])


@pytest.mark.launch
def test_an_own_task_resumes_bit_identically_after_a_real_kill(files, tmp_path):
    """Its own step and its state (each class's running loss, in every checkpoint's progress.json) included."""
    reference, victim = kill_and_resume(tmp_path, args(files, 32), kill_step=20)
    a, b = read_summary(reference), read_summary(victim)
    assert a["last_weights_sha256"] == b["last_weights_sha256"] and a["test_accuracy"] == b["test_accuracy"]
    latest = victim / "checkpoints" / (victim / "checkpoints" / "latest").read_text().strip()
    saved = json.loads((latest / "progress.json").read_text())["task"]["running"]
    assert len(saved) == 3 and saved != [1.0] * 3 and all(0 < loss < 5 for loss in saved)  # the step moved it


def test_an_own_task_predicts_and_a_moved_file_is_said(files, one, tmp_path):
    from anytrain.config import ConfigError
    from anytrain.predict import predict

    rows = predict(str(one), str(files["new"]))
    assert [r["row"] for r in rows] == list(range(5)) and all(0 <= r["class_id"] < 3 for r in rows)
    assert [r["label"] for r in rows] == [int(line.rsplit(",", 1)[1]) for line in files["new"].read_text().split()[1:]]
    moved = tmp_path / "run"
    (moved).mkdir()
    summary = json.loads((one / "summary.json").read_text())
    assert summary["task"] == "smoothed"
    files["task"].rename(files["task"].with_suffix(".bak"))
    try:
        with pytest.raises(ConfigError, match=r"run_dir: the run trained --task .*smoothing.py:Smoothed, which cannot"):
            predict(str(one), str(files["new"]))
    finally:
        files["task"].with_suffix(".bak").rename(files["task"])


def default_step(task: str) -> str:
    """The task above without its own train_step: the default step (forward, then its loss)."""
    return re.sub(r"\n    def train_step\(.*?\n\n", "\n", task, flags=re.S)


def test_a_task_without_its_loss_is_refused_in_one_line_naming_it(files, capsys, tmp_path):
    """The default step computes the task's loss: a task that keeps that step must define it (one that owns its step
    need not)."""
    broken = tmp_path / "broken.py"
    broken.write_text(re.sub(r"\n    def loss\(.*?\n\n", "\n", default_step(TASK), flags=re.S))
    assert "def loss" not in broken.read_text() and "def per_sample" in broken.read_text()
    out = tmp_path / "out"
    err = run_cli_error(capsys, ["--task", f"{broken}:Smoothed", "--output-dir", str(out)])
    assert err.strip().splitlines() == [
        f"train.py: error: --task {broken}:Smoothed: Smoothed does not define the required method loss"
    ]
    assert not out.exists()


def test_a_task_class_from_python_trains_under_its_file_name(files, tmp_path):
    import importlib.util

    import anytrain

    spec = importlib.util.spec_from_file_location("smoothing_module", files["task"])
    module = importlib.util.module_from_spec(spec)
    sys.modules["smoothing_module"] = module  # as `import smoothing_module` would
    spec.loader.exec_module(module)
    summary = anytrain.train(
        task=module.Smoothed, smoothing=0.0, dataset=str(files["table"]), model="mlp", hidden_sizes=[8], epochs=1,
        batch_size=64, output_dir=str(tmp_path / "py"), progress=False, plot=False,
    )  # fmt: skip
    assert summary["task"] == "smoothed"
    assert f"{files['task']}:Smoothed" in (tmp_path / "py" / "config.yaml").read_text()


def test_an_own_tasks_options_are_part_of_its_runs_only(one):
    """Registering a task's section (done above, in this process) leaves other runs' configs as they were: the
    resume and run-folder checks of a plain run must not see a 'smoothing' it never had."""
    from anytrain.config import OPTIONS, TrainConfig

    assert "smoothing" in OPTIONS  # registered by the runs above
    plain = TrainConfig(lr=0.01)
    assert "smoothing" not in plain.flat() and "smoothed" not in plain.to_dict()


# --------------------------------------------------------------------------- the public surface an own task uses

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "distill.py"


def anytrain_imports(source: str) -> dict[str, list[str]]:
    """{module: names} of every import of anytrain or one of its modules in a Python source."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "anytrain":
            found.setdefault(node.module or "", []).extend(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "anytrain":
                    found.setdefault(alias.name, [])
    return found


def test_an_own_task_needs_nothing_but_the_public_anytrain():
    """examples/distill.py and the task above import from `anytrain` itself only, names it exports."""
    import anytrain

    for where, source in (("examples/distill.py", EXAMPLE.read_text()), ("TASK", TASK)):
        imports = anytrain_imports(source)
        assert list(imports) == ["anytrain"], (where, imports)
        assert imports["anytrain"] and set(imports["anytrain"]) <= set(anytrain.__all__), where
        assert all(getattr(anytrain, name) is not None for name in imports["anytrain"])


def test_a_finished_runs_config_is_read_through_anytrain(one, tmp_path):
    import anytrain

    cfg = anytrain.read_config(one)
    assert isinstance(cfg, anytrain.TrainConfig) and cfg.data.task.endswith("smoothing.py:Smoothed")
    assert cfg.section("smoothed").smoothing == 0.2 and cfg.model.hidden_sizes == [32] and cfg.run.seed == 3
    assert cfg == anytrain.read_config(one / "config.yaml")
    with pytest.raises(anytrain.ConfigError, match=r"^run_dir: no config.yaml in .*nowhere \(an anytrain run folder"):
        anytrain.read_config(tmp_path / "nowhere")


def test_a_required_option_left_out_is_one_line_naming_it_and_the_task(capsys, tmp_path):
    """examples/distill.py's --teacher: required by its declaration, said before anything is written; --help says
    so; given in a --config file it counts as given."""
    from anytrain.cli import main

    spec, out = f"{EXAMPLE}:Distill", tmp_path / "out"
    err = run_cli_error(capsys, ["--task", spec, "--output-dir", str(out)])
    assert err == f"train.py: error: --teacher is required by --task {spec}"
    err = run_cli_error(capsys, ["--task", spec, "--teacher", "", "--output-dir", str(out)])
    assert err == f"train.py: error: --teacher is required by --task {spec}"
    (tmp_path / "given.yaml").write_text(f"kd:\n  teacher: {tmp_path / 'absent'}\n")
    err = run_cli_error(capsys, ["--task", spec, "--config", str(tmp_path / "given.yaml"), "--output-dir", str(out)])
    assert f"--teacher: {tmp_path / 'absent'} is not a finished anytrain run folder" in err
    assert not out.exists()
    with pytest.raises(SystemExit) as done:
        main(["--task", spec, "--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    help_line = "--teacher TEACHER the teacher's run folder: a finished anytrain run on the same data and split"
    assert f"{help_line} (required)" in shown


def test_a_task_file_alone_trains_its_one_task_class(files, tmp_path, capsys):
    """--task FILE.py: the one Task subclass the file defines (not one it imports); none or several: one line."""
    from anytrain.cli import main

    task = str(files["task"])
    base = ["--dataset", str(files["table"]), "--model", "mlp", "--hidden-sizes", "8", "--epochs", "1", "--no-progress"]
    main(["--task", task, "--smoothing", "0.2", *base, "--no-plot", "--output-dir", str(tmp_path / "run")])
    assert read_summary(tmp_path / "run")["task"] == "smoothed"
    assert f"task: {task}:Smoothed\n" in (tmp_path / "run" / "config.yaml").read_text()  # as FILE.py:Class ran it
    importer = tmp_path / "importer.py"
    importer.write_text(f"import sys\nsys.path.insert(0, {str(files['root'])!r})\nfrom smoothing import Smoothed\n")
    assert run_cli_error(capsys, ["--task", str(importer), *base, "--output-dir", str(tmp_path / "out")]) == (
        f"train.py: error: --task {importer}: the file defines no task class (class Name(anytrain.Task)); write "
        f"one, or name a class it imports as {importer}:Class"
    )
    several = tmp_path / "several.py"
    several.write_text(TASK + '\n\nclass Other(Smoothed):\n    name = "other"\n')
    assert run_cli_error(capsys, ["--task", str(several), *base, "--output-dir", str(tmp_path / "out")]) == (
        f"train.py: error: --task {several}: the file defines 2 task classes (Smoothed, Other); name one as "
        f"{several}:Class (--task {several}:Smoothed)"
    )
    assert not (tmp_path / "out").exists()


def variant(tmp_path: Path, old: str, new: str, task: str = TASK) -> Path:
    """The task above (or `task`) with one line changed, in a file of its own."""
    assert old in task
    path = tmp_path / f"variant_{len(list(tmp_path.glob('variant_*')))}.py"
    path.write_text(task.replace(old, new))
    return path


LOSS = 'return F.cross_entropy(outputs, targets, label_smoothing=self.cfg.section("smoothed").smoothing)'
STEP = "return (losses * (running / running.mean()).float()[targets]).mean()"


def test_a_bad_loss_of_an_own_task_is_blamed_on_the_task_not_the_model(files, tmp_path, capsys):
    """With the default step, its loss non-scalar or NaN on the batch of 2; with its own step, that step non-scalar or
    NaN on its first 2 training rows, checked at start (issue 46: the start-up check runs the task's own step): each
    one line before any step or output, naming --task FILE.py:Class's loss or train_step, never --model."""
    run = ["--dataset", str(files["table"]), "--model", "mlp", "--hidden-sizes", "8", "--epochs", "1"]
    run += ["--log-every-steps", "1", "--no-progress", "--no-plot", "--output-dir", str(tmp_path / "out")]
    plain = default_step(TASK)
    vector = variant(tmp_path, LOSS, LOSS.replace("smoothing)", "smoothing, reduction='none')"), plain)
    err = run_cli_error(capsys, ["--task", f"{vector}:Smoothed", *run])
    assert err == f"train.py: error: --task {vector}:Smoothed's loss: the loss must be a scalar float tensor; got (2,)"
    nan = variant(tmp_path, LOSS, LOSS.replace("return ", "return float('nan') * "), plain)
    err = run_cli_error(capsys, ["--task", f"{nan}:Smoothed", *run])
    assert err == f"train.py: error: --task {nan}:Smoothed's loss: the loss on a batch of 2 is nan before any training"
    assert not (tmp_path / "out").exists()
    step = variant(tmp_path, STEP, STEP.removesuffix(".mean()"))
    err = run_cli_error(capsys, ["--task", f"{step}:Smoothed", *run, "--batch-size", "16"])
    assert err == (
        f"train.py: error: --task {step}:Smoothed's train_step returned a torch.float32 tensor of shape (2,), not "
        "the batch's loss (a scalar float tensor)"
    )
    nan_step = variant(tmp_path, STEP, STEP.replace("return ", "return float('nan') * "))
    err = run_cli_error(capsys, ["--task", f"{nan_step}:Smoothed", *run, "--overwrite"])
    assert err == (
        f"train.py: error: --task {nan_step}:Smoothed's train_step: the loss on 2 training rows is nan before any "
        "training"
    )
    assert not any((tmp_path / "out" / name).exists() for name in ("config.yaml", "metrics.jsonl", "summary.json"))


def test_an_own_task_named_as_a_registry_task_is_refused_in_one_line(files, tmp_path, capsys):
    """name = "classify" would make summary.json's task say the registry's classify trained."""
    clash = variant(tmp_path, 'name = "smoothed"', 'name = "classify"')
    out = tmp_path / "out"
    err = run_cli_error(
        capsys, ["--task", f"{clash}:Smoothed", "--dataset", str(files["table"]), "--output-dir", str(out)]
    )
    assert err == (
        f"train.py: error: --task {clash}:Smoothed: Smoothed is named 'classify', a task of the registry's; pick "
        'another name (name = "my_classify"): summary.json and the start-up line name the task by it'
    )
    assert not out.exists()


def test_the_start_up_check_runs_the_tasks_own_step_and_leaves_no_trace(files, one, tmp_path, monkeypatch):
    """Issue 46: a task that owns its step is checked at start by that step, on its first 2 training rows, before
    step 1; its kept state (the running class losses), the random generators and the weights are as they were, so the
    run equals one without the check bit for bit."""
    from anytrain import trainer
    from anytrain.tasks import base

    calls = []
    checked = base.check_step
    monkeypatch.setattr(
        trainer, "check_step", lambda task, ctx: calls.append(len(task.data.train)) or checked(task, ctx)
    )
    main([*args(files, 32), "--output-dir", str(tmp_path / "checked")])
    assert calls == [512]  # once, on the training split (512 rows)
    monkeypatch.setattr(trainer, "check_step", lambda task, ctx: None)
    main([*args(files, 32), "--output-dir", str(tmp_path / "unchecked")])
    checked_run, unchecked = (load_model(tmp_path / k).state_dict() for k in ("checked", "unchecked"))
    assert max_abs_diff(checked_run, unchecked) == 0.0
    assert max_abs_diff(load_model(one).state_dict(), checked_run) == 0.0  # the module's run: checked too
