"""anytrain's --task dpo and --task reward side by side with TRL's DPOTrainer and RewardTrainer (issue 34): the
preference job of peers/dpo_job.py through both, DPO with full fine-tuning (anytrain's cached reference against TRL's
default live reference model, and each the other way: anytrain --reference live, TRL precompute_ref_log_probs), DPO
with LoRA (both: the model with its adapter off), the reward model, and anytrain's DPO padded against --packing on
pairs of uneven length, in interleaved rounds (each round its own seed, the same for every variant). Per variant:
loop time (the start of training to the end of its last optimizer step, no evaluation), the process's peak resident
memory, real tokens/s (anytrain), and the held-out reward accuracy and DPO loss (reward models: pairwise accuracy and
Bradley-Terry loss) scored by one function for every trainer's saved model. Part of `make bench`'s peers section
when trl is installed (`make install-peers`); alone: `python benchmarks/dpo_vs_trl.py --rounds 3`."""

from functools import partial
from pathlib import Path

import toolkit
from peers import dpo_job
from toolkit import Runner

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
KINDS = {name: kind for name, _, kind, _ in VARIANTS}


def anytrain_run(runner: Runner, seed: int, name: str, kind: str, extra: list[str], data: Path, model: Path) -> dict:
    options = [*dpo_job.anytrain_options(kind, seed), *extra]
    return toolkit.anytrain_saved(runner, "dpo", name, data / "train", model, options)[0]


def trl_run(runner: Runner, seed: int, name: str, kind: str, extra: list[str], data: Path, model: Path) -> dict:
    args = ["--kind", "reward" if kind == "reward" else "dpo", "--seed", str(seed), *extra]
    return toolkit.trl_peer(runner, "dpo", name, "trl_dpo_job.py", data, model, args)


def variant(name: str, trainer: str, kind: str, extra: list[str], data: dict[str, Path], model: Path):
    uneven = extra[: len(UNEVEN)] == UNEVEN
    where = data["uneven" if uneven else "even"]
    run = trl_run if trainer == "trl" else anytrain_run
    go = partial(run, name=name, kind=kind, extra=extra, data=where, model=model)

    def scores(rec: dict) -> dict:
        if kind == "reward":
            return dpo_job.reward_scores(Path(rec["model"]), where)
        length = dpo_job.UNEVEN_LENGTH if uneven else dpo_job.MAX_LENGTH
        return dpo_job.dpo_scores(Path(rec["model"]), model, where, length)

    return toolkit.peer_variant("dpo", name, go, scores)


def summarise(records: list[dict]) -> dict:
    return toolkit.peer_rows(records, [name for name, *_ in VARIANTS], figures)


def figures(name: str, ok: list[dict]) -> dict:
    loss = "reward_loss" if KINDS[name] == "reward" else "dpo_loss"
    return {**toolkit.reward_figures(ok, loss), "loss_kind": loss}


def table(rows: dict) -> str:
    head = [*toolkit.REWARD_HEAD, "held-out loss (DPO; reward: Bradley-Terry)", "real tokens/s (best)", "trainable"]
    out = toolkit.peer_table([*head, "others' load"], rows, toolkit.reward_cells) + toolkit.reward_pairs(rows, PAIRS)
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
