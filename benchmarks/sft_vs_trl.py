"""anytrain's --task sft side by side with TRL's SFTTrainer (issue 28): the chat job of peers/sft_job.py through
both, full fine-tuning and LoRA, in interleaved rounds (each round its own seed, the same for both), plus
anytrain with --gradient-checkpointing for the memory figures. Per variant: loop time (the start of training
to the end of its last optimizer step, no evaluation), the process's peak resident memory, and the held-out
completion loss scored by one function for every trainer's saved model. Part of `make bench`'s peers
section when trl is installed (`make install-peers`); alone: `python benchmarks/sft_vs_trl.py --rounds 3`."""

import json
import statistics
from pathlib import Path

import toolkit
from peers import sft_job
from toolkit import BENCH, PY, TRAIN, Runner, launch_cmd, md_head

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


def folder(name: str) -> str:
    """A variant's run folder: "anytrain full, 32k head" -> sft-anytrain-full-32k-head."""
    return f"sft-{name.replace(',', '').replace(' ', '-')}"


def anytrain_run(runner: Runner, name: str, kind: str, extra: list[str], seed: int, data: Path, model: Path) -> dict:
    d = runner.fresh(folder(name))
    args = ["--model", f"hf:{model}", "--dataset", str(data), "--output-dir", str(d), "--no-progress", "--no-plot"]
    rec = runner.run(f"sft/{name}", launch_cmd("cpu.yaml", TRAIN, *args, *sft_job.anytrain_options(kind, seed), *extra))
    if "error" not in rec:
        s = json.loads((d / "summary.json").read_text())
        rec.update(loop_s=s["first_step_s"] + s["train_seconds"], steps=s["optimizer_steps"])
        rec.update(peak_memory_bytes=s["peak_memory_bytes"], trainable_parameters=s["trainable_parameters"])
        rec.update(model=str(d / "hf"))
    return rec


def trl_run(runner: Runner, name: str, kind: str, extra: list[str], seed: int, data: Path, model: Path) -> dict:
    d = runner.fresh(folder(name))
    script = BENCH / "peers" / "trl_sft_job.py"
    cmd = [PY, str(script), "--data", str(data), "--model", str(model), "--kind", kind, "--seed", str(seed), *extra]
    rec = runner.run(f"sft/{name}", [*cmd, "--json", str(d / "result.json"), "--out", str(d / "run")])
    if "error" not in rec:
        rec.update(json.loads((d / "result.json").read_text()))
    return rec


def variant(name: str, trainer: str, kind: str, extra: list[str], data: Path, models: dict[str, Path]):
    model = models["wide" if extra == WIDE else "narrow"]

    def run(runner: Runner) -> dict:
        seed = 42 + sum(1 for r in runner.records if r["name"] == f"sft/{name}")  # round r: seed 42 + r
        if trainer == "trl":
            rec = trl_run(runner, name, kind, extra, seed, data, model)
        else:
            rec = anytrain_run(runner, name, kind, extra, seed, data, model)
        if "error" not in rec:
            rec.update(seed=seed, heldout_loss=sft_job.completion_loss(Path(rec["model"]), data))
        return rec

    return run


def summarise(records: list[dict]) -> dict:
    rows = {}
    for name, *_ in VARIANTS:
        ok = [r for r in records if r.get("variant") == name and "error" not in r]
        if not ok:
            rows[name] = None
            continue
        losses = [r["heldout_loss"] for r in ok]
        rows[name] = {
            "loop_s": min(r["loop_s"] for r in ok),
            "loop_s_median": statistics.median(r["loop_s"] for r in ok),
            "peak_mib": statistics.median(r["peak_memory_bytes"] for r in ok) / 2**20,
            "heldout_loss": statistics.mean(losses),
            "heldout_loss_sd": statistics.stdev(losses) if len(losses) > 1 else 0.0,
            "trainable_parameters": ok[0]["trainable_parameters"],
            "steps": ok[0]["steps"],
            "runs": len(ok),
        }
    return rows


def table(rows: dict) -> str:
    out = md_head("variant", "loop time (best)", "median", "peak RSS (median)", "held-out answer loss", "trainable")
    for name, row in rows.items():
        if row is None:
            out.append(f"| {name} | failed | | | | |")
            continue
        out.append(
            f"| {name} | {row['loop_s']:.1f} s | {row['loop_s_median']:.1f} s | {row['peak_mib']:,.0f} MiB | "
            f"{row['heldout_loss']:.4f} ± {row['heldout_loss_sd']:.4f} | {row['trainable_parameters']:,} |"
        )
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
