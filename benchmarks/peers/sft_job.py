"""The chat fine-tuning job that anytrain (`--task sft`) and TRL's SFTTrainer both run (no anytrain in it).

A Llama-style causal LM built here at random (width 256, 4 blocks, 4 heads with 2 key-value heads, SwiGLU
MLP of 512, rotary positions; a 402-token byte-level BPE with ChatML's turn markers and chat template),
fine-tuned on 2,000 generated chats in prompt/completion form (the last assistant turn is the completion,
everything before it the prompt), loss on the completion's tokens only, batch 16, 2 epochs, AdamW
(weight decay 0), constant LR without warm-up, gradient norm clipped to 1.0, fp32, no gradient
checkpointing, rows of up to 128 tokens padded per batch; full fine-tuning at LR 1e-3 and LoRA (rank 8,
alpha 16, every linear projection of the blocks) at LR 1e-2. Each trainer's model is then scored by the
same code: the mean cross-entropy of the completions' tokens of 200 held-out chats. The wide-head variant
gives the same model an output layer of 32,768 rows (the tokenizer's 402 tokens, the rest never targets) as
real models' vocabularies have, where the logits are a step's largest tensor, for 40 steps.
"""  # the second paragraph is the job's description in docs/benchmarks.md

import json
from pathlib import Path

ROWS = {"train": 2000, "validation": 200, "test": 200}  # TRL evaluates nothing; anytrain validates each epoch
BATCH, EPOCHS, MAX_LENGTH, LOG_EVERY = 16, 2, 128, 10
LR = {"full": 1e-3, "lora": 1e-2}
LORA_R, LORA_ALPHA = 8, 16
WIDE_VOCABULARY, WIDE_STEPS = 32768, 40  # the wide-head variant
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def anytrain_options(kind: str, seed: int) -> list[str]:
    """The job as anytrain options (src/train.py)."""
    options = ["--batch-size", str(BATCH), "--epochs", str(EPOCHS), "--lr", str(LR[kind]), "--weight-decay", "0"]
    options += ["--schedule", "constant", "--warmup-steps", "0", "--max-grad-norm", "1.0", "--max-length"]
    options += [str(MAX_LENGTH), "--log-every-steps", str(LOG_EVERY), "--seed", str(seed), "--task", "sft"]
    options += ["--final-weights", "last"]  # TRL's model is the last step's
    return options + (["--lora-r", str(LORA_R), "--lora-alpha", str(LORA_ALPHA)] if kind == "lora" else [])


def write_data(folder: Path, seed: int = 11) -> Path:
    """DIR/{train,validation,test}.jsonl: prompt (the turns before the last answer) and completion (that answer)."""
    from anytrain.data.instructions import rows

    folder.mkdir(parents=True, exist_ok=True)
    chats = rows(sum(ROWS.values()), seed=seed)
    start = 0
    for split, count in ROWS.items():
        lines = [
            json.dumps({"prompt": c["messages"][:-1], "completion": c["messages"][-1:]})
            for c in chats[start : start + count]
        ]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
        start += count
    return folder


SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4}


def build_model(
    folder: Path, vocabulary: int | None = None, positions: int = MAX_LENGTH, shape: dict | None = None
) -> Path:
    """The random Llama-style model and its chat tokenizer, saved as a hub checkpoint; `vocabulary`: that many
    rows of embeddings and output layer instead of the tokenizer's size; `positions`: its max_position_embeddings;
    `shape`: LlamaConfig sizes instead of SHAPE's (scripts/gpu_truth.py's 100 M model)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from anytrain.data.text import SHAKESPEARE_PATH

    if (folder / "config.json").exists():
        return folder
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(SHAKESPEARE_PATH.read_text(encoding="utf-8")[:100_000].split("\n\n"), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.pad_token, tokenizer.chat_template = tokenizer.eos_token, CHATML
    config = LlamaConfig(
        vocab_size=vocabulary or len(tokenizer), num_key_value_heads=2, max_position_embeddings=positions,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        **{**SHAPE, **(shape or {})},
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def completion_loss(model_folder: Path, data: Path) -> float:
    """The mean cross-entropy over the test completions' tokens (each chat rendered by the chat template; the
    prompt with the generation prompt, masked), the same code for every trainer's model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    total, count = 0.0, 0
    for line in (data / "test.jsonl").read_text().splitlines():
        row = json.loads(line)
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        full = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
        ids = tokenizer(full, add_special_tokens=False, return_tensors="pt").input_ids[:, :MAX_LENGTH]
        start = len(tokenizer(prompt, add_special_tokens=False).input_ids)
        labels = ids.clone()
        labels[:, :start] = -100
        with torch.no_grad():
            logits = model(ids).logits[:, :-1].float()
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels[:, 1:], reduction="sum")
        total, count = total + losses.item(), count + int((labels[:, 1:] != -100).sum())
    return total / count
