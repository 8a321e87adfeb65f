"""anytrain's --task dpo and --task reward side by side with TRL's DPOTrainer and RewardTrainer (issue 34): the
preference job of peers/dpo_job.py through both, DPO with full fine-tuning (anytrain's cached reference against TRL's
default live reference model, and each the other way: anytrain --reference live, TRL precompute_ref_log_probs), DPO
with LoRA (both: the model with its adapter off), the reward model, and anytrain's DPO padded against --packing on
pairs of uneven length, in interleaved rounds (each round its own seed, the same for every variant). Per variant:
loop time (the start of training to the end of its last optimizer step, no evaluation), the process's peak resident
memory, real tokens/s (anytrain), and the held-out reward accuracy and DPO loss (reward models: pairwise accuracy and
Bradley-Terry loss) scored by one function for every trainer's saved model. Part of `make bench`'s peers section
when trl is installed (`make install-peers`); alone: `python benchmarks/dpo_vs_trl.py --rounds 3`."""

import json
import statistics
from pathlib import Path

import toolkit
from peers import dpo_job
from toolkit import BENCH, PY, TRAIN, Runner, launch_cmd, md_head

UNEVEN = ["--max-length", str(dpo_job.UNEVEN_LENGTH), "--max-steps", str(dpo_job.UNEVEN_STEPS)]
VARIANTS = [  # (name, trainer, kind, extra options: anytrain's flags or trl_dpo_job.py's)
    ("anytrain dpo full", "anytrain", "full", ["--reference", "cached"]),
    ("trl dpo full", "trl", "full", []),
    ("anytrain dpo full, live reference", "anytrain", "full", ["--reference", "live"]),
    ("trl dpo full, precomputed reference", "trl", "full", ["--precompute"]),
    ("anytrain dpo lora", "anytrain", "lora", []),
    ("trl dpo lora", "trl", "lora", ["--lora"]),
    ("anytrain reward", "anytrain", "reward", []),
    ("trl reward", "trl", "reward", []),
    ("anytrain dpo padded, uneven pairs", "anytrain", "full", UNEVEN),
    ("anytrain dpo packed, uneven pairs", "anytrain", "full", [*UNEVEN, "--packing"]),
]
PAIRS = [  # (what, anytrain's variant, TRL's variant)
    ("DPO full, each trainer's default reference", "anytrain dpo full", "trl dpo full"),
    ("DPO full, both a live reference", "anytrain dpo full, live reference", "trl dpo full"),
    ("DPO full, both a precomputed reference", "anytrain dpo full", "trl dpo full, precomputed reference"),
    ("DPO LoRA", "anytrain dpo lora", "trl dpo lora"),
    ("reward model", "anytrain reward", "trl reward"),
]


def folder(name: str) -> str:
    """A variant's run folder: "anytrain dpo full, live reference" -> dpo-anytrain-dpo-full-live-reference."""
    return f"dpo-{name.replace(',', '').replace(' ', '-')}"


def anytrain_run(runner: Runner, name: str, kind: str, extra: list[str], seed: int, data: Path, model: Path) -> dict:
    d = runner.fresh(folder(name))
    args = ["--model", f"hf:{model}", "--dataset", str(data / "train"), "--output-dir", str(d), "--no-progress"]
    options = [*args, "--no-plot", *dpo_job.anytrain_options(kind, seed), *extra]
    rec = runner.run(f"dpo/{name}", launch_cmd("cpu.yaml", TRAIN, *options))
    if "error" not in rec:
        s = json.loads((d / "summary.json").read_text())
        rec.update(loop_s=s["first_step_s"] + s["train_seconds"], steps=s["optimizer_steps"])
        rec.update(peak_memory_bytes=s["peak_memory_bytes"], trainable_parameters=s["trainable_parameters"])
        rec.update(tokens_per_s=s["tokens_per_s"], start_to_first_step_s=s["start_to_first_step_s"])
        rec.update(model=str(d / "hf"))
    return rec


def trl_run(runner: Runner, name: str, kind: str, extra: list[str], seed: int, data: Path, model: Path) -> dict:
    d = runner.fresh(folder(name))
    script = BENCH / "peers" / "trl_dpo_job.py"
    what = "reward" if kind == "reward" else "dpo"
    cmd = [PY, str(script), "--data", str(data), "--model", str(model), "--kind", what, "--seed", str(seed), *extra]
    rec = runner.run(f"dpo/{name}", [*cmd, "--json", str(d / "result.json"), "--out", str(d / "run")])
    if "error" not in rec:
        rec.update(json.loads((d / "result.json").read_text()))
    return rec


def variant(name: str, trainer: str, kind: str, extra: list[str], data: dict[str, Path], model: Path):
    uneven = extra[: len(UNEVEN)] == UNEVEN
    where = data["uneven" if uneven else "even"]

    def run(runner: Runner) -> dict:
        seed = 42 + sum(1 for r in runner.records if r["name"] == f"dpo/{name}")  # round r: seed 42 + r
        go = trl_run if trainer == "trl" else anytrain_run
        waited = toolkit.settle()
        rec = go(runner, name, kind, extra, seed, where, model)
        rec["waited_for_quiet_s"] = waited
        if "error" not in rec:
            rec["seed"] = seed
            if kind == "reward":
                rec.update(dpo_job.reward_scores(Path(rec["model"]), where))
            else:
                length = dpo_job.UNEVEN_LENGTH if uneven else dpo_job.MAX_LENGTH
                rec.update(dpo_job.dpo_scores(Path(rec["model"]), model, where, length))
        return rec

    return run


def spread(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(records: list[dict]) -> dict:
    rows = {}
    for name, _, kind, _ in VARIANTS:
        ok = [r for r in records if r.get("variant") == name and "error" not in r]
        if not ok:
            rows[name] = None
            continue
        loss = "reward_loss" if kind == "reward" else "dpo_loss"
        row = {
            "loop_s": min(r["loop_s"] for r in ok),
            "loop_s_median": statistics.median(r["loop_s"] for r in ok),
            "peak_mib": statistics.median(r["peak_memory_bytes"] for r in ok) / 2**20,
            "reward_accuracy": spread([r["reward_accuracy"] for r in ok]),
            "loss": spread([r[loss] for r in ok]),
            "loss_kind": loss,
            "trainable_parameters": ok[0]["trainable_parameters"],
            "steps": ok[0]["steps"],
            "runs": len(ok),
            "other_load_median": statistics.median(r["other_load"] or 0.0 for r in ok),
        }
        if "tokens_per_s" in ok[0]:
            row["tokens_per_s"] = max(r["tokens_per_s"] for r in ok)  # the best run's, as the loop time's
            row["tokens_per_s_median"] = statistics.median(r["tokens_per_s"] for r in ok)
            row["start_to_first_step_s"] = statistics.median(r["start_to_first_step_s"] for r in ok)
        rows[name] = row
    return rows


def table(rows: dict) -> str:
    head = ["variant", "loop time (best)", "median", "peak RSS (median)", "held-out reward accuracy"]
    head += ["held-out loss (DPO; reward: Bradley-Terry)", "real tokens/s (best)", "trainable", "others' load"]
    out = md_head(*head)
    for name, row in rows.items():
        if row is None:
            out.append(f"| {name} | failed | | | | | | | |")
            continue
        (acc, acc_sd), (loss, loss_sd) = row["reward_accuracy"], row["loss"]
        rate = f"{row['tokens_per_s']:,.0f}" if "tokens_per_s" in row else ""
        out.append(
            f"| {name} | {row['loop_s']:.1f} s | {row['loop_s_median']:.1f} s | {row['peak_mib']:,.0f} MiB | "
            f"{acc:.3f} ± {acc_sd:.3f} | {loss:.4f} ± {loss_sd:.4f} | {rate} | {row['trainable_parameters']:,} | "
            f"{row['other_load_median']:.2f} |"
        )
    for what, a_name, t_name in PAIRS:
        a, t = rows.get(a_name), rows.get(t_name)
        if a and t:
            sd = max(a["reward_accuracy"][1], t["reward_accuracy"][1])
            out.append(
                f"\n{what}: TRL / anytrain loop time {t['loop_s'] / a['loop_s']:.3f}, peak RSS "
                f"{t['peak_mib'] / a['peak_mib']:.3f}; held-out reward accuracy anytrain - TRL "
                f"{a['reward_accuracy'][0] - t['reward_accuracy'][0]:+.3f} (seed-to-seed sd {sd:.3f}), loss "
                f"{a['loss'][0] - t['loss'][0]:+.4f} (sd {max(a['loss'][1], t['loss'][1]):.4f})"
            )
    padded, packed = rows.get("anytrain dpo padded, uneven pairs"), rows.get("anytrain dpo packed, uneven pairs")
    if padded and packed:
        ratio = packed["tokens_per_s"] / padded["tokens_per_s"]
        median = packed["tokens_per_s_median"] / padded["tokens_per_s_median"]
        out.append(f"\nuneven pairs: packed / padded real tokens/s {ratio:.2f} (best runs), {median:.2f} (medians)")
    return "\n".join(out)


def main(argv=None) -> dict | None:
    args = toolkit.parser(__doc__, out="bench_out/dpo", rounds=3).parse_args(argv)
    if toolkit.trl_missing("the preference job"):
        return None
    out = toolkit.out_dir(args.out)
    data = {"even": dpo_job.write_data(out / "data"), "uneven": dpo_job.write_uneven_data(out / "data-uneven")}
    model = dpo_job.build_model(out / "model")
    runner = Runner(out)
    variants = [(name, variant(name, *rest, data, model)) for name, *rest in VARIANTS]
    return toolkit.peer_rounds(runner, variants, args.rounds, "dpo", dpo_job, summarise, table)


if __name__ == "__main__":
    main()
