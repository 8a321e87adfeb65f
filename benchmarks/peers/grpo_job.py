"""The online-RL job that anytrain (`--task grpo`) and TRL's GRPOTrainer both run (no anytrain in it but the bundled
prompts' generator and sft_job's model).

The random Llama-style model of sft_job.py (width 256, 4 blocks, 4 heads with 2 key-value heads, SwiGLU MLP of
512, rotary positions; the 402-token byte-level BPE with ChatML's chat template), its generation config naming both
end tokens (end-of-text and ChatML's end-of-turn, where anytrain stops a chat completion), answering 400 prompts of
the bundled questions (`--dataset questions`: chats in TRL's conversational prompt form, with their `answer`
column). One reward function file for both trainers (anytrain `--reward rewards.py:ones`, TRL `reward_funcs=[ones]`):
the share of the completion's characters that are the digit 1, dense enough for a random model to climb within the
steps. 16 optimizer steps of 4 prompts x G = 8 completions (one generation per step), completions of at most 16
tokens sampled at temperature 1 and top-p 1, the DAPO loss (token-level, TRL 1.16's default), advantages scaled by
the group's standard deviation, clip epsilon 0.2, one update per rollout, no KL (beta 0: no reference model),
AdamW (weight decay 0), constant LR without warm-up, gradient norm clipped to 1.0, fp32, no gradient checkpointing,
the model's own generate (no vLLM); full fine-tuning at LR 1e-3 and LoRA (rank 8, alpha 16, every linear projection
of the blocks) at LR 3e-2. The reward curve is each trainer's own logged mean reward of each step's 32 completions.
(anytrain, which validates and tests at the end of a run, is given 16 + 16 held-out prompts; TRL evaluates nothing.)
"""  # the second paragraph is the job's description in docs/benchmarks.md

import json
from pathlib import Path

ROWS = {"train": 400, "validation": 16, "test": 16}  # anytrain validates and tests once, after the loop
PROMPTS, GENERATIONS, MAX_NEW_TOKENS, STEPS = 4, 8, 16, 16
LR = {"full": 1e-3, "lora": 3e-2}
LORA_R, LORA_ALPHA = 8, 16
EPSILON = 0.2
POSITIONS = 256  # room for the longest prompt and its completion: no truncation in either trainer
REWARDS = '''"""The reward both trainers are given (TRL's signature)."""


def ones(prompts, completions, completion_ids, **columns):
    """The share of the completion's characters that are the digit 1."""
    texts = [c[-1]["content"] for c in completions]
    return [t.count("1") / max(len(t), 1) for t in texts]
'''


def anytrain_options(kind: str, seed: int, rewards: Path) -> list[str]:
    """The job as anytrain options (src/train.py): kind full or lora."""
    options = ["--task", "grpo", "--reward", f"{rewards}:ones", "--num-generations", str(GENERATIONS)]
    options += ["--max-new-tokens", str(MAX_NEW_TOKENS), "--temperature", "1", "--top-p", "1", "--kl-beta", "0"]
    options += ["--grpo-loss", "dapo", "--scale-rewards", "group", "--epsilon", str(EPSILON), "--grpo-iterations", "1"]
    options += ["--batch-size", str(PROMPTS), "--max-steps", str(STEPS), "--lr", str(LR[kind]), "--weight-decay", "0"]
    options += ["--schedule", "constant", "--warmup-steps", "0", "--max-grad-norm", "1.0", "--log-every-steps", "1"]
    options += ["--eval-every-steps", "0", "--seed", str(seed), "--final-weights", "last"]  # TRL's model: the last
    return options + (["--lora-r", str(LORA_R), "--lora-alpha", str(LORA_ALPHA)] if kind == "lora" else [])


def write_data(folder: Path, seed: int = 11) -> Path:
    """DIR/{train,validation,test}.jsonl: prompt (the chat before the last answer) and answer, as --dataset questions
    has them; DIR/rewards.py: the reward function."""
    from anytrain.data.instructions import rows

    folder.mkdir(parents=True, exist_ok=True)
    chats, start = rows(sum(ROWS.values()), seed=seed), 0
    for split, count in ROWS.items():
        part = chats[start : start + count]
        lines = [json.dumps({"prompt": c["messages"][:-1], "answer": c["messages"][-1]["content"]}) for c in part]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
        start += count
    (folder / "rewards.py").write_text(REWARDS)
    return folder


def build_model(folder: Path) -> Path:
    """sft_job's random Llama-style model and chat tokenizer; its generation config stops at end-of-text and at
    ChatML's end-of-turn (TRL stops at the tokenizer's end-of-text and the generation config's end tokens, anytrain
    at end-of-text and the chat template's end-of-turn: the same two)."""
    try:
        from . import sft_job  # imported as peers.grpo_job (benchmarks/grpo_vs_trl.py)
    except ImportError:
        import sft_job
    from transformers import AutoTokenizer, GenerationConfig

    if (folder / "config.json").exists():
        return folder
    sft_job.build_model(folder, positions=POSITIONS)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = GenerationConfig.from_pretrained(folder)
    config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    config.save_pretrained(folder)
    return folder


def rewards_file(data: Path) -> Path:
    return data / "rewards.py"
