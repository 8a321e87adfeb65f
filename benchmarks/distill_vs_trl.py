"""anytrain's --task distill side by side with TRL 1.16's DistillationTrainer: the on-policy distillation job of
peers/distill_job.py through both, full fine-tuning at beta 1 (the reverse KL, TRL's default) and at beta 0.5 (the
symmetric JSD), and LoRA at beta 1, in interleaved rounds (each round its own seed, the same for both trainers).
Per variant: loop time per optimizer step (the start of training to the end of its last step, no evaluation), the
share of it spent answering the prompts (generate and what each trainer times with it), the completion tokens a step
and the loop time per completion token (each trainer's own samples, whose lengths set much of a step's work), the
process's peak resident memory, and the held-out reverse KL, forward KL and top-1 agreement with the teacher, scored
by one function (distill_job.scores) for every trainer's saved student; the untrained student's scores beside them.
The two trainers sample differently, so a seed gives each its own completions. Needs trl and peft
(`pip install -e ".[peers]"`): `python benchmarks/distill_vs_trl.py --rounds 3`; the peak memory of the loss alone at
a 150k vocabulary: benchmarks/distill_memory.py."""

import statistics
from functools import partial
from pathlib import Path

import toolkit
from peers import distill_job
from toolkit import Runner, spread

VARIANTS = [  # (name, trainer, kind, beta)
    ("anytrain full", "anytrain", "full", 1.0),
    ("trl full", "trl", "full", 1.0),
    ("anytrain full, beta 0.5", "anytrain", "full", 0.5),
    ("trl full, beta 0.5", "trl", "full", 0.5),
    ("anytrain lora", "anytrain", "lora", 1.0),
    ("trl lora", "trl", "lora", 1.0),
]
PAIRS = [  # (what, anytrain's variant, TRL's variant)
    ("full, beta 1", "anytrain full", "trl full"),
    ("full, beta 0.5", "anytrain full, beta 0.5", "trl full, beta 0.5"),
    ("LoRA, beta 1", "anytrain lora", "trl lora"),
]
SCORES = ("reverse_kl", "forward_kl", "agreement")
TIMEOUT = 600  # seconds per run: about 1.5 min on the quiet 2-core machine, 4x that when others load it


def anytrain_run(runner: Runner, seed: int, name: str, kind: str, beta: float, data: Path, models: tuple) -> dict:
    student, teacher = models
    options = distill_job.anytrain_options(kind, beta, seed, teacher)
    rec, train = toolkit.anytrain_saved(runner, "distill", name, data, student, options, timeout=TIMEOUT)
    if "error" not in rec:
        seconds = [distill_job.PROMPTS / line["samples_per_s"] for line in train]  # one log line a step
        generating = sum(line["generating"] * s for line, s in zip(train, seconds))
        rec.update(generating_s=generating, step_seconds=seconds, losses=[line["loss"] for line in train])
        rec["lengths"] = [line["completion_length"] for line in train]  # each step's mean completion
    return rec


def trl_run(runner: Runner, seed: int, name: str, kind: str, beta: float, data: Path, models: tuple) -> dict:
    args = ["--kind", kind, "--beta", str(beta), "--seed", str(seed), "--teacher", str(models[1])]
    rec = toolkit.trl_peer(runner, "distill", name, "trl_distill_job.py", data, models[0], args, timeout=TIMEOUT)
    if "error" not in rec:
        rec["generating_s"] = rec["rollout_s"]
    return rec


def variant(name: str, trainer: str, kind: str, beta: float, data: Path, models: tuple):
    run = trl_run if trainer == "trl" else anytrain_run
    go = partial(run, name=name, kind=kind, beta=beta, data=data, models=models)
    return toolkit.peer_variant("distill", name, go, lambda rec: {**step_figures(rec), **scores(rec, data, models)})


def scores(rec: dict, data: Path, models: tuple) -> dict:
    return distill_job.scores(Path(rec["model"]), models[1], data)


def step_figures(rec: dict) -> dict:
    """Seconds per step, the share generating, the median of the steps after the first, and the completion tokens a
    step (each trainer's own samples: their lengths set much of a step's work)."""
    step_s, generating = rec["loop_s"] / rec["steps"], rec["generating_s"] / rec["loop_s"]
    tokens = distill_job.PROMPTS * statistics.mean(rec["lengths"])
    return {"step_s": step_s, "generating": generating, "typical_step_s": statistics.median(rec["step_seconds"][1:]),
            "tokens_per_step": tokens, "ms_per_token": 1000 * step_s / tokens}  # fmt: skip


def figures(name: str, ok: list[dict]) -> dict:
    out = toolkit.peer_figures(ok, "step_s")
    out.update(
        typical_step_s=statistics.median(r["typical_step_s"] for r in ok),
        generating=statistics.median(r["generating"] for r in ok),
        generating_step_s=statistics.median(r["generating_s"] / r["steps"] for r in ok),
        tokens_per_step=statistics.median(r["tokens_per_step"] for r in ok),
        ms_per_token=min(r["ms_per_token"] for r in ok),  # the best run's, as the time per step's
        ms_per_token_median=statistics.median(r["ms_per_token"] for r in ok),
        seeds=[r["seed"] for r in ok],
        **{score: spread([r[score] for r in ok]) for score in SCORES},
    )
    return out


def cells(row: dict) -> list[str]:
    """A variant's cells of the table, after its name."""
    times = [f"{row['step_s']:.2f} s", f"{row['step_s_median']:.2f} s", f"{row['typical_step_s']:.2f} s"]
    generating = f"{100 * row['generating']:.0f} % ({row['generating_step_s']:.2f} s)"
    tokens = [f"{row['tokens_per_step']:.0f}", f"{row['ms_per_token']:.2f} ms ({row['ms_per_token_median']:.2f})"]
    held_out = [f"{row[score][0]:.3f} ± {row[score][1]:.3f}" for score in SCORES]
    sizes = [f"{row['peak_mib']:,.0f} MiB", f"{row['trainable_parameters']:,}", f"{row['other_load_median']:.2f}"]
    return [*times, generating, *tokens, sizes[0], *held_out, *sizes[1:]]


def comparison(what: str, a: dict | None, t: dict | None) -> str:
    """One line per pair: the ratios (anytrain / TRL) and the held-out scores' differences against their seed noise."""
    if not (a and t):
        return ""
    gaps = ", ".join(f"{score} {a[score][0] - t[score][0]:+.3f} (sd {max(a[score][1], t[score][1]):.3f})"
                     for score in SCORES)  # fmt: skip
    return (
        f"\n{what}: anytrain / TRL time per step {a['step_s'] / t['step_s']:.3f} (best runs), "
        f"{a['step_s_median'] / t['step_s_median']:.3f} (median runs), {a['typical_step_s'] / t['typical_step_s']:.3f} "
        f"(median steps); generating {a['generating_step_s']:.2f} vs {t['generating_step_s']:.2f} s a step, the rest "
        f"{a['step_s_median'] - a['generating_step_s']:.2f} vs {t['step_s_median'] - t['generating_step_s']:.2f} s; "
        f"per completion token {a['ms_per_token'] / t['ms_per_token']:.3f} (best runs), "
        f"{a['ms_per_token_median'] / t['ms_per_token_median']:.3f} (median runs); peak RSS "
        f"{a['peak_mib'] / t['peak_mib']:.3f}; held-out anytrain - TRL: {gaps}"
    )


def table(rows: dict, start: dict) -> str:
    """The table, the untrained student's scores, then a line per pair."""
    head = ["variant", "time per step (best run)", "median run", "median step", "generating (share, s a step)"]
    head += ["completion tokens a step (median)", "time per token (best run; median)", "peak RSS (median)"]
    head += ["held-out reverse KL", "forward KL", "top-1 agreement", "trainable", "others' load"]
    out = toolkit.peer_table(head, rows, cells)
    out.append("\nthe untrained student: " + ", ".join(f"{score} {start[score]:.3f}" for score in SCORES))
    out += [comparison(what, rows.get(a), rows.get(t)) for what, a, t in PAIRS]
    return "\n".join(out)


def main(argv=None) -> dict | None:
    args = toolkit.parser(__doc__, out="bench_out/distill", rounds=3).parse_args(argv)
    if toolkit.trl_missing("the on-policy distillation job"):
        return None
    out = toolkit.out_dir(args.out)
    data = distill_job.write_data(out / "data")
    models = distill_job.build_models(out / "model")
    start = distill_job.scores(models[0], models[1], data)
    toolkit.write_json(out / "distill_untrained.json", start)
    runner = Runner(out)
    variants = [(name, variant(name, *rest, data, models)) for name, *rest in VARIANTS]
    summarise = partial(toolkit.peer_rows, names=[name for name, *_ in VARIANTS], row=figures)
    return toolkit.peer_rounds(runner, variants, args.rounds, "distill", distill_job, summarise,
                               partial(table, start=start))  # fmt: skip


if __name__ == "__main__":
    main()
