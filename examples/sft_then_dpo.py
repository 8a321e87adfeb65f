"""SFT, then DPO from the SFT run's hf/ folder (issue 34): does preference tuning raise held-out greedy exact match
above SFT alone, and above the same number of extra steps spent on SFT instead?

For each seed, every stage an anytrain run in OUT/seed-N/STAGE:
    sft            --task sft on the demonstrations: the bundled `instructions` chats, of which a share
                   (--sft-noise) end in the near miss of `preferences` instead of the right answer (demonstrations
                   of mixed quality; 0 = the bundled set as it is)
    dpo-LOSS       --task dpo --model hf:OUT/seed-N/sft/hf --dataset preferences, one run per --dpo LOSS:BETA:LR
    more-sft       control: the SFT continued from the same hf/ folder on the same demonstrations
    sft-chosen     control: SFT from the same hf/ folder on the preference pairs' chosen answers (their prompts)
Every DPO run and control takes --steps optimizer steps of --batch-size chats or pairs. One function then scores
every hf/ folder on the same held-out prompts: `preferences` questions drawn with another seed, none of them
asked in either training set, answered by transformers' greedy generate through the chat template (stopping at
the end of the turn), exact match with the right answer, plus how often the answer is the pair's near miss.
It prints a table and writes OUT/results.json.

The noise is the point: trained on the clean set (--sft-noise 0), the tiny model rarely answers with a near miss
(2-4% of its answers), so pairs against near misses have little to correct, and DPO there lowers exact match a
little. The pairs' chosen answers are right ones, so the sft-chosen control is the bar a preference loss must clear.

    python examples/sft_then_dpo.py --tiny --out runs/sft_then_dpo --seeds 1 2
    python examples/sft_then_dpo.py --model path/to/chat-llm --out runs/sft_then_dpo   # a chat-template causal LM

--tiny builds the tests' random Llama (tests/hfmodels.py: 64 wide, 2 layers, a ChatML template) in OUT/tiny.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from anytrain.data import instructions, preferences  # noqa: E402

HELDOUT_SEED = 20261126  # neither instructions' (...24) nor preferences' (...25)
NOISE_SEED = 7  # which demonstrations end in a near miss


def held_out(count: int, seed: int = HELDOUT_SEED) -> list[dict]:
    """`count` preference rows whose question is asked nowhere in the bundled instructions or preferences sets."""
    seen = {m["content"] for row in instructions.rows() for m in row["messages"] if m["role"] == "user"}
    seen |= {row["prompt"][-1]["content"] for row in preferences.rows()}
    fresh = [row for row in preferences.rows(4 * count, seed) if row["prompt"][-1]["content"] not in seen]
    return fresh[:count]


def answers(folder: Path, rows: list[dict]) -> list[str]:
    """The hf/ folder's greedy answers to the rows' prompts: transformers' generate through the chat template,
    stopping at the end of the turn (ChatML's <|im_end|>, else the end-of-text token)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stops = sorted({tokenizer.eos_token_id, *([end] if end not in (None, tokenizer.unk_token_id) else [])})
    replies = []
    with torch.no_grad():
        for row in rows:
            prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_tensors="pt")
            prompt = prompt if isinstance(prompt, torch.Tensor) else prompt["input_ids"]
            out = model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=16,
                do_sample=False,
                eos_token_id=stops,
                pad_token_id=stops[0],
            )
            replies.append(tokenizer.decode(out[0, prompt.shape[1] :], skip_special_tokens=True).strip())
    return replies


def score(folder: Path, rows: list[dict]) -> dict:
    """Exact match of the folder's greedy answers with the chosen ones (overall and per question kind), and how
    often the answer is the pair's rejected near miss."""
    replies = answers(folder, rows)
    hits = [reply == row["chosen"][0]["content"] for reply, row in zip(replies, rows)]
    near = [reply == row["rejected"][0]["content"] for reply, row in zip(replies, rows)]
    by_kind = {k: [h for h, row in zip(hits, rows) if row["kind"] == k] for k in sorted({r["kind"] for r in rows})}
    return {
        "exact_match": sum(hits) / len(rows),
        "near_miss": sum(near) / len(rows),
        "by_kind": {k: round(sum(h) / len(h), 3) for k, h in by_kind.items()},
    }


def demonstrations(out: Path, share: float) -> str:
    """The SFT set: `instructions`, a share of whose last answers are replaced by their near miss (a jsonl file
    in `out`); share 0 = the bundled set itself."""
    if not share:
        return "instructions"
    rng, rows = random.Random(NOISE_SEED), []
    for row in instructions.rows():
        messages = [dict(m) for m in row["messages"]]
        if rng.random() < share:
            last, asked = messages[-1], messages[-2]["content"]
            last["content"] = preferences.near_miss(row["kind"], asked, last["content"], rng)
        rows.append({"messages": messages})
    return write_jsonl(out / f"demonstrations-{share}.jsonl", rows)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def train(out: Path, args: argparse.Namespace, *flags: str) -> float:
    """One anytrain run into `out` (replaced); its wall time in seconds."""
    launch = [sys.executable]
    if args.accelerate_config != "none":
        launch += ["-m", "accelerate.commands.launch", "--config_file", args.accelerate_config]
    common = ["--output-dir", str(out), "--overwrite", "--no-progress", "--no-plot", "--final-weights", "last"]
    common += ["--val-fraction", "0.05", "--test-fraction", "0.05"]  # anytrain's own evaluation kept small
    cmd = [*launch, "src/train.py", *flags, *common]
    print("$", " ".join(["python", *cmd[1:]]), flush=True)
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": path}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    print("  " + done.stdout.strip().splitlines()[-1], flush=True)  # the run's test line
    return time.perf_counter() - start


def one_seed(model: Path, seed: int, args: argparse.Namespace, rows: list[dict]) -> dict:
    root = args.out / f"seed-{seed}"
    sft = root / "sft"
    common = ["--seed", str(seed), "--batch-size", str(args.batch_size), "--max-length", str(args.max_length)]
    more = ["--model", f"hf:{sft / 'hf'}", "--max-steps", str(args.steps), *common]
    demos = demonstrations(args.out, args.sft_noise)
    seconds = {"sft": train(sft, args, "--task", "sft", "--model", f"hf:{model}", "--dataset", demos, "--packing",
                            "--max-steps", str(args.sft_steps), "--lr", str(args.sft_lr), *common)}  # fmt: skip
    for loss, beta, lr in args.dpo:
        seconds[f"dpo-{loss}"] = train(root / f"dpo-{loss}", args, "--task", "dpo", "--dataset", "preferences",
                                       "--dpo-loss", loss, "--beta", beta, "--lr", lr, *more)  # fmt: skip
    if args.controls:
        pairs = preferences.rows()  # the chosen answers of the DPO runs' pairs, as chats
        chosen = write_jsonl(args.out / "chosen.jsonl", [{"messages": r["prompt"] + r["chosen"]} for r in pairs])
        for stage, data in (("more-sft", demos), ("sft-chosen", chosen)):
            seconds[stage] = train(root / stage, args, "--task", "sft", "--dataset", data, "--packing",
                                   "--lr", str(args.control_lr), *more)  # fmt: skip
    result = {"seed": seed, "seconds": {k: round(v, 1) for k, v in seconds.items()}}
    for stage in seconds:
        start = time.perf_counter()
        result[stage] = score(root / stage / "hf", rows)
        result["seconds"][f"score {stage}"] = round(time.perf_counter() - start, 1)
        summary = json.loads((root / stage / "summary.json").read_text())
        result[stage]["anytrain"] = {k: v for k, v in summary.items() if k.startswith("test_")}
    return result


def table(results: list[dict], stages: list[str]) -> str:
    """Exact match (and near-miss share) per seed and stage, each stage's change from SFT alone, and the mean."""
    lines = [" | ".join(["seed", *stages]), " | ".join("---" for _ in range(len(stages) + 1))]

    def cell(em: float, near: float, base: float | None) -> str:
        return f"{em:.3f} ({near:.3f})" + ("" if base is None else f" {em - base:+.3f}")

    for r in results:
        base = r["sft"]["exact_match"]
        cells = [cell(r[s]["exact_match"], r[s]["near_miss"], None if s == "sft" else base) for s in stages]
        lines.append(" | ".join([str(r["seed"]), *cells]))
    em = {s: statistics.mean(r[s]["exact_match"] for r in results) for s in stages}
    near = {s: statistics.mean(r[s]["near_miss"] for r in results) for s in stages}
    lines.append(" | ".join(["mean", *(cell(em[s], near[s], None if s == "sft" else em["sft"]) for s in stages)]))
    return "\n".join(lines)


def dpo_setting(text: str) -> tuple[str, str, str]:
    loss, beta, lr = text.split(":")
    if loss not in ("sigmoid", "ipo", "simpo", "orpo"):
        raise argparse.ArgumentTypeError(f"{loss}: not one of sigmoid, ipo, simpo, orpo")
    return loss, str(float(beta)), str(float(lr))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", type=Path, help="a transformers causal LM folder with a chat template")
    p.add_argument("--tiny", action="store_true", help="build the tests' random Llama (tests/hfmodels.py) instead")
    p.add_argument("--width", type=int, default=64, help="--tiny: hidden size")
    p.add_argument("--layers", type=int, default=2, help="--tiny: decoder layers")
    p.add_argument("--out", type=Path, default=Path("runs/sft_then_dpo"), help="the study's folder")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="one study per seed (splits and order)")
    p.add_argument("--sft-noise", type=float, default=0.45, help="share of demonstrations ending in a near miss")
    p.add_argument("--sft-steps", type=int, default=1500, help="optimizer steps of SFT")
    p.add_argument("--sft-lr", type=float, default=3e-3)
    p.add_argument(
        "--dpo",
        type=dpo_setting,
        nargs="+",
        default=[dpo_setting("sigmoid:1.0:1e-4"), dpo_setting("orpo:0.1:1e-3")],
        metavar="LOSS:BETA:LR",
        help="one DPO run per setting (default: sigmoid:1.0:1e-4 orpo:0.1:1e-3)",
    )
    p.add_argument("--steps", type=int, default=150, help="optimizer steps of each DPO run and control")
    p.add_argument("--controls", action=argparse.BooleanOptionalAction, default=True, help="run the two controls")
    p.add_argument("--control-lr", type=float, default=1e-3, help="the controls' learning rate")
    p.add_argument("--batch-size", type=int, default=32, help="chats (SFT) or pairs (DPO) per step")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--heldout", type=int, default=500, help="held-out prompts scored")
    p.add_argument(
        "--accelerate-config", default="none", help="launch each run with `accelerate launch --config_file FILE`"
    )
    args = p.parse_args(argv)
    if args.tiny == bool(args.model):
        p.error("give one of --model FOLDER and --tiny")
    if len({loss for loss, _, _ in args.dpo}) < len(args.dpo):
        p.error("--dpo: one setting per loss (each names its run folder, dpo-LOSS)")
    args.out = args.out.resolve()
    model = args.model.resolve() if args.model else None
    if args.tiny:
        from hfmodels import tiny_llama

        model = tiny_llama(args.out / "tiny", seed=0, width=args.width, layers=args.layers)
    rows = held_out(args.heldout)
    start = time.perf_counter()
    results = [one_seed(model, seed, args, rows) for seed in args.seeds]
    stages = ["sft", *(f"dpo-{loss}" for loss, _, _ in args.dpo)] + (
        ["more-sft", "sft-chosen"] if args.controls else []
    )
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report = {"settings": settings, "heldout_prompts": len(rows), "results": results, "table": table(results, stages)}
    report["wall_seconds"] = round(time.perf_counter() - start, 1)
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\nheld-out greedy exact match on {len(rows)} prompts (in brackets: share of answers that are the near miss;"
    )
    print("then the change from SFT alone)")
    print(report["table"])
    print(f"written: {args.out / 'results.json'} ({report['wall_seconds']:.0f} s)")
    return report


if __name__ == "__main__":
    main()
