"""The fused LM-head loss (tasks/causal_lm/head.py) against the model's own loss over its full logits: training
tokens/s and peak memory of a causal LM's step (forward with labels, backward, AdamW) at two vocabulary sizes, the
two variants interleaved over the rounds, the best round counts. On a GPU the peak is CUDA's peak allocated memory;
on a CPU it is the process's peak resident set (meaningful only for the first variant run, so read the CPU figures
as a dry run). The model: the folder's config (a random transformers causal LM, e.g. the one scripts/gpu_truth.py
builds) with its vocabulary resized, at random weights; the batch: random tokens, every one a target.

    python benchmarks/lmhead_bench.py MODEL_FOLDER [--rows 16 --length 512 --vocab 32768 128256 --precision bf16]
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import toolkit
import torch


def one_variant(folder: Path, vocabulary: int, fused: bool, args, device: torch.device) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    from anytrain.outputs import process_peak_rss
    from anytrain.tasks.causal_lm.head import head_of

    config = AutoConfig.from_pretrained(folder)
    config.vocab_size, config.use_cache = vocabulary, False
    torch.manual_seed(0)
    with device:  # the weights made where they train (a 250 M model's random init on a CPU takes seconds)
        model = AutoModelForCausalLM.from_config(config).train()
    if fused:
        model, why = head_of(model)  # the module anytrain trains: the fused output layer
        if why is not None:
            raise SystemExit(f"lmhead_bench: the fused loss does not apply to {folder}: {why}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    ids = torch.randint(vocabulary, (args.rows, args.length), generator=torch.Generator().manual_seed(1)).to(device)
    dtype = {"bf16": torch.bfloat16, "fp32": None}[args.precision]

    def step() -> float:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    step()  # warm-up: kernels chosen, optimizer state made
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    losses = [step() for _ in range(args.steps)]
    seconds = time.perf_counter() - start  # .item() each step synchronises
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else process_peak_rss()
    params = sum(p.numel() for p in model.parameters())
    tokens = args.rows * args.length * args.steps
    return {"vocabulary": vocabulary, "loss": "fused" if fused else "full logits", "parameters": params,
            "tokens_per_s": tokens / seconds, "peak_memory_gib": peak / 2**30, "last_loss": losses[-1]}  # fmt: skip


def main(argv=None) -> list[dict]:
    p = toolkit.parser(__doc__, json=None, rounds=2)
    p.add_argument("model", type=Path, help="a transformers causal LM's folder (its config is used)")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant per round")
    p.add_argument("--vocab", type=int, nargs="+", default=[32768, 128256])
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    args = p.parse_args(argv)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    best: dict[tuple, dict] = {}
    for r in range(args.rounds):
        for vocabulary in args.vocab:
            for fused in toolkit.rotated([False, True], r):
                x = one_variant(args.model, vocabulary, fused, args, device)
                if device.type == "cuda":
                    torch.cuda.empty_cache()  # the last variant's model and optimizer state are gone: start clean
                key = (vocabulary, x["loss"])
                if key not in best or x["tokens_per_s"] > best[key]["tokens_per_s"]:
                    best[key] = {**x, "peak_memory_gib": min(x["peak_memory_gib"], best.get(key, x)["peak_memory_gib"])}
                print(f"round {r + 1}: vocab {vocabulary:>6} {x['loss']:<11} {x['tokens_per_s']:>10,.0f} tokens/s "
                      f"{x['peak_memory_gib']:6.2f} GiB", flush=True)  # fmt: skip
    rows = [{**x, "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"} for x in best.values()]
    print("| vocabulary | loss | parameters | tokens/s | peak GiB | last loss |")
    print("|---|---|---|---|---|---|")
    for x in rows:
        print(f"| {x['vocabulary']:,} | {x['loss']} | {x['parameters'] / 1e6:.0f} M | {x['tokens_per_s']:,.0f} | "
              f"{x['peak_memory_gib']:.2f} | {x['last_loss']:.3f} |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
