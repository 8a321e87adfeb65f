"""The unpaired preference job that anytrain (`--task kto`) and TRL's KTOTrainer both run (no anytrain in it but the
bundled data's generator and sft_job's model, through dpo_job).

dpo_job's random Llama-style model (width 256, 4 blocks, 402-token byte-level BPE with ChatML's template) trained with
KTO on 400 pairs of the bundled preference set unpaired into 800 rows (each pair's chosen answer desirable, its rejected
one undesirable: TRL's conversational prompt/completion/label form), written in a seeded shuffled order (TRL reads its
rows in order: written pair by pair, or chosen block then rejected block as TRL's own unpairing leaves them, its batches
would hold one class), 50 steps of 8 rows, AdamW (weight decay 0), constant LR without warm-up, gradient norm clipped
to 1.0, fp32, no gradient checkpointing, rows of up to 128 tokens padded per batch; loss kto, beta 0.1, desirable and
undesirable weights 1, full fine-tuning at LR 1e-4 and LoRA (rank 8, alpha 16, every linear projection of the blocks)
at LR 1e-3, the reference the starting model. Each trainer's saved model is scored by the same code on 400 held-out
pairs (dpo_job.dpo_scores): the share of pairs whose chosen answer gets the higher implicit reward beta x (log pi -
log pi_ref) and the mean sigmoid DPO loss of those rewards. (anytrain, which validates and tests at the end of a run,
is given 16 + 16 of the held-out pairs, unpaired, as its validation and test splits; TRL evaluates nothing.)
"""  # the second paragraph is the job's description

import json
import random
from pathlib import Path

try:
    from . import dpo_job  # imported as peers.kto_job (benchmarks/kto_vs_trl.py)
except ImportError:
    import dpo_job

ROWS = {"train": 400, "heldout": 400}  # pairs; each trains as 2 unpaired rows
EVAL_PAIRS = 16
BATCH, STEPS, MAX_LENGTH, LOG_EVERY = 8, 50, 128, 10
BETA = 0.1
LR = {"full": 1e-4, "lora": 1e-3}
LORA_R, LORA_ALPHA = 8, 16


def anytrain_options(kind: str, seed: int) -> list[str]:
    """The job as anytrain options (src/train.py): kind full or lora."""
    options = ["--task", "kto", "--kto-loss", "kto", "--beta", str(BETA), "--batch-size", str(BATCH)]
    options += ["--max-steps", str(STEPS), "--lr", str(LR[kind]), "--weight-decay", "0", "--schedule", "constant"]
    options += ["--warmup-steps", "0", "--max-grad-norm", "1.0", "--max-length", str(MAX_LENGTH)]
    options += ["--log-every-steps", str(LOG_EVERY), "--seed", str(seed), "--final-weights", "last"]
    return options + (["--lora-r", str(LORA_R), "--lora-alpha", str(LORA_ALPHA)] if kind == "lora" else [])


def unpaired(pairs: list[dict]) -> list[dict]:
    return [{"prompt": p["prompt"], "completion": p[side], "label": side == "chosen"}
            for p in pairs for side in ("chosen", "rejected")]  # fmt: skip


def write_data(folder: Path, seed: int = 13) -> Path:
    """DIR/train/ (train.jsonl: the unpaired training rows, shuffled; validation.jsonl and test.jsonl: EVAL_PAIRS
    held-out pairs each, unpaired) and DIR/heldout.jsonl (the held-out pairs, for dpo_job.dpo_scores)."""
    from anytrain.data.preferences import rows

    pairs = [{k: p[k] for k in ("prompt", "chosen", "rejected")} for p in rows(sum(ROWS.values()), seed=seed)]
    train, heldout = pairs[: ROWS["train"]], pairs[ROWS["train"] :]
    shuffled = unpaired(train)
    random.Random(seed).shuffle(shuffled)
    parts = {"train": shuffled, "validation": unpaired(heldout[:EVAL_PAIRS]),
             "test": unpaired(heldout[EVAL_PAIRS : 2 * EVAL_PAIRS])}  # fmt: skip
    (folder / "train").mkdir(parents=True, exist_ok=True)
    for split, part in parts.items():
        (folder / "train" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    (folder / "heldout.jsonl").write_text("".join(json.dumps(p) + "\n" for p in heldout))
    return folder


def build_model(folder: Path) -> Path:
    return dpo_job.build_model(folder)


def scores(model_folder: Path, reference_folder: Path, data: Path) -> dict:
    """The held-out reward accuracy and DPO loss of the implicit rewards (the same code for every trainer's model)."""
    return dpo_job.dpo_scores(model_folder, reference_folder, data, MAX_LENGTH)
