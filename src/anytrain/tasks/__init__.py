"""The tasks, one module each (a folder where a task has its own data preparation), and the registry: one line
per task.

    classify     classify.py     class ids; cross-entropy; accuracy (tables, images, streams, text)
    regress      regress.py      numeric targets, standardised; MSE or huber; RMSE, MAE, R²
    multilabel   multilabel/     multi-hot targets; BCE; micro/macro F1, exact match
    lm           lm.py           token windows; next-token cross-entropy; perplexity
    hf:classify  hf_text.py      a transformers sequence classifier on text
    hf:lm        hf_lm.py        a transformers causal LM, token-weighted loss
    hf:tag       hf_tag/         a transformers token classifier on tagged words; entity P/R/F1
    hf:mlm       hf_mlm/         a transformers masked LM on your text (domain adaptation); perplexity
    hf:seq2seq   hf_seq2seq/     a transformers encoder-decoder on source and target texts; exact match, BLEU
    hf:sft       hf_sft/         a transformers causal LM on chats (loss on the answers); exact match by generation
    hf:dpo       dpo/            a transformers causal LM on preference pairs: DPO, IPO, SimPO, ORPO; reward accuracy
    hf:kto       kto/            a transformers causal LM on unpaired preferences: KTO, APO-zero; reward margin, KL
    hf:reward    reward/         a transformers sequence classifier, one output, on preference pairs; pairwise accuracy
    hf:grpo      grpo/           a transformers causal LM on prompts, rewarded by functions: GRPO, DAPO, GSPO; reward
    hf:distill   distill/        a transformers causal LM on prompts, taught a teacher's distributions on its own
                                 completions (generalized JSD; --task distill only); divergence
    hf:classify-images  hf_image/    a transformers vision model with its image processor (--task classify on images)

A task subclasses contract.Task (the enforced contract: each class is checked here, once). The registry is
the only list of tasks: its order is the order in which `--task auto` asks each task whether it recognises the
data (its `detect`); settle.py picks the line. Your own task is `--task FILE.py:Class`, `FILE.py` (its one task
class) or `module:Class`.
Adding a task is its module (or folder) plus its line here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from ..config import HELP, HF_PREFIX, TASK_RESOLVERS, ConfigError, TrainConfig, add_section, restore_shared

if TYPE_CHECKING:  # the registry stays light: `--help` and bad flags answer without importing torch
    from .contract import Task


@dataclass(frozen=True)
class Line:
    """One task of the registry: its --task name, its class ("module:Class" in this package, imported when a run
    needs it) and, where it declares options, their dataclass ("module:Class" in a module that imports no torch)."""

    name: str
    cls: str
    options: str = ""


# key -> line, in the order `--task auto` asks them; "hf:" keys train a transformers model (--model hf:...)
REGISTRY: dict[str, Line] = {
    "lm": Line("lm", "lm:LanguageModel"),
    "hf:lm": Line("lm", "hf_lm:HFCausalLM"),
    "hf:kto": Line("kto", "kto.task:KahnemanTversky", "kto.options:KTOOptions"),  # before sft: prompt, completion
    "hf:sft": Line("sft", "hf_sft:SupervisedFineTuning"),
    "hf:dpo": Line("dpo", "dpo.task:DirectPreference", "dpo.options:DPOOptions"),
    "hf:reward": Line("reward", "reward.task:RewardModel"),
    "hf:grpo": Line("grpo", "grpo.task:GroupRelative", "grpo.options:GRPOOptions"),
    "hf:distill": Line("distill", "distill.task:OnPolicyDistillation", "distill.options:DistillOptions"),
    "multilabel": Line("multilabel", "multilabel.task:MultiLabel", "multilabel.options:MultiLabelOptions"),
    "regress": Line("regress", "regress:Regression"),
    "classify": Line("classify", "classify:Classification"),
    "hf:classify-images": Line("classify", "hf_image:HFImageClassification"),
    "hf:classify": Line("classify", "hf_text:HFClassification"),
    "hf:tag": Line("tag", "hf_tag:TokenClassification"),
    "hf:mlm": Line("mlm", "hf_mlm:MaskedLM"),
    "hf:seq2seq": Line("seq2seq", "hf_seq2seq:Seq2Seq"),
}
META_KEY = "task_module"  # the registry line of a run (or its FILE.py:Class), saved with its weights
HF = HF_PREFIX  # the registry keys of the tasks that train a transformers model
OWN_CLASSES: dict[str, type[Task]] = {}  # FILE.py:Class -> the class given to anytrain.train(task=...)


def _attr(spec: str):
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), attr)


@cache
def line_class(key: str) -> type[Task]:
    """A registry line's class, imported and checked against the contract (once)."""
    from .contract import check

    line, cls = REGISTRY[key], _attr(REGISTRY[key].cls)
    check(cls, f"--task {key}")
    if cls.name != line.name:
        raise TypeError(f"registry line {key}: {line.cls} trains --task {cls.name}, the line says {line.name}")
    return cls


def classes() -> dict[str, type[Task]]:
    """Every line's class, in the registry's order."""
    return {key: line_class(key) for key in REGISTRY}


def is_own(value: str) -> bool:
    """A --task value that names your own class (FILE.py:Class, FILE.py, module:Class) rather than a registry task."""
    return (":" in value or value.endswith(".py")) and not value.startswith(HF)


def own_spec(value: str) -> str:
    """An own task's --task value with its class: FILE.py alone names the one Task subclass the file defines
    (classes it imports do not count); a file that defines none or several is one line naming them."""
    if ":" in value:
        return value
    from ..usermodel import import_source
    from .contract import Task

    module = import_source(value, value, "--task")
    defined = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, Task)]
    found = list(dict.fromkeys(v.__name__ for v in defined if v.__module__ == module.__name__))
    if len(found) == 1:
        return f"{value}:{found[0]}"
    if not found:
        raise ConfigError(
            f"--task {value}: the file defines no task class (class Name(anytrain.Task)); write one, or name a "
            f"class it imports as {value}:Class"
        )
    raise ConfigError(
        f"--task {value}: the file defines {len(found)} task classes ({', '.join(found)}); name one as "
        f"{value}:Class (--task {value}:{found[0]})"
    )


def own_task(value: str) -> type[Task]:
    """Your task class, imported and checked against the contract; its options become a config section. Its name
    must not be a registry task's: summary.json's `task` would not say which trained."""
    from ..usermodel import import_attr
    from .contract import check

    spec = own_spec(value)
    cls = OWN_CLASSES.get(spec) or import_attr(spec, "--task")
    check(cls, f"--task {spec}")
    if isinstance(cls.name, str) and cls.name in names():
        raise ConfigError(
            f"--task {spec}: {cls.__name__} is named '{cls.name}', a task of the registry's; pick another name "
            f'(name = "my_{cls.name}"): summary.json and the start-up line name the task by it'
        )
    if cls.options is not None:
        add_section(value, cls.name, cls.options)
    return cls


def task_class(key: str) -> type[Task]:
    """The class of a registry line or of your own task."""
    return own_task(key) if is_own(key) else line_class(key)


def make_task(cfg: TrainConfig, key: str, run=None) -> Task:
    """The task for a settled config (settle.settle gives the key), told where it runs (contract.RunFacts; None: one
    process on the CPU, as predict and sample run)."""
    task = task_class(key)(cfg)
    task.key = key
    if run is not None:
        task.run = run
    return task


def task_of_run(cfg: TrainConfig, meta: dict) -> Task:
    """The task a finished run trained, from its saved config and weights' metadata. An own task's file must
    still be where the run found it: one line says where it was when it is not."""
    key = meta.get(META_KEY) or (f"{HF}{cfg.data.task}" if cfg.model.name.startswith(HF) else cfg.data.task)
    if is_own(key):
        try:
            own_task(key)
        except ConfigError as err:
            raise ConfigError(
                f"run_dir: the run trained --task {key}, which cannot be loaded now ({err}); put the file back, or "
                "run from the folder it was started in"
            ) from None
    return make_task(cfg, key)


def names() -> list[str]:
    """The tasks of the registry, by name, in its order."""
    return list(dict.fromkeys(line.name for line in REGISTRY.values()))


def _resolve(value: str) -> None:
    """config/'s hook: the options of the task a --task value names, registered before options are read. An own
    task that cannot be imported is said once, by settle, with the option's name."""
    if is_own(value):
        try:
            own_task(value)
        except ConfigError:
            pass
        return
    restore_shared()  # a registry task's run: its options back, if an own task's had set them aside


def _registry_sections() -> None:
    """The options of the registry's tasks that declare some (a torch-free module beside the task): sections of
    every config, so that a run whose task --task auto picks takes its flags too; config.yaml holds the run's."""
    for line in REGISTRY.values():
        if line.options:
            add_section(line.name, line.name, _attr(line.options), shared=True)


def _task_help() -> str:
    plain = [line.name for key, line in REGISTRY.items() if not key.startswith(HF)]
    transformers = [line.name for key, line in REGISTRY.items() if key.startswith(HF)]
    return (
        f"; the registry: {', '.join(dict.fromkeys(plain))}, and with a transformers model (--model hf:...) "
        f"{', '.join(dict.fromkeys(transformers))}"
    )


_registry_sections()
TASK_RESOLVERS.append(_resolve)
HELP["task"] = _task_help
