"""Teach a causal LM to use a calculator, then reinforce it (issue 47): SFT on the bundled tool-calling chats, then
GRPO with the tool, each measured on held-out sums, against the same steps of SFT instead.

For each seed, every stage an anytrain run in OUT/seed-N/STAGE:
    sft        --task sft --dataset tool-sums: chats in TRL's tool-calling format (a sum, the add call, the tool's
               answer, the reply; a fifth first call add without b, read the error and call again), --sft-steps
    grpo       --task grpo --model hf:OUT/seed-N/sft/hf --dataset sum-questions --tools anytrain.data.sums:add
               --reward answer OUT/rewards.py:clean_calls: the model calls the tool during its rollouts, the reply
               is checked exactly, and (--clean-calls, the default) a completion whose calls all ran without an
               error earns 1 more
    more-sft   control: the SFT continued from the same hf/ folder for --steps steps
One function then answers the same held-out sums (another seed's, in neither training set) with every hf/ folder,
through anytrain's own rollout code (tasks/causal_lm/turns.py: the calls parsed, run and answered as in training):
greedy, and G sampled answers at temperature 1. For each: the share of answers that called add, the share of calls
that were well formed (parsed, and ran without an error: the malformed turns count as calls that were not), the
share whose final reply is the sum; pass@G of the sampled ones. It prints a table and writes OUT/results.json.

    python examples/tool_use.py --tiny --out runs/tool_use --seeds 1
    python examples/tool_use.py --model path/to/chat-llm --out runs/tool_use   # its template must render tools

--tiny builds the tests' random Llama with a tool-calling ChatML template (tests/hfmodels.py, its response
template set so transformers parses the calls) in OUT/tiny.
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

from anytrain.data import sums  # noqa: E402

HELDOUT_SEED = sums.SEED + 7  # neither the chats' seed nor the questions'


def held_out(count: int) -> list[dict]:
    seen = {r["messages"][0]["content"] for r in sums.rows()}
    fresh = [r for r in sums.rows(2 * count, HELDOUT_SEED) if r["messages"][0]["content"] not in seen]
    return [{"prompt": r["messages"][:1], "answer": r["answer"]} for r in fresh[:count]]


def answer_all(folder: Path, rows: list[dict], keys, max_new_tokens: int) -> list:
    """Each row answered once (keys: one per answer, sampled; None: greedy) as conversations with the add tool."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anytrain.tasks.causal_lm.generation import Sampling, stop_ids
    from anytrain.tasks.causal_lm.turns import Conversation, Toolkit, converse

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    schemas = sums.schema()
    stops = stop_ids(tokenizer, model.generation_config.eos_token_id, True)
    kit = Toolkit(tokenizer, stops, model.config.max_position_embeddings, 4, 5.0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    sampling = Sampling(max_new_tokens, tuple(stops), pad)
    talks = []
    for start in range(0, len(rows), 32):
        part = [
            Conversation(tokenizer(tokenizer.apply_chat_template(r["prompt"], tools=schemas, tokenize=False,
                                                                 add_generation_prompt=True)).input_ids,
                         {"add": sums.add}, schemas) for r in rows[start : start + 32]
        ]  # fmt: skip
        with torch.no_grad():
            converse(model, part, None if keys is None else keys[start : start + 32], sampling, kit)
        talks += part
    return talks


def measured(talks: list, rows: list[dict]) -> dict:
    calls = sum(t.calls for t in talks) + sum(t.malformed for t in talks)
    right = [(t.messages[-1].get("content") or "").strip() == r["answer"] for t, r in zip(talks, rows)]
    return {"called": statistics.mean(t.calls > 0 for t in talks),
            "well_formed": (sum(t.calls - t.failed for t in talks) / calls) if calls else 0.0,
            "right": statistics.mean(right)}  # fmt: skip


def score(folder: Path, rows: list[dict], generations: int, max_new_tokens: int) -> dict:
    """Greedy and sampled figures of the hf/ folder on the rows, and pass@G of the sampled answers."""
    import torch

    from anytrain.tasks.causal_lm.generation import completion_keys

    greedy = measured(answer_all(folder, rows, None, max_new_tokens), rows)
    many = [r for r in rows for _ in range(generations)]
    keys = completion_keys(11, 3, 0, torch.arange(len(rows)), generations)
    talks = answer_all(folder, many, keys, max_new_tokens)
    sampled = measured(talks, many)
    hits = [(t.messages[-1].get("content") or "").strip() == r["answer"] for t, r in zip(talks, many)]
    passed = statistics.mean(any(hits[k * generations : (k + 1) * generations]) for k in range(len(rows)))
    return {"greedy": greedy, "sampled": sampled, "pass": passed}


def train(out: Path, *flags: str) -> float:
    """One anytrain run into `out` (its log beside it); its wall time."""
    start = time.perf_counter()
    cmd = [sys.executable, str(ROOT / "src" / "train.py"), "--output-dir", str(out), "--overwrite", "--no-progress",
           "--no-plot", "--eval-every-steps", "0", *flags]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    with (out.parent / f"{out.name}.log").open("w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, timeout=7200)
    return time.perf_counter() - start


CLEAN_CALLS = '''
def clean_calls(prompts, completions, completion_ids, **columns):
    """1.0 where the completion called a tool and no tool answered with an error (TRL's signature)."""
    return [float(any(m["role"] == "tool" for m in c) and not any(m["role"] == "tool" and m["content"].startswith(
        "{'error'") for m in c)) for c in completions]
'''


def write_rewards(out: Path) -> Path:
    """OUT/rewards.py: `clean_calls`, the reward for calls that ran without an error (--clean-calls)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "rewards.py").write_text(CLEAN_CALLS)
    return out / "rewards.py"


def one_seed(model: Path, seed: int, args: argparse.Namespace, rows: list[dict]) -> dict:
    base = args.out / f"seed-{seed}"
    base.mkdir(parents=True, exist_ok=True)
    held = ["--val-fraction", "0.005", "--test-fraction", "0.005"]  # 20 rows each: a run's own evaluation is short
    sft, common = base / "sft", ["--seed", str(seed), *held]
    seconds = {"sft": 0.0}
    if not (args.reuse_sft and (sft / "hf" / "config.json").exists()):
        seconds["sft"] = train(sft, "--model", f"hf:{model}", "--dataset", "tool-sums", "--batch-size", "16",
                               "--max-steps", str(args.sft_steps), "--lr", str(args.sft_lr), "--max-length", "1024",
                               *common)  # fmt: skip
    start = ["--model", f"hf:{sft / 'hf'}", "--max-steps", str(args.steps), *common]
    rewards = ["answer"] + ([f"{write_rewards(args.out)}:clean_calls"] if args.clean_calls else [])
    seconds["grpo"] = train(base / "grpo", *start, "--dataset", "sum-questions", "--tools", "anytrain.data.sums:add",
                            "--reward", *rewards, "--batch-size", str(args.prompts), "--num-generations",
                            str(args.generations), "--max-new-tokens", str(args.max_new_tokens), "--lr", str(args.lr),
                            "--max-tool-calls", "4")  # fmt: skip
    if args.controls:
        seconds["more-sft"] = train(base / "more-sft", *start, "--dataset", "tool-sums", "--batch-size", "16",
                                    "--lr", str(args.control_lr), "--max-length", "1024")  # fmt: skip
    scores = {stage: score(base / stage / "hf", rows, args.generations, args.max_new_tokens) for stage in seconds}
    return {"seed": seed, "scores": scores, "seconds": seconds}


def table(results: list[dict], generations: int) -> str:
    head = ["called", "well formed", "right"]
    lines = ["| stage | " + " | ".join(f"greedy {h}" for h in head) + " | " + " | ".join(f"sampled {h}" for h in head)
             + f" | pass@{generations} | seconds |", "|---" * 9 + "|"]  # fmt: skip
    for stage in results[0]["scores"]:

        def mean(mode: str, key: str) -> float:
            return statistics.mean(r["scores"][stage][mode][key] for r in results)

        cells = [f"{mean(m, k):.3f}" for m in ("greedy", "sampled") for k in ("called", "well_formed", "right")]
        passed = statistics.mean(r["scores"][stage]["pass"] for r in results)
        secs = statistics.mean(r["seconds"][stage] for r in results)
        lines.append(f"| {stage} | " + " | ".join(cells) + f" | {passed:.3f} | {secs:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="a transformers causal LM folder whose template renders tools")
    p.add_argument("--tiny", action="store_true", help="build the tests' random tool-calling Llama instead")
    p.add_argument("--width", type=int, default=128, help="--tiny: the model's width")
    p.add_argument("--out", type=Path, default=Path("runs/tool_use"), help="the study's folder")
    p.add_argument("--seeds", type=int, nargs="+", default=[1], help="one study per seed")
    p.add_argument("--sft-steps", type=int, default=600, help="optimizer steps of SFT")
    p.add_argument("--sft-lr", type=float, default=3e-3)
    p.add_argument("--steps", type=int, default=60, help="optimizer steps of GRPO and of the control")
    p.add_argument("--prompts", type=int, default=8, help="GRPO: prompts per step")
    p.add_argument("--generations", type=int, default=8, help="GRPO: completions per prompt (G), and pass@G's")
    p.add_argument("--max-new-tokens", type=int, default=112, help="the model's own tokens per answer")
    p.add_argument("--lr", type=float, default=3e-4, help="GRPO's learning rate")
    p.add_argument("--controls", action=argparse.BooleanOptionalAction, default=True, help="run more-sft")
    p.add_argument("--reuse-sft", action="store_true", help="start from OUT/seed-N/sft/hf where it is already")
    p.add_argument("--clean-calls", action=argparse.BooleanOptionalAction, default=True,
                   help="GRPO is also rewarded for calls that ran without an error")  # fmt: skip
    p.add_argument("--control-lr", type=float, default=1e-3, help="the control's learning rate")
    p.add_argument("--heldout", type=int, default=200, help="held-out sums scored")
    args = p.parse_args(argv)
    if args.tiny:
        from hfmodels import tiny_llama

        model = args.out / "tiny"
        if not (model / "config.json").exists():
            tiny_llama(model, width=args.width, tools=True)
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
