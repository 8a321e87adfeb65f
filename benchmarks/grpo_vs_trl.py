"""anytrain's --task grpo side by side with TRL's GRPOTrainer (issue 40): the online-RL job of peers/grpo_job.py
through both, full fine-tuning and LoRA, in interleaved rounds (each round its own seed, the same for both trainers).
Per variant: loop time per optimizer step (the start of training to the end of its last step, no evaluation), the
share of it spent on rollouts (generate, decode, score, advantages), the process's peak resident memory, and the
reward curve (each trainer's own logged mean reward of each step's completions), compared over the rounds' seeds:
the two trainers sample differently, so a seed gives each its own curve. Part of `make bench`'s peers section when
trl is installed (`make install-peers`); alone: `python benchmarks/grpo_vs_trl.py --rounds 3`."""

import json
import statistics
from pathlib import Path

import toolkit
from peers import grpo_job
from toolkit import BENCH, PY, TRAIN, Runner, launch_cmd, md_head

VARIANTS = [  # (name, trainer, kind)
    ("anytrain full", "anytrain", "full"),
    ("trl full", "trl", "full"),
    ("anytrain lora", "anytrain", "lora"),
    ("trl lora", "trl", "lora"),
]
CURVE_STEPS = [1, 4, 8, 12, 16]  # the reward curve's columns in the table
LAST = 5  # "the last steps": the mean reward of the last LAST steps
TIMEOUT = 600  # seconds per run: about 90 s on the quiet 2-core machine, 4x that when others load it to 5


def folder(name: str) -> str:
    """A variant's run folder: "anytrain full" -> grpo-anytrain-full."""
    return f"grpo-{name.replace(' ', '-')}"


def windows(train: list[dict]) -> list[float]:
    """An anytrain run's seconds per log line (one line a step here): its completions over its completions/s."""
    steps = [line["step"] - before for line, before in zip(train, [0] + [line["step"] for line in train])]
    return [n * grpo_job.PROMPTS * grpo_job.GENERATIONS / line["samples_per_s"] for n, line in zip(steps, train)]


def anytrain_run(runner: Runner, name: str, kind: str, seed: int, data: Path, model: Path) -> dict:
    d = runner.fresh(folder(name))
    args = ["--model", f"hf:{model}", "--dataset", str(data), "--output-dir", str(d), "--no-progress", "--no-plot"]
    options = [*args, *grpo_job.anytrain_options(kind, seed, grpo_job.rewards_file(data))]
    rec = runner.run(f"grpo/{name}", launch_cmd("cpu.yaml", TRAIN, *options), timeout=TIMEOUT)
    if "error" not in rec:
        train, _, s = toolkit.read_run(d)
        rec.update(loop_s=s["first_step_s"] + s["train_seconds"], steps=s["optimizer_steps"])
        rec.update(peak_memory_bytes=s["peak_memory_bytes"], trainable_parameters=s["trainable_parameters"])
        seconds = windows(train)  # each line's `generating`: the share of its window spent on rollouts
        generating = sum(line["generating"] * w for line, w in zip(train, seconds))
        rec.update(rewards=[line["reward"] for line in train], generating_s=generating, step_seconds=seconds)
    return rec


def trl_run(runner: Runner, name: str, kind: str, seed: int, data: Path, model: Path) -> dict:
    d = runner.fresh(folder(name))
    script = BENCH / "peers" / "trl_grpo_job.py"
    cmd = [PY, str(script), "--data", str(data), "--model", str(model), "--kind", kind, "--seed", str(seed)]
    out = ["--json", str(d / "result.json"), "--out", str(d / "run")]
    rec = runner.run(f"grpo/{name}", [*cmd, *out], timeout=TIMEOUT)
    if "error" not in rec:
        result = json.loads((d / "result.json").read_text())
        rec.update(result, generating_s=result["rollout_s"])
    return rec


def variant(name: str, trainer: str, kind: str, data: Path, model: Path):
    def run(runner: Runner) -> dict:
        seed = 42 + sum(1 for r in runner.records if r["name"] == f"grpo/{name}")  # round r: seed 42 + r
        go = trl_run if trainer == "trl" else anytrain_run
        waited = toolkit.settle()
        rec = go(runner, name, kind, seed, data, model)
        rec["waited_for_quiet_s"] = waited
        if "error" not in rec:
            rec.update(seed=seed, step_s=rec["loop_s"] / rec["steps"], generating=rec["generating_s"] / rec["loop_s"])
            rec["typical_step_s"] = statistics.median(rec["step_seconds"][1:])  # the steps after the first
        return rec

    return run


def spread(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(records: list[dict]) -> dict:
    rows = {}
    for name, _, _ in VARIANTS:
        ok = [r for r in records if r.get("variant") == name and "error" not in r]
        if not ok:
            rows[name] = None
            continue
        curves = [r["rewards"] for r in ok]
        rows[name] = {
            "step_s": min(r["step_s"] for r in ok),
            "step_s_median": statistics.median(r["step_s"] for r in ok),
            "typical_step_s": statistics.median(r["typical_step_s"] for r in ok),
            "generating": statistics.median(r["generating"] for r in ok),
            "generating_step_s": statistics.median(r["generating_s"] / r["steps"] for r in ok),
            "peak_mib": statistics.median(r["peak_memory_bytes"] for r in ok) / 2**20,
            "curve": [spread(list(step)) for step in zip(*curves)],  # (mean, sd over seeds) per step
            "mean_reward": spread([statistics.mean(c) for c in curves]),
            "last_reward": spread([statistics.mean(c[-LAST:]) for c in curves]),
            "trainable_parameters": ok[0]["trainable_parameters"],
            "steps": ok[0]["steps"],
            "runs": len(ok),
            "seeds": [r["seed"] for r in ok],
            "other_load_median": statistics.median(r["other_load"] or 0.0 for r in ok),
        }
    return rows


def table(rows: dict) -> str:
    """Two tables (time and memory; the reward curve), then a line per pair."""
    head = ["variant", "time per step (best run)", "median run", "median step", "generating (share, s a step)"]
    out = md_head(*head, "peak RSS (median)", "trainable", "others' load")
    for name, row in rows.items():
        if row is None:
            out.append(f"| {name} | failed | | | | | | |")
            continue
        out.append(
            f"| {name} | {row['step_s']:.2f} s | {row['step_s_median']:.2f} s | {row['typical_step_s']:.2f} s | "
            f"{100 * row['generating']:.0f} % ({row['generating_step_s']:.2f} s) | {row['peak_mib']:,.0f} MiB | "
            f"{row['trainable_parameters']:,} | {row['other_load_median']:.2f} |"
        )
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
