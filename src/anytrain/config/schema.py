"""The options of a run, as one registry: the five sections and the sections tasks add (their own options), every
option by name (`OPTIONS`, derived from the fields' facts), and `TrainConfig`, a frozen config of them all."""

from __future__ import annotations

import dataclasses
import typing

from .facts import ConfigError, Option
from .sections import DataConfig, EvalConfig, ModelConfig, OptimConfig, RunConfig

BASE_SECTIONS = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "eval": EvalConfig, "run": RunConfig}
SECTIONS: dict[str, type] = dict(BASE_SECTIONS)  # + the sections of tasks that declare options (add_section)
TASK_SECTIONS: dict[str, str] = {}  # a --task value (a name, or FILE.py:Class) -> its own section
SHARED_SECTIONS: set[str] = set()  # the registry's task sections: in every config (own tasks' only in their runs)
SET_ASIDE: dict[str, tuple[int, type]] = {}  # registry sections (place, class) whose option names an own task took
TASK_RESOLVERS: list[typing.Callable[[str], None]] = []  # register the section of a --task value (tasks/ adds one)
HELP: dict[str, typing.Callable[[], str]] = {}  # option name -> more help, built where the facts live (the registry)


def _all_options() -> list[Option]:
    found = []
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            facts = dict(f.metadata)
            name = facts.pop("flag") or f.name
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            found.append(Option(name, section, f.name, hints[f.name], default, **facts))
    return found


def _options() -> dict[str, Option]:
    """Each option by name, its first section's (an option that registry tasks share: ALSO has the others)."""
    found: dict[str, Option] = {}
    for o in _all_options():
        found.setdefault(o.name, o)
    return found


def _also() -> dict[str, list[Option]]:
    """The option names that several registry tasks' sections declare (dpo's, kto's and distill's --beta; grpo's and
    distill's --temperature): one flag, which sets each section's field where it is given; each section keeps its own
    default, help and bounds, and the run's task's is the one its value, --help and checks read."""
    found: dict[str, list[Option]] = {}
    for o in _all_options():
        found.setdefault(o.name, []).append(o)
    return {name: options[1:] for name, options in found.items() if len(options) > 1}


OPTIONS = _options()  # by option name, in section order
ALSO = _also()  # an option name -> its other sections' options (registry tasks that share a flag)
ALIASES = {alias: o.name for o in OPTIONS.values() for alias in o.aliases}  # an earlier name -> the option's name


def add_section(task: str, name: str, cls: type, shared: bool = False, at: int | None = None) -> None:
    """A task's own options (a frozen dataclass of option() fields) as section `name`: its flags, YAML section,
    checks and resume check come with it. `task` is the --task value that trains with it; `shared`: a registry
    task's, part of every config (else part of its own runs' only). An own task's option may share a registry
    task's name (grpo's --temperature, a distiller's --temperature): that registry section steps aside while the
    own task's runs are configured, and comes back for the next run of a registry task (restore_shared), `at`
    its place among the sections."""
    TASK_SECTIONS[task] = name
    if shared:
        SHARED_SECTIONS.add(name)
    if SECTIONS.get(name) is cls:
        return
    if name in BASE_SECTIONS or name in OPTIONS:
        raise ConfigError(f"--task {task}: its options section '{name}' is already an option or a section")
    yields = SHARED_SECTIONS - {name} if not shared else set(SECTIONS) - SHARED_SECTIONS - set(BASE_SECTIONS)
    # an own task's option that names a registry task's sets that section aside; registry tasks share a name
    order = list(SECTIONS)  # each section set aside keeps its place in the order before any stepped aside
    for other in [o for o in yields if o in SECTIONS and _flags(SECTIONS[o]) & _flags(cls)]:
        place = order.index(other)
        stepped_aside = SECTIONS.pop(other)
        if not shared:
            SET_ASIDE[other] = (place, stepped_aside)
    items = list(SECTIONS.items())
    items.insert(len(items) if at is None else at, (name, cls))
    SECTIONS.clear()
    SECTIONS.update(items)
    found = _options()
    clash = sorted(k for k, o in found.items() if o.section == name and k in OPTIONS and OPTIONS[k].section != name)
    clash = [k for k in clash if OPTIONS[k].section in SECTIONS]
    if shared:  # registry tasks may share an option name (ALSO) if both are theirs
        clash = [k for k in clash if OPTIONS[k].section not in SHARED_SECTIONS]
    if clash:
        del SECTIONS[name]
        raise ConfigError(
            f"--task {task}: its option '{clash[0]}' is already an option of section {OPTIONS[clash[0]].section}"
        )
    OPTIONS.clear()
    OPTIONS.update(found)
    ALSO.clear()
    ALSO.update(_also())
    ALIASES.update({alias: o.name for o in OPTIONS.values() for alias in o.aliases})


def restore_shared() -> None:
    """A registry task's run is configured next: the sections and options are the registry's again (own tasks'
    sections out, the registry sections their options set aside back in their places)."""
    own = [name for name in SECTIONS if name not in BASE_SECTIONS and name not in SHARED_SECTIONS]
    for name in own:
        del SECTIONS[name]
    if own:
        OPTIONS.clear()
        OPTIONS.update(_options())
        ALSO.clear()
        ALSO.update(_also())
    for name in sorted(SET_ASIDE, key=lambda n: SET_ASIDE[n][0]):
        task = next(t for t, section in TASK_SECTIONS.items() if section == name)
        place, cls = SET_ASIDE.pop(name)
        add_section(task, name, cls, shared=True, at=place)


def _values(section) -> dict:
    """{option name: value} of a section object (its fields' flag names)."""
    return {dict(f.metadata).get("flag") or f.name: getattr(section, f.name) for f in dataclasses.fields(section)}


def _flags(cls: type) -> set[str]:
    return {dict(f.metadata).get("flag") or f.name for f in dataclasses.fields(cls)}


def resolve_task(value: str) -> None:
    """Register the options of the task a --task value names (an own task's file is imported for them)."""
    for resolve in TASK_RESOLVERS:
        resolve(value)


def option_of(name: str, task: str | None) -> Option:
    """The option `name` as the run of `task` reads it: its section's, where several registry tasks share the name
    (ALSO), else the one."""
    own = TASK_SECTIONS.get(task or "")
    return next((o for o in ALSO.get(name, ()) if o.section == own), OPTIONS[name])


def section_fields(section: str) -> dict:
    """{field name or an alias of it: option name} of one section."""
    fields = {o.field: o.name for o in OPTIONS.values() if o.section == section}
    return {**{alias: name for alias, name in ALIASES.items() if OPTIONS[name].section == section}, **fields}


class TrainConfig:
    """All options, by section: `cfg.optim.lr`, `cfg.model.name`. Made from options by their flag
    names (`TrainConfig(lr=1e-3, model="gpt")`) and/or whole sections (`TrainConfig(optim={...})`).
    Frozen once made: a changed option (a settled --task, tasks/settle.py) is a new config, `replace()`.
    `given` names the options that were set rather than left at their defaults."""

    data: DataConfig
    model: ModelConfig
    optim: OptimConfig
    eval: EvalConfig
    run: RunConfig
    given: frozenset[str]
    sections: tuple[str, ...]

    def __init__(self, _given: frozenset[str] | None = None, **values):
        data = values.get("data")
        task = values.get("task", data.get("task") if isinstance(data, dict) else getattr(data, "task", None))
        resolve_task(task if isinstance(task, str) else "auto")  # an own task's options are known before they are read
        sections: dict[str, dict] = {name: {} for name in SECTIONS}
        given: set[str] = set()
        flags = {}
        for key, value in values.items():
            key = ALIASES.get(key, key)
            if key in SECTIONS and not (key == "model" and isinstance(value, str)):
                fields = (
                    dataclasses.asdict(value)
                    if dataclasses.is_dataclass(value) and not isinstance(value, type)
                    else value
                )
                sections[key].update(fields)
                given.update(section_fields(key)[f] for f in fields if f in section_fields(key))
            elif key in OPTIONS:
                flags[key] = value
                given.add(key)
            else:
                raise ConfigError(f"config: unknown option '{key}'")
        given = set(given if _given is None else _given)
        for key, value in flags.items():  # a shared name (ALSO) sets every section's, where it is given
            shared = ALSO.get(key, [])
            if shared and key not in given:
                continue  # each section its own default
            for o in [OPTIONS[key], *shared]:
                sections[o.section][o.field] = value
        for name, cls in SECTIONS.items():
            object.__setattr__(self, name, cls(**sections[name]))
        object.__setattr__(self, "given", frozenset(given))
        object.__setattr__(self, "sections", tuple(SECTIONS))  # its own, whatever registers later in this process

    def __setattr__(self, name, value):
        raise AttributeError(f"TrainConfig is frozen: use cfg.replace({name}=...) for a changed config")

    def get(self, name: str):
        """An option's value by its option name ('lr', 'model'); of a name registry tasks share, the run's task's."""
        o = option_of(name, self.data.task)
        if o.section not in self.sections:  # an own task's config, made while its option set that section aside
            return _values(getattr(self, TASK_SECTIONS[self.data.task]))[name]
        return getattr(getattr(self, o.section), o.field)

    def flat(self) -> dict:
        """{option name: value}, in section order: what flags and the resume check compare. The five sections,
        the registry's task sections, and your own task's section in its own runs only: another own task
        registered in the same process is not part of this config."""
        own = TASK_SECTIONS.get(self.data.task)
        kept = [name for name in self.sections if name in BASE_SECTIONS or name in SHARED_SECTIONS or name == own]
        found = {name: value for section in kept for name, value in _values(getattr(self, section)).items()}
        return {name: self.get(name) if name in ALSO else value for name, value in found.items()}

    def section(self, name: str):
        """A section by name: a task's own options, `cfg.section("distill").temperature`."""
        return getattr(self, name)

    def to_dict(self) -> dict:
        """The sectioned form, as config.yaml holds it: the five sections, and the options of the run's task."""
        own = TASK_SECTIONS.get(self.data.task)
        return {name: dataclasses.asdict(getattr(self, name)) for name in (*BASE_SECTIONS, *([own] if own else []))}

    def replace(self, **options) -> TrainConfig:
        """A new config with these options changed; the options given stay given."""
        return TrainConfig(_given=self.given | {ALIASES.get(k, k) for k in options}, **{**self.flat(), **options})

    def __eq__(self, other) -> bool:
        return isinstance(other, TrainConfig) and self.flat() == other.flat()

    def __repr__(self) -> str:
        return f"TrainConfig({', '.join(f'{k}={v!r}' for k, v in self.flat().items())})"
