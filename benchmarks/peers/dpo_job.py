"""The preference-tuning job that anytrain (`--task dpo`, `--task reward`) and TRL's DPOTrainer and RewardTrainer
all run (no anytrain in it but the bundled data's generator and sft_job's model).

The random Llama-style model of sft_job.py (width 256, 4 blocks, 4 heads with 2 key-value heads, SwiGLU MLP of
512, rotary positions, 512 positions; the 402-token byte-level BPE with ChatML's chat template), trained on 400 pairs
of the bundled preference set (`--dataset preferences`: a question, its right answer as chosen, a near miss as
rejected, in TRL's conversational prompt/chosen/rejected form), one epoch of 50 steps of 8 pairs, AdamW (weight
decay 0), constant LR without warm-up, gradient norm clipped to 1.0, fp32, no gradient checkpointing, pairs of up to
128 tokens padded per batch. DPO: sigmoid loss, beta 0.1, full fine-tuning at LR 1e-4 and LoRA (rank 8, alpha 16,
every linear projection of the blocks) at LR 1e-3, the reference the starting model; reward model: the same model
with a one-output score head (AutoModelForSequenceClassification), Bradley-Terry loss, LR 1e-4. Each trainer's
saved model is then scored by the same code on 400 held-out pairs: a DPO model by its reward accuracy (the share of
pairs whose chosen answer gets the higher implicit reward beta x (log pi - log pi_ref), summed over the answer's
tokens, the reference the starting model) and its mean sigmoid DPO loss; a reward model by its pairwise accuracy
and mean Bradley-Terry loss. (anytrain, which validates and tests at the end of a run, is given 16 + 16 of the
held-out pairs as its validation and test splits; TRL evaluates nothing.)
Packing: the same DPO job on pairs whose prompts carry a Tiny Shakespeare passage of 50 to 650 characters in half of
them (sequences of 27 to 451 tokens, mean 153: 59 % of a padded batch is padding) at a max length of 512, 20 steps,
padded per batch against --packing.
"""  # the second paragraph is the job's description in docs/benchmarks.md

import json
import random
from pathlib import Path

ROWS = {"train": 400, "heldout": 400}
EVAL_PAIRS = 16  # anytrain's validation and test splits (from the held-out pairs): the least evaluation it allows
BATCH, STEPS, MAX_LENGTH, LOG_EVERY = 8, 50, 128, 10
UNEVEN_LENGTH, UNEVEN_STEPS = 512, 20  # the packing job
BETA = 0.1
LR = {"full": 1e-4, "lora": 1e-3, "reward": 1e-4}
LORA_R, LORA_ALPHA = 8, 16
PASSAGE_CHARS = 650  # uneven prompts: a passage of up to this many characters, in half of them


def anytrain_options(kind: str, seed: int, steps: int = STEPS) -> list[str]:
    """The job as anytrain options (src/train.py): kind full or lora (--task dpo) or reward (--task reward)."""
    options = ["--batch-size", str(BATCH), "--max-steps", str(steps), "--lr", str(LR[kind]), "--weight-decay", "0"]
    options += ["--schedule", "constant", "--warmup-steps", "0", "--max-grad-norm", "1.0", "--max-length"]
    options += [str(MAX_LENGTH), "--log-every-steps", str(LOG_EVERY), "--seed", str(seed)]
    options += ["--final-weights", "last"]  # TRL's model is the last step's
    if kind == "reward":
        return [*options, "--task", "reward"]
    options += ["--task", "dpo", "--dpo-loss", "sigmoid", "--beta", str(BETA)]
    return options + (["--lora-r", str(LORA_R), "--lora-alpha", str(LORA_ALPHA)] if kind == "lora" else [])


def write_data(folder: Path, seed: int = 11) -> Path:
    """DIR/train/ (the training pairs) and DIR/heldout.jsonl: prompt, chosen, rejected as messages."""
    from anytrain.data.preferences import rows

    pairs = rows(sum(ROWS.values()), seed=seed)
    return save(folder, pairs)


def write_uneven_data(folder: Path, seed: int = 12) -> Path:
    """The same kind of pairs, each prompt's question after a Tiny Shakespeare passage of 0 (half the pairs) to
    PASSAGE_CHARS characters: sequences of widely different lengths, most of a padded batch padding."""
    from anytrain.data.bundled import SHAKESPEARE_PATH
    from anytrain.data.preferences import rows

    text, rng = SHAKESPEARE_PATH.read_text(encoding="utf-8"), random.Random(seed)
    pairs = rows(sum(ROWS.values()), seed=seed)
    for pair in pairs:
        if rng.random() < 0.5:
            continue
        start = rng.randrange(len(text) - PASSAGE_CHARS)
        passage = text[start : start + rng.randint(50, PASSAGE_CHARS)].strip()
        pair["prompt"][-1]["content"] = f"Read this first:\n{passage}\n\n{pair['prompt'][-1]['content']}"
    return save(folder, pairs)


def save(folder: Path, pairs: list[dict]) -> Path:
    """DIR/heldout.jsonl and DIR/train/: train.jsonl, and for anytrain, which validates at the end and tests, the first
    EVAL_PAIRS held-out pairs as validation.jsonl and the next as test.jsonl (TRL reads train.jsonl alone)."""
    (folder / "train").mkdir(parents=True, exist_ok=True)
    keep = ("prompt", "chosen", "rejected")
    lines = [json.dumps({k: p[k] for k in keep}) for p in pairs]
    train, heldout = lines[: ROWS["train"]], lines[ROWS["train"] :]
    parts = {"train": train, "validation": heldout[:EVAL_PAIRS], "test": heldout[EVAL_PAIRS : 2 * EVAL_PAIRS]}
    for split, rows in parts.items():
        (folder / "train" / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    (folder / "heldout.jsonl").write_text("\n".join(heldout) + "\n")
    return folder


def build_model(folder: Path) -> Path:
    """sft_job's random Llama-style model and chat tokenizer, with UNEVEN_LENGTH positions."""
    try:
        from . import sft_job  # imported as peers.dpo_job (benchmarks/dpo_vs_trl.py)
    except ImportError:
        import sft_job

    return sft_job.build_model(folder, positions=UNEVEN_LENGTH)


def encoded(tokenizer, pairs: list[dict], max_length: int = MAX_LENGTH) -> list[tuple[list[int], int]]:
    """Each pair's two sequences (chosen, then rejected): (token ids cut at max_length, where the answer starts). The
    prompt is rendered with the generation prompt; the answer is every token after it (its end-of-turn too)."""
    out = []
    for row in pairs:
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        start = len(tokenizer(prompt, add_special_tokens=False).input_ids)
        for answer in (row["chosen"], row["rejected"]):
            full = tokenizer.apply_chat_template(row["prompt"] + answer, tokenize=False)
            assert full.startswith(prompt), "the chat template must render the answer after the generation prompt"
            ids = tokenizer(full, add_special_tokens=False).input_ids[:max_length]
            out.append((ids, start))
    return out


def padded(seqs: list[tuple[list[int], int]], pad_id: int):
    """input_ids, attention_mask and the answer's mask of sequences padded on the right."""
    import torch

    width = max(len(ids) for ids, _ in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask, answer = torch.zeros_like(ids), torch.zeros_like(ids, dtype=torch.bool)
    for k, (seq, start) in enumerate(seqs):
        ids[k, : len(seq)], mask[k, : len(seq)], answer[k, start : len(seq)] = torch.tensor(seq), 1, True
    return ids, mask, answer


def answer_logps(model, seqs: list, pad_id: int, batch: int = 32):
    """Each sequence's summed log-probability of its answer's tokens."""
    import torch

    out = []
    for k in range(0, len(seqs), batch):
        ids, mask, answer = padded(seqs[k : k + batch], pad_id)
        with torch.no_grad():
            logps = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float().log_softmax(-1)
        picked = logps.gather(2, ids[:, 1:, None]).squeeze(2)
        out.append((picked * answer[:, 1:]).sum(1))
    return torch.cat(out)


def dpo_scores(model_folder: Path, reference_folder: Path, data: Path, max_length: int = MAX_LENGTH) -> dict:
    """A DPO model's held-out reward accuracy and mean sigmoid DPO loss (beta BETA), the reference the starting model
    (reference_folder), sequences cut at max_length: the same code for every trainer's model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reference_folder)
    pairs = [json.loads(line) for line in (data / "heldout.jsonl").read_text().splitlines()]
    seqs = encoded(tokenizer, pairs, max_length)
    logps = {}
    for name, folder in (("policy", model_folder), ("reference", reference_folder)):
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        logps[name] = answer_logps(model, seqs, tokenizer.pad_token_id)
    ratio = logps["policy"] - logps["reference"]
    margin = BETA * (ratio[0::2] - ratio[1::2])  # chosen reward - rejected reward
    loss = -torch.nn.functional.logsigmoid(margin)
    return {"reward_accuracy": (margin > 0).double().mean().item(), "dpo_loss": loss.mean().item()}


def reward_scores(model_folder: Path, data: Path, batch: int = 32) -> dict:
    """A reward model's held-out pairwise accuracy (the chosen answer scored above the rejected one) and mean
    Bradley-Terry loss: the same code for every trainer's model."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    model = AutoModelForSequenceClassification.from_pretrained(model_folder).eval()
    assert model.config.num_labels == 1, f"{model_folder}: a reward model has one output"
    pairs = [json.loads(line) for line in (data / "heldout.jsonl").read_text().splitlines()]
    seqs = encoded(tokenizer, pairs)
    model.config.pad_token_id = tokenizer.pad_token_id  # the score is the last token's before the padding
    scores = []
    for k in range(0, len(seqs), batch):
        ids, mask, _ = padded(seqs[k : k + batch], tokenizer.pad_token_id)
        with torch.no_grad():
            scores.append(model(input_ids=ids, attention_mask=mask).logits.float()[:, 0])
    score = torch.cat(scores)
    margin = score[0::2] - score[1::2]
    loss = -torch.nn.functional.logsigmoid(margin)
    return {"reward_accuracy": (margin > 0).double().mean().item(), "reward_loss": loss.mean().item()}
