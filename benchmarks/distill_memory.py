"""The peak memory of one distill loss, forward and backward, at Qwen2.5's 151,936-token vocabulary: anytrain's
chunked divergence against TRL 1.16's two ways (docs/benchmarks.md, "distill's loss at a 150k vocabulary").

The loss's inputs, as a trainer holds them after the two models' backbones: a micro-batch of --rows completions of
--length token positions (about a quarter of the completions stopped early, the rest of their row padding), the
student's last hidden states (width 256, requiring gradients) and output layer (151,936 x 256, requiring gradients),
the teacher's (width 384, frozen), random, seeded, scaled so that the logits spread as a trained model's do. The loss:
the generalized JSD at temperature 1 (beta 1, the reverse KL: TRL's default; and 0.5, but for the full logits, which
take about 20 GiB at the default shape), summed over the counted tokens over their count, then its backward (the
gradients of the student's hidden states and output layer).

Ways:
- anytrain: `tasks/causal_lm/divergence.py: ChunkedDivergence`, what `--task distill` runs: the counted tokens'
  hidden states of both models (at_completion) through their output layers a chunk of tokens at a time
  (head.chunk_tokens: 256 tokens at this vocabulary), the whole vocabulary per chunk; backward recomputes a chunk.
- trl chunked: `trl/trainer/distillation_trainer.py: _chunked_divergence_loss` (its `ChunkedDivergenceFunction`),
  what TRL 1.16's DistillationTrainer always runs (it has no other loss path): tiles of up to 4,096 positions x
  32,768 vocabulary entries, on a CPU through its torch fallback and over every position of the padded rows (its
  compaction to the counted positions is for Triton devices).
- trl full logits: GKD's `generalized_jsd_loss` (`trl.experimental.gkd`), TRL's older way: both models' full
  logits of the micro-batch, log-softmax and the divergence over them, the padding masked.

Each (way, beta) runs in a fresh subprocess (Linux): inputs built, the loss run once on 1 row (kernels, thread
pools), then the peak resident set reset (5 written to /proc/self/clear_refs) and the measured forward and backward
run; its figure is VmHWM after the call minus VmRSS before it (the inputs are in the baseline); torch's own view: the
peak of the profiler's "Total Allocated" over the call. The median over --rounds processes. The losses and the
student's gradients of the three ways are compared (max relative difference from anytrain's): they do the same work.

    python benchmarks/distill_memory.py [--rows 16 --length 128 --rounds 2 --json bench_out/distill_memory.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import toolkit
from grpo_logps_memory import MIB, measure

VOCAB, STUDENT_WIDTH, TEACHER_WIDTH = 151_936, 256, 384
WAYS = ("anytrain", "trl chunked", "trl full logits")
VARIANTS = [(way, 1.0) for way in WAYS] + [(way, 0.5) for way in WAYS[:2]]  # full logits at beta 0.5: 20 GiB here


# --------------------------------------------------------------------------- one variant (its own process)
def inputs(rows: int, length: int, seed: int = 0):
    """(student hidden (rows, length, 256) and output layer (V, 256), both requiring gradients; the teacher's hidden
    (rows, length, 384) and output layer; the counted positions (rows, length) bool), seeded."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int, scale: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    hidden = randn(rows, length, STUDENT_WIDTH, scale=1.0).requires_grad_()
    weight = randn(VOCAB, STUDENT_WIDTH, scale=0.1).requires_grad_()  # logits of sd 1.6: a trained model's spread
    t_hidden, t_weight = randn(rows, length, TEACHER_WIDTH, scale=1.0), randn(VOCAB, TEACHER_WIDTH, scale=0.12)
    ends = torch.randint(1, length + 1, (rows,), generator=g)
    ends[torch.rand(rows, generator=g) >= 0.25] = length  # a quarter stopped early
    counted = torch.arange(length)[None, :] < ends[:, None]
    return hidden, weight, t_hidden, t_weight, counted


def loss_of(way: str, beta: float, hidden, weight, t_hidden, t_weight, counted):
    """The way's loss: the summed per-token divergence over the counted tokens over their count."""
    count = counted.sum()
    if way == "anytrain":
        from anytrain.tasks.causal_lm.divergence import ChunkedDivergence, at_completion
        from anytrain.tasks.causal_lm.head import chunk_tokens

        h, t = at_completion(hidden, 0, counted), at_completion(t_hidden, 0, counted)
        found = ChunkedDivergence.apply(h, weight, None, t, t_weight, None, beta, 1.0, chunk_tokens(VOCAB))
        return found[0].sum() / count
    if way == "trl chunked":
        from trl.trainer.distillation_trainer import _chunked_divergence_loss

        return _chunked_divergence_loss(hidden, t_hidden, weight, t_weight, counted.long(), beta, count)[0]
    from trl.experimental.gkd.gkd_trainer import GKDTrainer

    labels = counted.long().masked_fill(~counted, -100)
    student, teacher = hidden @ weight.T, t_hidden @ t_weight.T
    return GKDTrainer.generalized_jsd_loss(student, teacher, labels, beta, 1.0, num_items_in_batch=count)


def worker(way: str, beta: float, args) -> dict:
    import torch

    tensors = inputs(args.rows, args.length)
    with torch.no_grad():
        loss_of(way, beta, *(x[:1] if x.shape[0] == args.rows else x for x in tensors))  # warm-up: one row

    def run() -> torch.Tensor:
        loss = loss_of(way, beta, *tensors)
        loss.backward()
        return loss.detach()

    loss, figures = measure(run)
    if args.save:
        torch.save({"loss": loss, "hidden": tensors[0].grad, "weight": tensors[1].grad}, args.save)
    return {"way": way, "beta": beta, **figures}


# --------------------------------------------------------------------------- the comparison
def one_run(way: str, beta: float, args, save: Path | None) -> dict:
    shape = ["--rows", str(args.rows), "--length", str(args.length)]
    cmd = [sys.executable, __file__, "--worker", way, "--beta", str(beta), *shape]
    cmd += ["--save", str(save)] if save else []
    done = subprocess.run(cmd, env=toolkit.run_env(), capture_output=True, text=True, timeout=toolkit.TIMEOUT)
    if done.returncode:
        raise SystemExit(f"distill_memory: {way}, beta {beta} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def agreement(saved: dict[tuple, Path]) -> dict[tuple, dict]:
    """Each variant's loss and its gradients' max difference from anytrain's at the same beta, relative to the largest
    gradient entry."""
    import torch

    out = {}
    for (way, beta), path in saved.items():
        x, ref = torch.load(path), torch.load(saved[("anytrain", beta)])
        rel = {k: ((x[k] - ref[k]).abs().max() / ref[k].abs().max()).item() for k in ("hidden", "weight")}
        out[(way, beta)] = {"loss": x["loss"].item(), "grad_rel_diff": max(rel.values())}
    return out


def summary(name: tuple, runs: list[dict], agreed: dict) -> dict:
    """A variant's medians over its runs, its loss and its gradients' agreement with anytrain's."""
    medians = {k: statistics.median(x[k] for x in runs) for k in ("peak_above_mib", "torch_peak_mib", "seconds")}
    return {"way": name[0], "beta": name[1], **medians, **agreed, "runs": runs}


def report(rows: list[dict], args) -> None:
    counted = inputs(args.rows, args.length)[4].sum().item()
    full = args.rows * args.length * VOCAB * 4 / MIB
    print(f"\nvocabulary {VOCAB:,}; {args.rows} completions x {args.length} positions ({counted} counted); the "
          f"student's full float32 logits {full:,.0f} MiB (the teacher's the same); median of {args.rounds} "
          "runs")  # fmt: skip
    head = ("way", "beta", "peak above baseline (RSS)", "torch's peak allocated", "time", "loss",
            "max grad diff from anytrain (relative)")  # fmt: skip
    print("\n".join(toolkit.md_head(*head)))
    for x in rows:
        print(f"| {x['way']} | {x['beta']:g} | {x['peak_above_mib']:,.0f} MiB | {x['torch_peak_mib']:,.0f} MiB | "
              f"{x['seconds']:.1f} s | {x['loss']:.6f} | {x['grad_rel_diff']:.1e} |")  # fmt: skip


def main(argv=None) -> dict:
    p = toolkit.parser(__doc__, json=None, rounds=2)
    p.add_argument("--rows", type=int, default=16, help="completions in the micro-batch")
    p.add_argument("--length", type=int, default=128, help="token positions per completion (max_new_tokens)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--beta", type=float, help=argparse.SUPPRESS)
    p.add_argument("--save", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.beta, args)))
        return {}
    names = list(VARIANTS)
    runs: dict[tuple, list] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        saved = {name: Path(tmp) / f"{k}.pt" for k, name in enumerate(names)}
        for r in range(args.rounds):
            for name in toolkit.rotated(names, r):
                x = one_run(*name, args, saved[name] if r == 0 else None)
                runs[name].append(x)
                print(f"round {r + 1}: {name[0]:<16} beta {name[1]:g} {x['peak_above_mib']:8,.0f} MiB above baseline "
                      f"({x['baseline_mib']:,.0f}), torch {x['torch_peak_mib']:8,.0f} MiB, {x['seconds']:5.1f} s",
                      flush=True)  # fmt: skip
        agreed = agreement(saved)
    rows = [summary(name, runs[name], agreed[name]) for name in names]
    report(rows, args)
    shape = {"vocabulary": VOCAB, "student_width": STUDENT_WIDTH, "teacher_width": TEACHER_WIDTH, "rows": args.rows,
             "length": args.length, "rounds": args.rounds}  # fmt: skip
    result = {"shape": shape, "rows": rows, "machine": toolkit.machine()}
    if args.json:
        toolkit.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
