"""anytrain's --task sft side by side with TRL's SFTTrainer (issue 28): the chat job of peers/sft_job.py through
both, full fine-tuning and LoRA, in interleaved rounds (each round its own seed, the same for both), plus
anytrain with --gradient-checkpointing for the memory figures. Per variant: loop time (the start of training
to the end of its last optimizer step, no evaluation), the process's peak resident memory, and the held-out
completion loss scored by one function for every trainer's saved model. Part of `make bench`'s peers
section when trl is installed (`make install-peers`); alone: `python benchmarks/sft_vs_trl.py --rounds 3`."""

from functools import partial
from pathlib import Path

import toolkit
from peers import sft_job
from toolkit import Runner, spread

WIDE = ["--max-steps", str(sft_job.WIDE_STEPS)]
VARIANTS = [  # (name, trainer, kind, extra anytrain options: the wide head's --max-steps picks its model)
    ("anytrain full", "anytrain", "full", []),
    ("trl full", "trl", "full", []),
    ("anytrain lora", "anytrain", "lora", []),
    ("trl lora", "trl", "lora", []),
    ("anytrain full, grad ckpt", "anytrain", "full", ["--gradient-checkpointing"]),
    ("anytrain lora, grad ckpt", "anytrain", "lora", ["--gradient-checkpointing"]),
    ("anytrain full, 32k head", "anytrain", "full", WIDE),
    ("trl full, 32k head", "trl", "full", WIDE),
]


def anytrain_run(runner: Runner, seed: int, name: str, kind: str, extra: list[str], data: Path, model: Path) -> dict:
    options = [*sft_job.anytrain_options(kind, seed), *extra]
    rec, d, _, _ = toolkit.anytrain_peer(runner, "sft", name, data, model, options)
    if "error" not in rec:
        rec.update(model=str(d / "hf"))
    return rec


def trl_run(runner: Runner, seed: int, name: str, kind: str, extra: list[str], data: Path, model: Path) -> dict:
    args = ["--kind", kind, "--seed", str(seed), *extra]
    return toolkit.trl_peer(runner, "sft", name, "trl_sft_job.py", data, model, args)


def variant(name: str, trainer: str, kind: str, extra: list[str], data: Path, models: dict[str, Path]):
    model = models["wide" if extra == WIDE else "narrow"]
    run = trl_run if trainer == "trl" else anytrain_run
    go = partial(run, name=name, kind=kind, extra=extra, data=data, model=model)

    def scores(rec: dict) -> dict:
        return {"heldout_loss": sft_job.completion_loss(Path(rec["model"]), data)}

    return toolkit.peer_variant("sft", name, go, scores, quiet=False)


def summarise(records: list[dict]) -> dict:
    return toolkit.peer_rows(records, [name for name, *_ in VARIANTS], figures)


def figures(name: str, ok: list[dict]) -> dict:
    loss, sd = spread([r["heldout_loss"] for r in ok])
    return {**toolkit.peer_figures(ok, "loop_s"), "heldout_loss": loss, "heldout_loss_sd": sd}


def cells(row: dict) -> list[str]:
    """A variant's cells of the table, after its name."""
    times = [f"{row['loop_s']:.1f} s", f"{row['loop_s_median']:.1f} s", f"{row['peak_mib']:,.0f} MiB"]
    loss = f"{row['heldout_loss']:.4f} ± {row['heldout_loss_sd']:.4f}"
    return [*times, loss, f"{row['trainable_parameters']:,}"]


def table(rows: dict) -> str:
    head = ["variant", "loop time (best)", "median", "peak RSS (median)", "held-out answer loss", "trainable"]
    out = toolkit.peer_table(head, rows, cells)
    for kind in ("full", "lora", "full, 32k head"):
        a, t = rows.get(f"anytrain {kind}"), rows.get(f"trl {kind}")
        if a and t:
            sd = max(a["heldout_loss_sd"], t["heldout_loss_sd"])
            out.append(
                f"\n{kind}: TRL / anytrain loop time {t['loop_s'] / a['loop_s']:.3f}, peak RSS "
                f"{t['peak_mib'] / a['peak_mib']:.3f}; held-out loss anytrain - TRL "
                f"{a['heldout_loss'] - t['heldout_loss']:+.4f} (seed-to-seed sd {sd:.4f})"
            )
    return "\n".join(out)


def main(argv=None) -> dict | None:
    args = toolkit.parser(__doc__, out="bench_out/sft", rounds=3).parse_args(argv)
    if toolkit.trl_missing("the SFT job"):
        return None
    out = toolkit.out_dir(args.out)
    data = sft_job.write_data(out / "data")
    models = {"narrow": sft_job.build_model(out / "model")}
    models["wide"] = sft_job.build_model(out / "model-32k", sft_job.WIDE_VOCABULARY)
    runner = Runner(out)
    variants = [(name, variant(name, *rest, data, models)) for name, *rest in VARIANTS]
    return toolkit.peer_rounds(runner, variants, args.rounds, "sft", sft_job, summarise, table)


if __name__ == "__main__":
    main()
