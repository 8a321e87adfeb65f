"""anytrain's --task grpo --tools side by side with TRL's GRPOTrainer(tools=...) (issue 47): the tool-use job of
peers/grpo_tools_job.py through both, in interleaved rounds (each round its own seed, the same for both). Per
trainer: loop time per optimizer step (the start of training to the end of its last step, no evaluation), the share
spent on rollouts (generate, the tools, the rewards), the process's peak resident memory, and per step each trainer's
own logged mean reward, share of completions whose reply is right, and tool calls per completion.
`python benchmarks/grpo_tools_vs_trl.py --rounds 2` (trl installed: `make install-peers`)."""

import statistics
from functools import partial
from pathlib import Path

import toolkit
from peers import grpo_tools_job as job
from toolkit import ROOT, Runner

VARIANTS = [("anytrain", "anytrain"), ("trl", "trl")]
TIMEOUT = 1200


def anytrain_run(runner: Runner, seed: int, data: Path, model: Path) -> dict:
    options = job.anytrain_options(seed, data)
    rec, _, train, _ = toolkit.anytrain_peer(runner, "tools", "anytrain", data, model, options, timeout=TIMEOUT)
    if "error" not in rec:
        seconds = [job.PROMPTS * job.GENERATIONS / line["samples_per_s"] for line in train]  # one line a step
        rec.update(step_seconds=seconds, rewards=[line["reward"] for line in train])
        rec.update(rights=[line["reward_right"] for line in train], calls=[line["tool_calls"] for line in train])
        rec["rollout_s"] = sum(line["generating"] * w for line, w in zip(train, seconds))
    return rec


def trl_run(runner: Runner, seed: int, data: Path, model: Path) -> dict:
    args = ["--kind", "full", "--seed", str(seed)]
    return toolkit.trl_peer(runner, "tools", "trl", "trl_grpo_tools_job.py", data, model, args, timeout=TIMEOUT)


def variant(trainer: str, data: Path, model: Path):
    go = partial(trl_run if trainer == "trl" else anytrain_run, data=data, model=model)
    return toolkit.peer_variant("tools", trainer, go, step_figures)


def step_figures(rec: dict) -> dict:
    """Seconds per step and the share of them spent on rollouts."""
    return {"step_s": rec["loop_s"] / rec["steps"], "rollout": rec["rollout_s"] / rec["loop_s"]}


def summarise(records: list[dict]) -> dict:
    return toolkit.peer_rows(records, [name for name, _ in VARIANTS], figures)


def figures(name: str, ok: list[dict]) -> dict:
    out = toolkit.peer_figures(ok, "step_s")
    out["rollout"] = statistics.median(r["rollout"] for r in ok)
    return {**out, **{key: curve(ok, key) for key in ("rewards", "rights", "calls")}}


def curve(records: list[dict], key: str) -> list[float]:
    """Each step's mean over the runs of a logged figure."""
    return [statistics.mean(x for x in step if x is not None) for step in zip(*(r[key] for r in records))]


def cells(row: dict) -> list[str]:
    """A trainer's cells of the table, after its name."""
    times = [f"{row['step_s']:.2f} s", f"{row['step_s_median']:.2f} s", f"{100 * row['rollout']:.0f} %"]
    curves = [at_steps(row["calls"]), at_steps(row["rights"]), f"{statistics.mean(row['rewards']):.3f}"]
    return [*times, f"{row['peak_mib']:,.0f} MiB", *curves]


def at_steps(curve: list[float]) -> str:
    """A curve at steps 1, 5 and 10 (those it has)."""
    return " / ".join(f"{curve[k]:.2f}" for k in (0, 4, 9) if k < len(curve))


def table(rows: dict) -> str:
    head = ["trainer", "time per step (best run)", "median run", "rollout share", "peak RSS (median)",
            "tool calls per completion, steps 1 / 5 / 10", "right, steps 1 / 5 / 10", "mean reward"]  # fmt: skip
    out = toolkit.peer_table(head, rows, cells)
    a, t = rows.get("anytrain"), rows.get("trl")
    if a and t:
        out.append(f"\nanytrain / TRL time per step {a['step_s'] / t['step_s']:.3f} (best runs), "
                   f"{a['step_s_median'] / t['step_s_median']:.3f} (median runs); peak RSS "
                   f"{a['peak_mib'] / t['peak_mib']:.3f}")  # fmt: skip
    return "\n".join(out)


def main(argv=None) -> dict | None:
    args = toolkit.parser(__doc__, out="bench_out/grpo_tools", rounds=2).parse_args(argv)
    if toolkit.trl_missing("the tool-use job"):
        return None
    out = toolkit.out_dir(args.out)
    data = job.write_data(out / "data")
    model = job.build_model(out / "model", ROOT)
    runner = Runner(out)
    variants = [(name, variant(trainer, data, model)) for name, trainer in VARIANTS]
    return toolkit.peer_rounds(runner, variants, args.rounds, "grpo_tools", job, summarise, table)


if __name__ == "__main__":
    main()
