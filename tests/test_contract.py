"""The house rules that keep a new task one module: every registered task passes the enforced contract
(tasks/contract.py Task), no source file outside tasks/ names a task, the package has no import cycles,
config/ reads no data and data/ never reaches up into tasks/, and the config is frozen once made (a settled
task is a new config)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from anytrain.config import SECTIONS, ConfigError, TrainConfig
from anytrain.tasks import REGISTRY, classes, make_task
from anytrain.tasks.base import owns_step
from anytrain.tasks.classify import Classification
from anytrain.tasks.contract import CAPABILITIES, Task, check

REQUIRED = sorted(Task.__abstractmethods__)

SRC = Path(__file__).resolve().parents[1] / "src" / "anytrain"


def test_every_registered_task_passes_the_enforced_contract():
    """Each line of the registry is a contract.Task subclass with every required method, its capabilities
    backed by their methods, and its name in its key; mypy (make lint) checks the signatures."""
    for key, cls in classes().items():
        check(cls, f"--task {key}")
        task = make_task(TrainConfig(), key)
        assert isinstance(task, Task) and task.key == key
        assert task.name == key.removeprefix("hf:").split("-")[0], key
        for capability in task.offers:
            assert all(callable(getattr(task, m)) for m in CAPABILITIES[capability]), (key, capability)


def test_a_task_missing_a_required_method_or_a_capability_is_refused_in_one_line():
    class Smooth(Classification):
        name = "smooth"

    given = {m: lambda *a: None for m in [*REQUIRED, "example_targets", "per_sample"]}
    del_loss = type("NoLoss", (Task,), {"name": "x", **given})
    with pytest.raises(ConfigError, match=r"^--task f.py:NoLoss: NoLoss does not define the required method loss$"):
        check(del_loss, "--task f.py:NoLoss")
    own_step = type("OwnStep", (Task,), {"name": "x", **{m: lambda *a: None for m in [*REQUIRED, "train_step"]}})
    with pytest.raises(ConfigError, match=r"OwnStep does not define the required method per_sample$"):
        check(own_step, "--task f.py:OwnStep")  # its own step: neither loss nor example_targets, but an evaluation
    own_eval = type("OwnEval", (own_step,), {"eval_batch": lambda *a: None})
    check(own_eval, "--task f.py:OwnEval")  # its own evaluation too: no per_sample
    check(Smooth, "--task f.py:Smooth")
    Smooth.offers = frozenset({"predict", "sample"})
    with pytest.raises(ConfigError, match=r"Smooth offers sample but does not define sample$"):
        check(Smooth, "--task f.py:Smooth")
    Smooth.offers = frozenset({"teleport"})
    with pytest.raises(ConfigError, match=r"Smooth offers teleport \(known: predict, sample"):
        check(Smooth, "--task f.py:Smooth")
    with pytest.raises(ConfigError, match="is not a task class"):
        check(dict, "--task f.py:dict")


def test_a_task_may_have_no_evaluation_loss_but_must_declare_its_headline():
    """goals without "loss" (grpo's: it evaluates by generating) is a task without an evaluation loss; a headline its
    goals do not name is refused in one line. evaluate takes metrics that fit the goals: a task with a loss returns
    it, one without returns every metric it declares (the best weights' among them), and none returns an undeclared
    one; --best-metric loss is refused for grpo."""
    from anytrain.best import HIGHER, LOWER
    from anytrain.tasks.base import metrics_fit
    from anytrain.tasks.settle import best_metric

    class Generates(Classification):
        name = "generates"
        goals = {"reward": HIGHER, "greedy_reward": HIGHER}
        headline = "reward"

    check(Generates, "--task f.py:Generates")
    assert "loss" not in classes()["hf:grpo"].goals and classes()["hf:grpo"].headline == "reward"
    assert all("loss" in cls.goals for key, cls in classes().items() if key != "hf:grpo")
    with pytest.raises(ConfigError, match=r"^--best-metric: --task grpo logs reward, greedy_reward on validation, not"):
        best_metric(TrainConfig(best_metric="loss"), classes()["hf:grpo"])
    Generates.headline = "loss"
    with pytest.raises(ConfigError, match=r"^--task f.py:Generates: Generates.goals must name its headline 'loss'$"):
        check(Generates, "--task f.py:Generates")
    no_loss, with_loss = Generates, type("Scores", (), {"goals": {"loss": LOWER, "accuracy": HIGHER}})
    assert metrics_fit({"reward": 0.5, "greedy_reward": 1.0}, no_loss)
    assert not metrics_fit({"reward": 0.5}, no_loss)  # greedy_reward missing: --best-metric could not find it
    assert not metrics_fit({"loss": -0.5, "reward": 0.5, "greedy_reward": 1.0}, no_loss)  # a loss it did not declare
    assert metrics_fit({"loss": 0.3, "accuracy": 0.9}, with_loss) and metrics_fit({"loss": 0.3}, with_loss)
    assert not metrics_fit({"accuracy": 0.9}, with_loss)


def test_no_refusal_stubs_a_capability_is_refused_from_its_declaration():
    """predict on a run whose task does not offer it: one line from the declaration, before anything is read."""
    from anytrain.tasks.contract import predictor, sampler

    lm, mlm = make_task(TrainConfig(), "lm"), make_task(TrainConfig(), "hf:mlm")
    with pytest.raises(ConfigError, match=r"^run_dir: --task lm has no predictions for rows; use `anytrain sample"):
        predictor(lm, "run_dir")
    with pytest.raises(ConfigError, match=r"^run_dir: --task mlm has no predictions for rows; its run_dir/hf"):
        predictor(mlm, "run_dir")
    with pytest.raises(ConfigError, match=r"^run_dir: --task classify does not sample text$"):
        sampler(make_task(TrainConfig(), "classify"), "run_dir")
    for cls in classes().values():
        for method in ("predict_inputs", "predictions", "sample", "export"):
            body = getattr(cls, method, None)
            if body is not None and not getattr(body, "__isabstractmethod__", False):
                assert "raise ConfigError" not in inspect.getsource(body).split("\n", 2)[-1][:200] or method in (
                    "sample",
                    "predict_inputs",
                ), (cls, method)


def string_constants(node) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [v for e in node.elts for v in string_constants(e)]
    return []


def test_outside_tasks_no_source_file_branches_on_a_task_name():
    """The registry is the only list of tasks: no comparison, dict key or call argument names a task outside tasks/."""
    names = {line.name for line in REGISTRY.values()} | set(REGISTRY)
    found = []
    for path in SRC.rglob("*.py"):
        if "tasks" in path.relative_to(SRC).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            values = []
            if isinstance(node, ast.Compare):
                values = [v for side in (node.left, *node.comparators) for v in string_constants(side)]
            elif isinstance(node, ast.Dict):
                values = [v for k in node.keys if k is not None for v in string_constants(k)]
            elif isinstance(node, ast.Call):
                values = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            found += [f"{path.name}:{node.lineno} {v}" for v in values if v in names]
    assert not found, found


def imports(path: Path) -> list[str]:
    """The modules of this package a file imports, at the top or inside functions, as dotted names."""
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    package = parts[:-1] if path.name != "__init__.py" else parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(package if path.name != "__init__.py" else parts[:-1])
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
            found.append(target)
            found += [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [n for n in names if n and n.split(".")[0] in ("anytrain", "datasets")]
    return found


def module_graph() -> dict[str, set[str]]:
    files = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        files[".".join(parts[:-1] if path.name == "__init__.py" else parts)] = path
    return {name: {m for m in imports(path) if m in files and m != name} for name, path in files.items()}


def test_the_package_has_no_import_cycles():
    graph, cycles = module_graph(), []

    def visit(node, trail):
        for nxt in graph[node]:
            if nxt in trail:
                cycles.append(trail[trail.index(nxt) :] + [nxt])
            elif nxt not in done:
                visit(nxt, trail + [nxt])
        done.add(node)

    done: set[str] = set()
    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    assert not cycles, " | ".join(" -> ".join(c) for c in cycles)


def test_the_layers_point_one_way():
    graph = module_graph()
    config = {m for path in (SRC / "config").glob("*.py") for m in imports(path)}
    assert not any(m.startswith(("anytrain.data", "datasets")) for m in config), config  # no data, no sniffing
    for name, targets in graph.items():
        if name.startswith("anytrain.data"):
            assert not any(t.startswith("anytrain.tasks") for t in targets), (name, targets)
        assert "anytrain.trainer" not in targets or name in ("anytrain.api", "anytrain.cli"), name


def test_the_config_is_frozen_and_a_settled_task_is_a_new_config():
    from anytrain.tasks.settle import settle

    cfg = TrainConfig(lr=0.01)
    with pytest.raises(AttributeError, match="frozen"):
        cfg.lr = 1.0
    with pytest.raises(AttributeError):
        cfg.optim.lr = 1.0  # noqa: B010 - the sections are frozen dataclasses too
    settled = settle(cfg)
    assert cfg.data.task == "auto" and settled.cfg.data.task == "classify" and settled.key == "classify"
    assert (
        settled.cfg.given == cfg.given | {"task", "best_metric"}
        and "lr" in settled.cfg.given
        and "seed" not in cfg.given
    )
    assert settled.reason == "auto"


def test_the_task_is_decided_in_one_place():
    """No module but tasks/settle.py chooses a task (assigns it, or applies the auto rule)."""
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        if path.name in ("settle.py", "targets.py"):  # the rule, and the labels' part of it
            continue
        assert "task_from_labels" not in text and "task_from_options" not in text, path
        assert not re.search(r"\.data\.task\s*=(?!=)", text) and "replace(task=" not in text, path


def test_the_guide_lists_every_task_with_its_module_and_lines():
    """In the fast suite (the table drifts with any edit of a task; a launch test let it slip past make check)."""
    import importlib.util

    root = SRC.parents[1]
    spec = importlib.util.spec_from_file_location("task_table", root / "scripts" / "task_table.py")
    assert spec is not None and spec.loader is not None
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    rows = table.rows()
    assert len(rows) == len(REGISTRY) and "\n".join(rows) in (root / "docs" / "guide.md").read_text(), (
        "the guide's task table is stale: python scripts/task_table.py --write"
    )


def test_the_guide_names_every_option_in_its_section():
    """docs/guide.md's 'Which option is in which section' table: each section's row names exactly its fields."""
    import dataclasses

    guide, cfg = (SRC.parents[1] / "docs" / "guide.md").read_text(), TrainConfig()
    for section in SECTIONS:  # the five, and the registry's task sections (tasks/__init__.py)
        row = re.search(rf"^\| `{section}` \| (.*) \|$", guide, re.M)
        assert row, f"no row for the {section} section"
        listed = {re.sub(r" \(.*\)$", "", name.strip()) for name in row.group(1).split(",")}
        fields = {f.name for f in dataclasses.fields(getattr(cfg, section))}
        assert listed == fields, (section, listed ^ fields)


def test_a_registry_tasks_own_options_are_its_section_without_config_py(tmp_path):
    """multilabel declares --threshold beside itself (tasks/multilabel/options.py): it is a flag in --help, a YAML
    section, part of config.yaml and of the resume check, and config/ does not name it."""
    from anytrain.checkpoint import check_compatible
    from anytrain.config import build_parser, parse_config, saved_options

    named = re.compile(r"\bthreshold\b\s*[:=]|[\"']threshold[\"']")  # a field or key, not glibc's mmap threshold
    assert not any(named.search(path.read_text()) for path in (SRC / "config").glob("*.py"))
    assert "--threshold" in build_parser().format_help().split("multilabel options:")[1]
    (tmp_path / "c.yaml").write_text("multilabel:\n  threshold: 0.3\n")
    assert parse_config(["--config", str(tmp_path / "c.yaml")]).section("multilabel").threshold == 0.3
    assert TrainConfig(task="multilabel", threshold=0.3).to_dict()["multilabel"] == {"threshold": 0.3}
    assert "multilabel" not in TrainConfig(task="classify").to_dict()  # config.yaml holds the run's task's only
    saved = TrainConfig(task="multilabel").to_dict()
    with pytest.raises(ConfigError, match=r"different config \(threshold: 0.5 -> 0.3\)"):
        check_compatible(saved, TrainConfig(task="multilabel", threshold=0.3), Path("ckpt"))
    assert saved_options({"eval": {"threshold": 0.3}})["threshold"] == 0.3  # a run saved before it moved


def test_no_task_re_points_a_parents_method():
    """A task builds on others through super() and small functions, never by assigning another class's method
    (`rates = BaseTask.rates` picked which parent of a diamond won)."""
    for key, cls in classes().items():
        for klass in cls.__mro__:
            if not klass.__module__.startswith("anytrain.tasks"):
                continue
            for name, value in vars(klass).items():
                function = getattr(value, "__func__", value)
                owner = getattr(function, "__qualname__", "").split(".")[0]
                if inspect.isfunction(function) and owner != klass.__name__ and "<locals>" not in owner:
                    raise AssertionError(f"{key}: {klass.__name__}.{name} is {function.__qualname__}")


def test_tasks_and_data_read_no_accelerate_global_state_nor_the_environment():
    """Where a task runs (processes and those on this machine, rank, device, precision, sharding) is given to it before
    its data is read (task.run, contract.RunFacts, made from the accelerator where the run starts); nothing under
    tasks/ or data/ reaches for accelerate's global state or the launcher's environment (ast: names and attributes,
    not text)."""
    found = []
    for folder in ("tasks", "data"):
        for path in sorted((SRC / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module, *(a.name for a in node.names)]
                elif isinstance(node, ast.Attribute):
                    names = [node.attr] + ([f"os.{node.attr}"] if isinstance(node.value, ast.Name) else [])
                elif isinstance(node, ast.Name):
                    names = [node.id]
                bad = {"accelerate.state", "PartialState", "AcceleratorState", "os.environ", "os.getenv"} & set(names)
                where = f"{path.relative_to(SRC)}:{node.lineno if bad else 0}"
                found += [f"{where} {n}" for n in sorted(bad) if not where.startswith("tasks/contract.py")]
    assert not found, found  # contract.py's RunFacts.of reads LOCAL_WORLD_SIZE: the launcher's, made a run fact


def test_a_task_knows_where_it_runs_before_its_data_is_read(monkeypatch):
    from anytrain.tasks import settle as settling
    from anytrain.tasks.contract import RunFacts

    seen = []
    monkeypatch.setattr(Classification, "load_data", lambda self, given=None: seen.append(self.run))
    facts = RunFacts(processes=2, rank=1, device="cuda:1", precision="bf16")
    settling.load(TrainConfig().replace(task="classify"), None, facts)
    assert seen == [facts] and seen[0].pad_multiple == 8 and not seen[0].main
    assert make_task(TrainConfig(), "classify").run == RunFacts()  # outside a launch: one process on the CPU


BASES = ("__init__", "contract", "base", "settle", "transformers", "labelled", "causal_lm")  # tasks/: not tasks


def task_unit(module: str) -> str | None:
    """The task a module of anytrain.tasks belongs to (its top-level module or folder), None for a base."""
    parts = module.split(".")
    if parts[:2] != ["anytrain", "tasks"]:
        return None
    unit = parts[2] if len(parts) > 2 else "__init__"
    return None if unit in BASES else unit


def test_no_task_imports_another_task():
    """What two tasks share lives in a base (BASES: causal_lm/ for the causal LMs, labelled.py for the labelled
    tasks, contract, base, settle, transformers): on the import graph (ast), no module of a task imports a module
    of another task."""
    crossings = [
        f"{name} -> {target}"
        for name, targets in sorted(module_graph().items())
        for target in sorted(targets)
        if task_unit(name) and task_unit(target) and task_unit(target) != task_unit(name)
    ]
    assert not crossings, crossings


def test_the_causal_lm_methods_stand_side_by_side_on_one_base():
    """hf:lm, sft, dpo, grpo and distill stand on causal_lm.task.CausalLM, none on another (at most one base between:
    NextTokenLoss for the two that train on the next token, causal_lm.sampled's SampledCausalLM for the two that
    sample their own completions); each but distill (which loads its teacher beside the model) builds its model with
    the base's build_model; reward stands on the classifiers' Transformers. A transformers model is generated from
    in two functions at most (the causal-LM base's and seq2seq's), and dpo, grpo and distill, which own their step,
    keep no default-step members (loss and example_targets; dpo's loss is its formula)."""
    from anytrain.tasks.causal_lm.task import CausalLM
    from anytrain.tasks.transformers import Transformers

    registry = classes()
    between = ([], ["NextTokenLoss"], ["SampledCausalLM"])
    for key in ("hf:lm", "hf:sft", "hf:dpo", "hf:grpo", "hf:distill"):
        cls = registry[key]
        ours = [c for c in cls.__mro__[1:] if issubclass(c, Task) and c not in (Task, CausalLM)]
        assert CausalLM in cls.__mro__ and [c.__name__ for c in ours] in between, (key, ours)
        assert cls.build_model is CausalLM.build_model or key == "hf:distill", key
    reward = registry["hf:reward"]
    assert issubclass(reward, Transformers) and not issubclass(reward, CausalLM)
    for key, kept in (("hf:dpo", {"loss"}), ("hf:grpo", set()), ("hf:distill", set())):
        cls = registry[key]
        assert (
            owns_step(cls)
            and {m for m in ("loss", "example_targets") if getattr(cls, m) is not getattr(Task, m)} <= kept
        ), key
    callers = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                calls = [c for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)]
                on_models = [c for c in calls if not (isinstance(c.func.value, ast.Name) and c.func.value.id == "self")]
                if any(c.func.attr == "generate" for c in on_models):
                    callers.append(f"{path.relative_to(SRC)}:{node.name}")
    model_calls = [c for c in callers if not c.startswith("gpt.py")]  # gpt.py: the built-in GPT, not transformers
    assert model_calls == ["tasks/causal_lm/generation.py:generate", "tasks/hf_seq2seq/__init__.py:generate"], callers


def test_no_model_is_given_an_assigned_forward():
    """Log-probabilities and the fused loss come from a module's own forward (causal_lm/head.py: CausalLMHead), never
    from a forward assigned to a model: the one `.forward =` in src is scenario.py's precision wrapper, which does
    what accelerate's own prepare does."""
    assigned = [
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path in sorted(SRC.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and target.attr == "forward"
    ]
    assert [a.split(":")[0] for a in assigned] == ["scenario.py"], assigned


def test_the_run_facts_say_the_local_processes_and_whether_weights_are_sharded(monkeypatch):
    """RunFacts.of: the launcher's processes on this machine (LOCAL_WORLD_SIZE, which image loaders size their workers
    by) and whether the run shards its weights (FSDP, DeepSpeed: the fused output layer then stays the model's own)."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from anytrain.tasks.contract import RunFacts

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    fake = dict(num_processes=6, process_index=4, device="cuda:1", mixed_precision="bf16", print=print)
    facts = RunFacts.of(SimpleNamespace(**fake, distributed_type=DistributedType.FSDP))  # type: ignore[arg-type]
    assert (facts.processes, facts.local_processes, facts.rank, facts.shards) == (6, 3, 4, True)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    facts = RunFacts.of(SimpleNamespace(**fake, distributed_type=DistributedType.MULTI_GPU))  # type: ignore[arg-type]
    assert (facts.local_processes, facts.shards) == (1, False)
