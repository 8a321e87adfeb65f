"""The tool-use RL job that anytrain (`--task grpo --tools`) and TRL's GRPOTrainer(tools=...) both run (no anytrain
in it but the bundled sums, their tool and the tests' tool-calling model).

The tests' random Llama (tests/hfmodels.py, 64 wide, 2 layers; a ChatML template that renders tools, Qwen 2.5's
layout, and its response template, so that transformers parses the calls), first taught to call by 150 steps of
anytrain sft on the bundled `tool-sums` (the same start for both trainers), its generation config naming both end
tokens (end-of-text and ChatML's end-of-turn, as a ChatML model's does), then answering 200 of the bundled
`sum-questions` with one tool, `add(a, b)`, shown by the template and run on each parsed call (up to 4 calls a
completion). Two reward functions (TRL's signature) for both: `right`, 1 where the last reply is the sum, and
`called`, 1 where the completion called a tool. 10 optimizer steps of 4 prompts x G = 8 completions, temperature 1,
the dapo loss, advantages scaled by group, no KL, AdamW at LR 3e-4 (weight decay 0), constant, clipped at 1.0, fp32,
the model's own generate. A completion's length limit: 128 of the model's own tokens in anytrain (the tools'
answers do not count), 160 tokens in all in TRL (`max_completion_length` counts the tools' tokens too): both leave
room for a call, its answer and the reply.
"""

import json
import sys
from pathlib import Path

PROMPTS, GENERATIONS, STEPS, LR, SFT_STEPS = 4, 8, 10, 3e-4, 150
OWN_TOKENS, ALL_TOKENS, MAX_CALLS = 128, 160, 4
ROWS = {"train": 200, "validation": 8, "test": 8}
REWARDS = '''"""The rewards both trainers are given (TRL's signature; completions as their messages)."""


def right(prompts, completions, completion_ids, answer, **columns):
    return [float((c[-1].get("content") or "").strip() == a) for c, a in zip(completions, answer)]


def called(prompts, completions, completion_ids, **columns):
    return [float(any(m["role"] == "tool" for m in c)) for c in completions]
'''


def write_data(folder: Path) -> Path:
    """DIR/{train,validation,test}.jsonl (prompt, answer) and DIR/rewards.py; the tool is the bundled sums' add."""
    from anytrain.data.sums import load_sum_questions

    folder.mkdir(parents=True, exist_ok=True)
    rows, start = list(load_sum_questions(sum(ROWS.values()))), 0
    for split, count in ROWS.items():
        part = rows[start : start + count]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
        start += count
    (folder / "rewards.py").write_text(REWARDS)
    return folder


def build_model(folder: Path, root: Path) -> Path:
    """The tests' tool-calling Llama, after SFT_STEPS steps of anytrain sft on tool-sums: FOLDER/sft/hf."""
    import os
    import subprocess

    done = folder / "sft" / "hf"
    if (done / "config.json").exists():
        return stops_at_end_of_turn(done)
    make = f"from hfmodels import tiny_llama; tiny_llama({str(folder / 'tiny')!r}, tools=True)"  # the tests' builder
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "tests"), str(root / "src")])}
    subprocess.run([sys.executable, "-c", make], check=True, capture_output=True, timeout=600, env=env)
    cmd = [sys.executable, str(root / "src" / "train.py"), "--model", f"hf:{folder / 'tiny'}", "--dataset", "tool-sums",
           "--max-length", "1024", "--batch-size", "16", "--max-steps", str(SFT_STEPS), "--lr", "3e-3",
           "--val-fraction", "0.005", "--test-fraction", "0.005", "--eval-every-steps", "0", "--no-progress",
           "--no-plot", "--output-dir", str(folder / "sft"), "--overwrite"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=3600)
    return stops_at_end_of_turn(done)


def stops_at_end_of_turn(folder: Path) -> Path:
    """The model's generation config names both end tokens, end-of-text and ChatML's end-of-turn, as a ChatML model's
    (Qwen's) does: TRL stops at the generation config's end tokens (without it every turn ran to the limit and no
    tool's answer fitted), anytrain also at the template's end of turn."""
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = GenerationConfig.from_pretrained(folder)
    config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    config.save_pretrained(folder)
    return folder


def anytrain_options(seed: int, data: Path) -> list[str]:
    options = ["--task", "grpo", "--tools", "anytrain.data.sums:add", "--max-tool-calls", str(MAX_CALLS)]
    options += ["--reward", f"{data / 'rewards.py'}:right", f"{data / 'rewards.py'}:called"]
    options += ["--num-generations", str(GENERATIONS), "--max-new-tokens", str(OWN_TOKENS), "--temperature", "1"]
    options += ["--grpo-loss", "dapo", "--scale-rewards", "group", "--kl-beta", "0", "--batch-size", str(PROMPTS)]
    options += ["--max-steps", str(STEPS), "--lr", str(LR), "--weight-decay", "0", "--schedule", "constant"]
    options += ["--warmup-steps", "0", "--max-grad-norm", "1.0", "--log-every-steps", "1", "--eval-every-steps", "0"]
    return options + ["--seed", str(seed), "--final-weights", "last"]
