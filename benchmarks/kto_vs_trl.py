"""anytrain's --task kto side by side with TRL 1.16's KTOTrainer: the unpaired preference job of peers/kto_job.py
through both, full fine-tuning (anytrain's defaults, a cached reference and its seeded KL pairs over shuffled rows,
against TRL's default live reference model and its rotated KL pairs over rows in order), anytrain with TRL's pairs and
order (--kl-pairs trl: the same batches and KL pairs as TRL's) and a live reference, TRL with its precomputed
reference, and LoRA (both: the model with its adapter off; anytrain also with --mmap-threshold-kb 512), in interleaved
rounds (each round its own seed, the same for every variant). Per variant: loop time (the start of training to the
end of its last optimizer step, no evaluation), the process's peak resident memory, real tokens/s (anytrain), and the
held-out reward accuracy and DPO loss of the implicit rewards, scored by one function for every trainer's saved
model. Needs trl and peft (`pip install -e ".[peers]"`): `python benchmarks/kto_vs_trl.py --rounds 3`."""

from functools import partial
from pathlib import Path

import toolkit
from peers import kto_job
from toolkit import Runner

TRL_LIKE = ["--kl-pairs", "trl", "--reference", "live"]  # TRL's KL pairs, its order of rows and its reference
VARIANTS = [  # (name, trainer, kind, extra options: anytrain's flags or trl_kto_job.py's)
    ("anytrain kto full", "anytrain", "full", []),
    ("trl kto full", "trl", "full", []),
    ("anytrain kto full, TRL's pairs, live reference", "anytrain", "full", TRL_LIKE),
    ("trl kto full, precomputed reference", "trl", "full", ["--precompute"]),
    ("anytrain kto lora", "anytrain", "lora", []),
    ("trl kto lora", "trl", "lora", ["--lora"]),
    ("anytrain kto lora, host blocks of 512 KB mapped apart", "anytrain", "lora", ["--mmap-threshold-kb", "512"]),
]
PAIRS = [  # (what, anytrain's variant, TRL's variant)
    ("KTO full, each trainer's defaults", "anytrain kto full", "trl kto full"),
    ("KTO full, the same pairs, order and live reference", "anytrain kto full, TRL's pairs, live reference",
     "trl kto full"),
    ("KTO full, both a precomputed reference", "anytrain kto full", "trl kto full, precomputed reference"),
    ("KTO LoRA", "anytrain kto lora", "trl kto lora"),
    ("KTO LoRA, anytrain --mmap-threshold-kb 512", "anytrain kto lora, host blocks of 512 KB mapped apart",
     "trl kto lora"),
]  # fmt: skip


def anytrain_run(runner: Runner, seed: int, name: str, kind: str, extra: list[str], data: Path, model: Path) -> dict:
    options = [*kto_job.anytrain_options(kind, seed), *extra]
    return toolkit.anytrain_saved(runner, "kto", name, data / "train", model, options)[0]


def trl_run(runner: Runner, seed: int, name: str, kind: str, extra: list[str], data: Path, model: Path) -> dict:
    args = ["--kind", "kto", "--seed", str(seed), *extra]
    return toolkit.trl_peer(runner, "kto", name, "trl_kto_job.py", data, model, args)


def variant(name: str, trainer: str, kind: str, extra: list[str], data: Path, model: Path):
    run = trl_run if trainer == "trl" else anytrain_run
    go = partial(run, name=name, kind=kind, extra=extra, data=data, model=model)
    return toolkit.peer_variant("kto", name, go, lambda rec: kto_job.scores(Path(rec["model"]), model, data))


def figures(name: str, ok: list[dict]) -> dict:
    return toolkit.reward_figures(ok, "dpo_loss")


def table(rows: dict) -> str:
    head = [*toolkit.REWARD_HEAD, "held-out DPO loss of the rewards", "real tokens/s (best)", "trainable"]
    head.append("others' load")
    return "\n".join(toolkit.peer_table(head, rows, toolkit.reward_cells) + toolkit.reward_pairs(rows, PAIRS))


def main(argv=None) -> dict | None:
    args = toolkit.parser(__doc__, out="bench_out/kto", rounds=3).parse_args(argv)
    if toolkit.trl_missing("the unpaired preference job"):
        return None
    out = toolkit.out_dir(args.out)
    data = kto_job.write_data(out / "data")
    model = kto_job.build_model(out / "model")
    runner = Runner(out)
    variants = [(name, variant(name, *rest, data, model)) for name, *rest in VARIANTS]
    summarise = partial(toolkit.peer_rows, names=[name for name, *_ in VARIANTS], row=figures)
    return toolkit.peer_rounds(runner, variants, args.rounds, "kto", kto_job, summarise, table)


if __name__ == "__main__":
    main()
