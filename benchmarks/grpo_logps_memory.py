"""The peak memory of grpo's per-token log-probabilities of one rollout at Qwen2.5's 151,936-token vocabulary,
before and after issue 46 (docs/benchmarks.md, "GRPO's log-probabilities at a 150k vocabulary"). The model: a
random Qwen2-shaped causal LM built from a transformers config (hidden 256, 2 layers, tied output layer; no
download); the rollout: 64 completions of --length tokens (64; the docs' table: 128) after prompts of 32-64 tokens
(left-padded to 64), about a quarter of them stopped early (the rest padding), as generation's read_back makes them.

Variants (each log-probability at temperature 1):
- old: the way of commit 1f1fab6 (`tasks/grpo/rollout.py: token_logps`, re-implemented below as `old_token_logps`,
  its output checked equal to the original's): the model's own forward with logits_to_keep, the full float logits
  of every row, then logsumexp and gather 8 rows at a time. Its roll_out took the old and reference
  log-probabilities of the whole rollout in one call.
- new: this checkout's `tasks/causal_lm/logprobs.py: completion_logps` through head.CausalLMHead, the module the loop
  trains (the output layer a chunk of tokens at a time, no full logits); grpo's `rollout_logps` calls it a micro-batch
  (--micro 16 completions) at a time.
No gradients (old and reference log-probabilities): the whole rollout in one call, and (new) in micro-batches.
With gradients (the policy, which both ways take one micro-batch at a time): the forward and the backward of the
sum of the completion tokens' log-probabilities over one micro-batch.

Each variant runs in a fresh subprocess (Linux): model and inputs built, the variant run once on 1 row without
gradients (kernels and thread pools made), then the peak resident set reset (5 written to /proc/self/clear_refs)
and the measured call run; its figure is VmHWM after the call minus VmRSS before it (the baseline). torch's own
view: the peak of the profiler's "Total Allocated" over the call (torch.profiler with profile_memory counts the CPU
tensors allocated and freed while it runs; tracemalloc does not see torch's tensors). Each figure is the median
over --rounds fresh processes. Every variant's log-probabilities are compared with the old whole-rollout ones (max
abs difference over the completion tokens), and the two policy variants' gradient norms with each other: the
variants do the same work. 2.5 min on the project's 2-core VM (5 min while other jobs keep it busy); --length 128
--rounds 3, the docs' table, 7 to 9 min.

    python benchmarks/grpo_logps_memory.py [--length 128 --rounds 3 --json bench_out/grpo_logps_memory.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import toolkit

VOCAB, HIDDEN, LAYERS, PROMPT = 151_936, 256, 2, 64
STOP, PAD = 151_645, 151_643  # Qwen2.5's <|im_end|> and <|endoftext|>
VARIANTS = {
    # name: (way, gradients, rows measured: the rollout or one micro-batch, rows per call: the rollout or a micro-batch)
    "old, no grad, rollout at once": ("old", False, "rollout", "rollout"),
    "new, no grad, rollout at once": ("new", False, "rollout", "rollout"),
    "new, no grad, micro-batches": ("new", False, "rollout", "micro"),
    "old, policy (grad), micro-batch": ("old", True, "micro", "micro"),
    "new, policy (grad), micro-batch": ("new", True, "micro", "micro"),
}
MIB = 2**20


# --------------------------------------------------------------------------- one variant (its own process)
def old_token_logps(model, rows, call):
    """THE OLD PATH: commit 1f1fab6's tasks/grpo/rollout.py `token_logps`, line for line: the model's own forward
    with logits_to_keep (the full float logits of every row), log_softmax gathered 8 rows at a time."""
    import torch

    length = rows.ids.shape[1] - rows.width
    inputs = {"input_ids": rows.ids, "attention_mask": rows.mask, "position_ids": rows.positions}
    logits = call({**inputs, "logits_to_keep": length + 1}).logits[:, :-1]  # position t predicts token t + 1
    targets = rows.ids[:, rows.width :]
    out = []
    for start in range(0, len(targets), 8):
        chunk = logits[start : start + 8].float()
        picked = chunk.gather(-1, targets[start : start + 8, :, None]).squeeze(-1)
        out.append(picked - chunk.logsumexp(-1))
    return torch.cat(out)


def build(rows: int, length: int):
    """The random Qwen2-shaped model and the rollout (Completions) of `rows` completions of `length` tokens, seeded."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from anytrain.tasks.causal_lm.generation import Sampling, left_padded, read_back

    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    g = torch.Generator().manual_seed(1)
    sizes = torch.randint(PROMPT // 2, PROMPT + 1, (rows,), generator=g).tolist()
    prompts = [torch.randint(0, PAD, (n,), generator=g).tolist() for n in sizes]
    ids, mask = left_padded(prompts, PAD)
    new = torch.randint(0, PAD, (rows, length), generator=g)
    stopped = torch.rand(rows, generator=g) < 0.25
    where = torch.randint(0, length, (rows,), generator=g)
    new[stopped, where[stopped]] = STOP
    done = read_back(torch.cat([ids, new], 1), mask, ids.shape[1], Sampling(length, (STOP,), PAD, 1.0, 1.0))
    return model, done


def status() -> dict[str, int]:
    lines = Path("/proc/self/status").read_text().splitlines()
    return {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in lines) if k in ("VmRSS", "VmHWM")}


def torch_peak(trace: Path) -> int:
    """The peak of torch's CPU 'Total Allocated' over a profiler trace's memory events."""
    events = json.loads(trace.read_text())["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    return max(totals, default=0)


def measure(call):
    """call() once, the process's peak resident set reset just before it: (its result, {baseline_mib: the resident set
    before it, peak_above_mib: VmHWM after it above that, torch_peak_mib: the profiler's peak "Total Allocated" over
    it, seconds}). Linux only."""
    import gc

    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with tempfile.TemporaryDirectory() as tmp:
        before = status()["VmRSS"]
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux 4.0 on)
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = call()
        seconds = time.perf_counter() - start
        peak = status()["VmHWM"]
        prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
        allocated = torch_peak(Path(tmp) / "trace.json")
    figures = {"baseline_mib": before / MIB, "peak_above_mib": (peak - before) / MIB, "torch_peak_mib": allocated / MIB}
    return out, {**figures, "seconds": seconds}


def worker(name: str, args) -> dict:
    import torch

    from anytrain.tasks.causal_lm.head import head_of
    from anytrain.tasks.causal_lm.logprobs import bare, completion_logps

    way, grad, measured, per_call = VARIANTS[name]
    size = {"rollout": args.rows, "micro": args.micro}
    model, rollout = build(args.rows, args.length)
    if way == "new":
        model, why = head_of(model)
        if why is not None:
            raise SystemExit(f"grpo_logps_memory: the fused output layer does not apply to the model: {why}")
    call = bare(model)  # the bare model, as roll_out calls it (the loop's forward passes a request the same way)

    def logps(rows):
        return old_token_logps(model, rows, call) if way == "old" else completion_logps(call, rows, 1.0)

    def run(rows, per_call: int) -> torch.Tensor:
        pieces = torch.tensor_split(torch.arange(len(rows.ids)), len(rows.ids) // per_call)
        if not grad:
            with torch.no_grad():
                return torch.cat([logps(rows.rows(index)) for index in pieces])
        out = logps(rows)
        (out * rows.completion).sum().backward()  # the gradients stay (as until the optimizer's step)
        return out.detach()

    rows = rollout.rows(slice(0, size[measured]))
    with torch.no_grad():
        logps(rollout.rows(slice(0, 1)))  # warm-up: kernels, thread pools
    out, figures = measure(lambda: run(rows, size[per_call]))
    grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
    norm = torch.cat(grads).norm().item() if grads else None
    if args.save:
        torch.save({"logps": out, "completion": rows.completion}, args.save)
    return {"variant": name, **figures, "grad_norm": norm}


# --------------------------------------------------------------------------- the comparison
def theory(args) -> dict[str, float]:
    """The float32 logits (rows x length x vocabulary x 4 bytes) of the rollout, of a micro-batch, of a fused chunk."""
    from anytrain.tasks.causal_lm.head import chunk_tokens

    each = args.length * VOCAB * 4 / MIB
    return {"full_logits_mib": args.rows * each, "micro_batch_logits_mib": args.micro * each,
            "fused_chunk_logits_mib": chunk_tokens(VOCAB) * VOCAB * 4 / MIB}  # fmt: skip


def one_run(name: str, args, save: Path | None) -> dict:
    shape = ["--rows", str(args.rows), "--length", str(args.length), "--micro", str(args.micro)]
    cmd = [sys.executable, __file__, "--worker", name, *shape, *(["--save", str(save)] if save else [])]
    done = subprocess.run(cmd, env=toolkit.run_env(), capture_output=True, text=True, timeout=toolkit.TIMEOUT)
    if done.returncode:
        raise SystemExit(f"grpo_logps_memory: {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def agreement(saved: dict[str, Path]) -> dict[str, float]:
    """Each variant's max abs difference from the old whole-rollout log-probabilities over the completion tokens."""
    import torch

    ref = torch.load(saved["old, no grad, rollout at once"])
    diffs = {}
    for name, path in saved.items():
        x = torch.load(path)
        n = len(x["logps"])
        keep = ref["completion"][:n]
        diffs[name] = (x["logps"] - ref["logps"][:n])[keep].abs().max().item()
    return diffs


def summary(name: str, runs: list[dict], diff: float, sizes: dict) -> dict:
    """A variant's medians over its runs, its agreement with the old way, the full logits of the rows of one call."""
    logits = sizes["full_logits_mib" if VARIANTS[name][3] == "rollout" else "micro_batch_logits_mib"]
    medians = {k: statistics.median(x[k] for x in runs) for k in ("peak_above_mib", "torch_peak_mib", "seconds")}
    return {"variant": name, **medians, "call_logits_mib": logits, "max_abs_diff": diff,
            "grad_norm": runs[0]["grad_norm"], "runs": runs}  # fmt: skip


def report(rows: list[dict], sizes: dict, args) -> None:
    print(
        f"\nvocabulary {VOCAB:,}, hidden {HIDDEN}, {LAYERS} layers; {args.rows} completions of {args.length} "
        f"tokens after prompts of at most {PROMPT}, micro-batches of {args.micro}; median of {args.rounds} runs"
    )
    print(
        f"full logits ({args.length} tokens x {VOCAB:,} x 4 B a row): the rollout's {sizes['full_logits_mib']:,.0f} "
        f"MiB, one micro-batch's {sizes['micro_batch_logits_mib']:,.0f} MiB; one chunk of the fused layer's "
        f"{sizes['fused_chunk_logits_mib']:,.0f} MiB"
    )
    head = ("variant", "peak above baseline (RSS)", "torch's peak allocated", "full logits of one call", "time",
            "max abs diff from old")  # fmt: skip
    print("\n".join(toolkit.md_head(*head)))
    for x in rows:
        print(
            f"| {x['variant']} | {x['peak_above_mib']:,.0f} MiB | {x['torch_peak_mib']:,.0f} MiB | "
            f"{x['call_logits_mib']:,.0f} MiB | {x['seconds']:.1f} s | {x['max_abs_diff']:.1e} |"
        )
    old, new = (x["grad_norm"] for x in rows if x["grad_norm"] is not None)
    print(f"policy gradient norm: old {old:.6g}, new {new:.6g} (relative difference {abs(old - new) / old:.1e})")


def main(argv=None) -> dict:
    p = toolkit.parser(__doc__, json=None, rounds=2)
    p.add_argument("--rows", type=int, default=64, help="completions in the rollout")
    p.add_argument("--length", type=int, default=64, help="tokens per completion (max_new_tokens)")
    p.add_argument("--micro", type=int, default=16, help="completions per micro-batch")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--save", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return {}
    names, runs = list(VARIANTS), {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        saved = {name: Path(tmp) / f"{k}.pt" for k, name in enumerate(names)}
        for r in range(args.rounds):
            for name in toolkit.rotated(names, r):
                x = one_run(name, args, saved[name] if r == 0 else None)
                runs[name].append(x)
                print(f"round {r + 1}: {name:<33} {x['peak_above_mib']:8,.0f} MiB above baseline "
                      f"({x['baseline_mib']:,.0f}), torch {x['torch_peak_mib']:8,.0f} MiB, {x['seconds']:5.1f} s",
                      flush=True)  # fmt: skip
        diffs = agreement(saved)
    sizes = theory(args)
    rows = [summary(name, runs[name], diffs[name], sizes) for name in names]
    report(rows, sizes, args)
    shape = {"vocabulary": VOCAB, "hidden": HIDDEN, "layers": LAYERS, "rows": args.rows, "length": args.length,
             "micro": args.micro, "prompt": PROMPT, "rounds": args.rounds}  # fmt: skip
    result = {"shape": shape, "rows": rows, "theory": sizes, "machine": toolkit.machine()}
    if args.json:
        toolkit.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
