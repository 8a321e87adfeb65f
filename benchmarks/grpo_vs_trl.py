"""anytrain's --task grpo side by side with TRL's GRPOTrainer (issue 40): the online-RL job of peers/grpo_job.py
through both, full fine-tuning and LoRA, in interleaved rounds (each round its own seed, the same for both trainers).
Per variant: loop time per optimizer step (the start of training to the end of its last step, no evaluation), the
share of it spent on rollouts (generate, decode, score, advantages), the process's peak resident memory, and the
reward curve (each trainer's own logged mean reward of each step's completions), compared over the rounds' seeds:
the two trainers sample differently, so a seed gives each its own curve. Part of `make bench`'s peers section when
trl is installed (`make install-peers`); alone: `python benchmarks/grpo_vs_trl.py --rounds 3`."""

import statistics
from functools import partial
from pathlib import Path

import toolkit
from peers import grpo_job
from toolkit import Runner, md_head, spread

VARIANTS = [  # (name, trainer, kind)
    ("anytrain full", "anytrain", "full"),
    ("trl full", "trl", "full"),
    ("anytrain lora", "anytrain", "lora"),
    ("trl lora", "trl", "lora"),
]
CURVE_STEPS = [1, 4, 8, 12, 16]  # the reward curve's columns in the table
LAST = 5  # "the last steps": the mean reward of the last LAST steps
TIMEOUT = 600  # seconds per run: about 90 s on the quiet 2-core machine, 4x that when others load it to 5


def windows(train: list[dict]) -> list[float]:
    """An anytrain run's seconds per log line (one line a step here): its completions over its completions/s."""
    steps = [line["step"] - before for line, before in zip(train, [0] + [line["step"] for line in train])]
    return [n * grpo_job.PROMPTS * grpo_job.GENERATIONS / line["samples_per_s"] for n, line in zip(steps, train)]


def anytrain_run(runner: Runner, seed: int, name: str, kind: str, data: Path, model: Path) -> dict:
    options = grpo_job.anytrain_options(kind, seed, grpo_job.rewards_file(data))
    rec, _, train, _ = toolkit.anytrain_peer(runner, "grpo", name, data, model, options, timeout=TIMEOUT)
    if "error" not in rec:
        seconds = windows(train)  # each line's `generating`: the share of its window spent on rollouts
        generating = sum(line["generating"] * w for line, w in zip(train, seconds))
        rec.update(rewards=[line["reward"] for line in train], generating_s=generating, step_seconds=seconds)
    return rec


def trl_run(runner: Runner, seed: int, name: str, kind: str, data: Path, model: Path) -> dict:
    args = ["--kind", kind, "--seed", str(seed)]
    rec = toolkit.trl_peer(runner, "grpo", name, "trl_grpo_job.py", data, model, args, timeout=TIMEOUT)
    if "error" not in rec:
        rec["generating_s"] = rec["rollout_s"]
    return rec


def variant(name: str, trainer: str, kind: str, data: Path, model: Path):
    go = partial(trl_run if trainer == "trl" else anytrain_run, name=name, kind=kind, data=data, model=model)
    return toolkit.peer_variant("grpo", name, go, step_figures)


def step_figures(rec: dict) -> dict:
    """Seconds per step, the share generating, and the median of the steps after the first."""
    step_s, generating = rec["loop_s"] / rec["steps"], rec["generating_s"] / rec["loop_s"]
    return {"step_s": step_s, "generating": generating, "typical_step_s": statistics.median(rec["step_seconds"][1:])}


def summarise(records: list[dict]) -> dict:
    return toolkit.peer_rows(records, [name for name, *_ in VARIANTS], figures)


def figures(name: str, ok: list[dict]) -> dict:
    curves = [r["rewards"] for r in ok]
    out = toolkit.peer_figures(ok, "step_s")
    out.update(
        typical_step_s=statistics.median(r["typical_step_s"] for r in ok),
        generating=statistics.median(r["generating"] for r in ok),
        generating_step_s=statistics.median(r["generating_s"] / r["steps"] for r in ok),
        curve=[spread(list(step)) for step in zip(*curves)],  # (mean, sd over seeds) per step
        mean_reward=spread([statistics.mean(c) for c in curves]),
        last_reward=spread([statistics.mean(c[-LAST:]) for c in curves]),
        seeds=[r["seed"] for r in ok],
    )
    return out


def cells(row: dict) -> list[str]:
    """A variant's cells of the time and memory table, after its name."""
    times = [f"{row['step_s']:.2f} s", f"{row['step_s_median']:.2f} s", f"{row['typical_step_s']:.2f} s"]
    generating = f"{100 * row['generating']:.0f} % ({row['generating_step_s']:.2f} s)"
    sizes = [f"{row['peak_mib']:,.0f} MiB", f"{row['trainable_parameters']:,}", f"{row['other_load_median']:.2f}"]
    return [*times, generating, *sizes]


def table(rows: dict) -> str:
    """Two tables (time and memory; the reward curve), then a line per pair."""
    head = ["variant", "time per step (best run)", "median run", "median step", "generating (share, s a step)"]
    out = toolkit.peer_table([*head, "peak RSS (median)", "trainable", "others' load"], rows, cells)
    out += ["", *curve_table(rows)]
    out += [comparison(kind, rows.get(f"anytrain {kind}"), rows.get(f"trl {kind}")) for kind in ("full", "lora")]
    return "\n".join(out)


def curve_table(rows: dict) -> list[str]:
    """The mean reward (± sd over the seeds) at some steps, over all steps and over the last LAST."""
    head = [f"reward at step {s}" for s in CURVE_STEPS] + ["mean over all steps", f"last {LAST} steps"]
    out = md_head("variant", *head)
    for name, row in rows.items():
        if row is None:
            continue
        curve = [row["curve"][s - 1] for s in CURVE_STEPS if s <= row["steps"]]
        cells = [f"{m:.3f} ± {sd:.3f}" for m, sd in [*curve, row["mean_reward"], row["last_reward"]]]
        out.append(f"| {name} | {' | '.join(cells)} |")
    return out


def comparison(kind: str, a: dict | None, t: dict | None) -> str:
    """One line per pair: the ratios (anytrain / TRL) and the reward curves' differences against their seed noise."""
    if not (a and t):
        return ""
    gaps = [(abs(x[0] - y[0]), max(x[1], y[1]), k + 1) for k, (x, y) in enumerate(zip(a["curve"], t["curve"]))]
    gap, sd, step = max(gaps)
    return (
        f"\n{kind}: anytrain / TRL time per step {a['step_s'] / t['step_s']:.3f} (best runs), "
        f"{a['step_s_median'] / t['step_s_median']:.3f} (median runs), {a['typical_step_s'] / t['typical_step_s']:.3f} "
        f"(median steps); generating {a['generating_step_s']:.2f} vs "
        f"{t['generating_step_s']:.2f} s a step, the rest {a['step_s_median'] - a['generating_step_s']:.2f} vs "
        f"{t['step_s_median'] - t['generating_step_s']:.2f} s; peak RSS {a['peak_mib'] / t['peak_mib']:.3f}; "
        f"mean reward anytrain - TRL {a['mean_reward'][0] - t['mean_reward'][0]:+.3f} (seed-to-seed sd "
        f"{max(a['mean_reward'][1], t['mean_reward'][1]):.3f}), last {LAST} steps "
        f"{a['last_reward'][0] - t['last_reward'][0]:+.3f} (sd {max(a['last_reward'][1], t['last_reward'][1]):.3f}); "
        f"the curves' largest gap {gap:.3f} at step {step} (sd there {sd:.3f})"
    )


def main(argv=None) -> dict | None:
    args = toolkit.parser(__doc__, out="bench_out/grpo", rounds=3).parse_args(argv)
    if toolkit.trl_missing("the online-RL job"):
        return None
    out = toolkit.out_dir(args.out)
    data = grpo_job.write_data(out / "data")
    model = grpo_job.build_model(out / "model")
    runner = Runner(out)
    variants = [(name, variant(name, trainer, kind, data, model)) for name, trainer, kind in VARIANTS]
    return toolkit.peer_rounds(runner, variants, args.rounds, "grpo", grpo_job, summarise, table)


if __name__ == "__main__":
    main()
