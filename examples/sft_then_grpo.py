"""SFT, then GRPO from the SFT run's hf/ folder (issue 40): does online RL with a verifiable reward raise what the
SFT model does on held-out questions, above the same number of extra steps spent on SFT instead, and how close
does it get to the SFT model's pass@G (the share of questions that one of its G samples answers right)?

For each seed, every stage an anytrain run in OUT/seed-N/STAGE:
    sft        --task sft on the bundled `instructions` chats, --sft-steps steps
    grpo       --task grpo --model hf:OUT/seed-N/sft/hf --dataset questions --reward answer: the same questions as
               prompts, each answer checked exactly; --steps steps of --prompts prompts x G completions
    more-sft   control: the SFT continued from the same hf/ folder on `instructions` for --steps steps
One function then scores every hf/ folder on the same held-out questions, generated with another seed and asked
in neither training set, through the chat template: greedy exact match, the mean reward (exact match) of one
sampled answer per question at temperature 1, and pass@G of G sampled answers. It prints a table and writes
OUT/results.json.

    python examples/sft_then_grpo.py --tiny --out runs/sft_then_grpo --seeds 1 2
    python examples/sft_then_grpo.py --model path/to/chat-llm --out runs/sft_then_grpo   # a chat-template causal LM

--tiny builds the tests' random Llama (tests/hfmodels.py: 64 wide, 2 layers, a ChatML template) in OUT/tiny.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from anytrain.data import instructions  # noqa: E402

HELDOUT_SEED = 20261127  # neither instructions' seed nor the DPO study's held-out one


def held_out(count: int) -> list[dict]:
    """`count` generated questions (prompt, answer) asked nowhere in the bundled instructions (and questions) set."""
    seen = {m["content"] for row in instructions.rows() for m in row["messages"] if m["role"] == "user"}
    fresh = []
    for row in instructions.rows(4 * count, HELDOUT_SEED):
        prompt, answer = row["messages"][:-1], row["messages"][-1]["content"]
        if prompt[-1]["content"] not in seen:
            fresh.append({"prompt": prompt, "answer": answer})
    return fresh[:count]


def score(folder: Path, rows: list[dict], generations: int, batch: int = 64) -> dict:
    """Greedy exact match, the mean exact match of one sampled answer, and pass@G, of the hf/ folder on the rows."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stops = sorted({tokenizer.eos_token_id, *([end] if end not in (None, tokenizer.unk_token_id) else [])})
    right = {"greedy": [], "sampled": [], "pass": []}
    torch.manual_seed(0)
    for start in range(0, len(rows), batch):
        part = rows[start : start + batch]
        texts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in part]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        common = {"max_new_tokens": 16, "eos_token_id": stops, "pad_token_id": stops[0], **enc}
        with torch.no_grad():
            greedy = model.generate(do_sample=False, **common)
            sampled = model.generate(do_sample=True, temperature=1.0, num_return_sequences=generations, **common)
        width = enc["input_ids"].shape[1]
        said = [tokenizer.decode(r[width:], skip_special_tokens=True).strip() for r in greedy]
        samples = [tokenizer.decode(r[width:], skip_special_tokens=True).strip() for r in sampled]
        for k, row in enumerate(part):
            mine = samples[k * generations : (k + 1) * generations]
            right["greedy"].append(said[k] == row["answer"])
            right["sampled"].append(mine[0] == row["answer"])
            right["pass"].append(any(s == row["answer"] for s in mine))
    return {name: statistics.mean(values) for name, values in right.items()}


def train(out: Path, *flags: str) -> float:
    """One anytrain run into `out` (its log beside it); its wall time."""
    start = time.perf_counter()
    cmd = [sys.executable, str(ROOT / "src" / "train.py"), "--output-dir", str(out), "--overwrite", "--no-progress",
           "--no-plot", "--eval-every-steps", "0", *flags]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with (out.parent / f"{out.name}.log").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, timeout=7200)
    return time.perf_counter() - start


def one_seed(model: Path, seed: int, args: argparse.Namespace, rows: list[dict]) -> dict:
    base = args.out / f"seed-{seed}"
    base.mkdir(parents=True, exist_ok=True)
    held = ["--val-fraction", "0.02", "--test-fraction", "0.02"]  # 80 prompts each: a run's own evaluation is short
    sft, common = base / "sft", ["--seed", str(seed), "--max-length", "128", *held]
    seconds = {"sft": train(sft, "--model", f"hf:{model}", "--dataset", "instructions", "--batch-size", "32",
                            "--max-steps", str(args.sft_steps), "--lr", str(args.sft_lr), *common)}  # fmt: skip
    start = ["--model", f"hf:{sft / 'hf'}", "--max-steps", str(args.steps), *common]
    seconds["grpo"] = train(base / "grpo", *start, "--dataset", "questions", "--reward", "answer", "--batch-size",
                            str(args.prompts), "--num-generations", str(args.generations), "--max-new-tokens", "16",
                            "--lr", str(args.lr), "--grpo-loss", args.loss)  # fmt: skip
    if args.controls:
        seconds["more-sft"] = train(base / "more-sft", *start, "--dataset", "instructions", "--batch-size", "32",
                                    "--lr", str(args.control_lr))  # fmt: skip
    scores = {stage: score(base / stage / "hf", rows, args.generations) for stage in seconds}
    return {"seed": seed, "scores": scores, "seconds": seconds}


def table(results: list[dict], generations: int) -> str:
    stages = list(results[0]["scores"])
    lines = ["| stage | greedy exact match | sampled reward | pass@" + str(generations) + " | seconds |",
             "|---|---|---|---|---|"]  # fmt: skip
    for stage in stages:
        mean = {k: statistics.mean(r["scores"][stage][k] for r in results) for k in ("greedy", "sampled", "pass")}
        seeds = " / ".join(f"{r['scores'][stage]['greedy']:.3f}" for r in results)
        secs = statistics.mean(r["seconds"][stage] for r in results)
        lines.append(f"| {stage} | {mean['greedy']:.3f} ({seeds}) | {mean['sampled']:.3f} | {mean['pass']:.3f} | "
                     f"{secs:.0f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="a transformers causal LM folder with a chat template")
    p.add_argument("--tiny", action="store_true", help="build the tests' random Llama (tests/hfmodels.py) instead")
    p.add_argument("--out", type=Path, default=Path("runs/sft_then_grpo"), help="the study's folder")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="one study per seed")
    p.add_argument("--sft-steps", type=int, default=600, help="optimizer steps of SFT")
    p.add_argument("--sft-lr", type=float, default=3e-3)
    p.add_argument("--steps", type=int, default=200, help="optimizer steps of GRPO and of the control")
    p.add_argument("--prompts", type=int, default=16, help="GRPO: prompts per step")
    p.add_argument("--generations", type=int, default=8, help="GRPO: completions per prompt (G), and pass@G's")
    p.add_argument("--lr", type=float, default=3e-4, help="GRPO's learning rate")
    p.add_argument("--loss", default="dapo", choices=["dapo", "grpo", "dr_grpo"])
    p.add_argument("--controls", action=argparse.BooleanOptionalAction, default=True, help="run more-sft")
    p.add_argument("--control-lr", type=float, default=1e-3, help="the control's learning rate")
    p.add_argument("--heldout", type=int, default=500, help="held-out questions scored")
    args = p.parse_args(argv)
    if args.tiny:
        from hfmodels import tiny_llama

        model = args.out / "tiny"
        if not (model / "config.json").exists():
            tiny_llama(model)
    elif args.model is None:
        p.error("give --model FOLDER or --tiny")
    else:
        model = args.model
    rows = held_out(args.heldout)
    results = [one_seed(model, seed, args, rows) for seed in args.seeds]
    print(table(results, args.generations))
    (args.out / "results.json").write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "results": results},
                                                      indent=1, default=str))  # fmt: skip
    return {"results": results}


if __name__ == "__main__":
    main()
