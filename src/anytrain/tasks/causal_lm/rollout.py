"""The rollout engine of the causal-LM methods that sample their own completions (grpo, distill): a split's prompts
(prompt_rows.py) completed by the model, each `per_row` times, keyed (sampled) or greedy, with generate alone or, with
tools or an environment, as conversations of turns (turns.py), each group's prompt read once where the model allows
(`shared`, logprobs.shares_prompts). `Rollouts.load` imports the tools and the environment; `read` reads the
prompts, sized to the room the model's positions leave after --max-new-tokens, and checks that the chat template
shows the tools and parses their calls.

It reads these of the task's options: those of RolloutOptions (rollout_options.py: top_p, top_k, min_p,
repetition_penalty, tools, max_tool_calls, tool_timeout, generate_batch), and max_new_tokens, temperature and
environment, which each task declares as its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ...config import ConfigError, TrainConfig, first_line
from .environment import load_environment, made, methods
from .generation import Completions, PromptCache, Sampling, fitting, generate
from .prompt_rows import PROMPT, PromptRows, load_prompts
from .prompts import prompt_ids
from .tools import check_parses, check_renders_tools, load_tools, resolved, schema_of
from .turns import Conversation, Toolkit, converse


class Rollouts:
    """One run's rollout engine (module docstring): its prompts, tools, environment and sampling settings."""

    def __init__(self, cfg: TrainConfig, options: Any):
        self.cfg, self.o = cfg, options
        self.tools: list[Callable] = []  # --tools (load)
        self.environment: type | None = None  # --environment's class (load)
        self.tokenizer: Any = None
        self.stops: list[int] = []  # where a completion (a turn) stops (read)
        self.prompts: dict[str, PromptRows] = {}  # each split's (read)
        self.kit: Toolkit | None = None  # with tools or an environment: completions are conversations (read)
        self.room = (0, "")  # the most tokens a prompt may have, and why (read)
        self.known_schemas: dict[Callable, dict] = {}  # each tool function's schema, made once (schemas)
        self.shared: PromptCache | None = None  # how a group's prompt is read once (set at the run's start)

    def load(self) -> None:
        """--tools and --environment, imported and checked (ConfigError naming the option)."""
        self.tools = load_tools(self.o.tools)
        self.environment = load_environment(self.o.environment) if self.o.environment else None

    def read(self, tokenizer, positions: int, given, stops_for: Callable[[bool], list[int]]) -> tuple[str, bool]:
        """The prompts of every split for a model of `positions` positions, tools checked against the template;
        `stops_for(chats)` gives the stop ids once the prompts' form is known. (the source, whether they are chats)."""
        self.tokenizer = tokenizer
        if positions - self.o.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens {self.o.max_new_tokens}: the model has {positions} positions")
        schemas = self.schemas(self.probe_tools())
        if schemas:  # the template shows the tools and parses the calls
            check_renders_tools(tokenizer, "--tools" if self.tools else "--environment")
            check_parses(tokenizer, "--tools" if self.tools else "--environment")
        self.room = self.prompt_room(positions)
        self.prompts, source, chats = load_prompts(self.cfg, tokenizer, given, self.room, schemas)
        self.stops = stops_for(chats)
        if schemas:
            self.kit = Toolkit(tokenizer, self.stops, positions, self.o.max_tool_calls, self.o.tool_timeout,
                               self.o.generate_batch)  # fmt: skip
        return source, chats

    def limits(self) -> str | None:
        """The start-up line of a run with tools or an environment (None without): the calls a completion may make,
        where TRL sets no limit by default."""
        if self.kit is None:
            return None
        calls = self.kit.max_calls
        return (
            f"anytrain: tools: at most {calls} call{'s' * (calls != 1)} per completion (--max-tool-calls; TRL: no "
            "limit)"
        )

    def prompt_room(self, positions: int) -> tuple[int, str]:
        """The most tokens a prompt may have, and why: the model's positions less --max-new-tokens, or --max-length
        where it is given and smaller."""
        room = (positions - self.o.max_new_tokens, f"the model's {positions} positions less --max-new-tokens "
                f"{self.o.max_new_tokens}")  # fmt: skip
        if "max_length" in self.cfg.given and self.cfg.data.max_length < room[0]:
            return self.cfg.data.max_length, f"--max-length {self.cfg.data.max_length}"
        return room

    def complete(
        self, model: nn.Module, split: str, rows: list[int], per_row: int, keys: torch.Tensor | None
    ) -> tuple[Completions, list[Conversation] | None]:
        """Each row's prompt completed `per_row` times (keys: sampled; None: greedy); with tools or an environment,
        as conversations (turns.py), which are returned too."""
        if self.kit is None:
            prompts = [self.prompts[split].ids[r] for r in rows for _ in range(per_row)]
            chunk = self.o.generate_batch or fitting(model, prompts, self.sampling())
            return generate(model, prompts, keys, self.sampling(), chunk, self.shared), None
        talks = [self.conversation(split, r) for r in rows for _ in range(per_row)]
        return converse(model, talks, keys, self.sampling(), self.kit, self.shared), talks

    def sampling(self) -> Sampling:
        o = self.o
        return Sampling(o.max_new_tokens, tuple(self.stops), self.tokenizer.pad_token_id, o.temperature, o.top_p,
                        o.top_k, o.min_p, o.repetition_penalty)  # fmt: skip

    def probe_tools(self) -> list[Callable]:
        """Every completion's tools: --tools, then the environment's methods (of an instance made to read them)."""
        found = list(self.tools)
        if self.environment is not None:
            found += methods(made(self.environment, self.o.environment))
        return found

    def schemas(self, tools: list[Callable]) -> list[dict]:
        """The tools' JSON schemas, as the chat template shows them (each function's made once)."""
        for tool in tools:
            function = getattr(tool, "__func__", tool)  # an environment's method: its class's function
            if function not in self.known_schemas:
                self.known_schemas[function] = schema_of(tool, "--tools")
        return [self.known_schemas[getattr(tool, "__func__", tool)] for tool in tools]

    def conversation(self, split: str, row: int) -> Conversation:
        """A completion of the row's prompt: its tools and, with --environment, its own instance, reset with the
        row (a text it returns added to the last user message)."""
        source, tools, environment = self.prompts[split], list(self.tools), None
        prefix = source.ids[row]
        if self.environment is not None:
            environment = made(self.environment, self.o.environment)
            tools += methods(environment)
            where = f"--environment: row {row} of the {split} split"
            given = {PROMPT: source.prompts[row], **{k: v[row] for k, v in source.columns.items()}}
            seen = reset(environment, given, where)
            if isinstance(seen, str):
                prefix = self.shown(source.prompts[row], seen, where, tools)
            elif seen is not None:  # TRL adds a text to the prompt; anything else would be dropped unseen
                raise ConfigError(
                    f"{where}: {type(environment).__name__}.reset returned {type(seen).__name__} {seen!r:.40}, not a "
                    "text (str) to add to the prompt's last message, nor None"
                )
        return Conversation(prefix, {t.__name__: t for t in tools}, self.schemas(tools), environment)

    def shown(self, prompt: list, seen: str, where: str, tools: list[Callable]) -> list[int]:
        """The ids of a chat prompt with the environment's text added to its last message, checked for room."""
        prompt = [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + seen}]
        ids = prompt_ids(self.tokenizer, prompt, where, self.schemas(tools))
        if len(ids) > self.room[0]:
            raise ConfigError(
                f"{where}: with reset's text its prompt has {len(ids)} tokens, more than the {self.room[0]} a prompt "
                f"may have ({self.room[1]}); prompts are never cut"
            )
        return ids


def reset(environment, row: dict, where: str):
    """environment.reset(**row); one line naming the row where the user's reset raises."""
    try:
        return resolved(environment.reset(**row))  # an async reset awaited
    except Exception as e:  # noqa: BLE001 - the user's environment: one line
        raise ConfigError(f"{where}: {type(environment).__name__}.reset raised {first_line(e)}") from None
