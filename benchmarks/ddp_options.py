"""What each DDP setting buys on CPU: 2 ranks x 1 thread (multi_cpu.yaml, gloo, batch 128 each)
against 1 rank x 2 threads (cpu.yaml, batch 256), the large workload of bench.py, interleaved.

    python benchmarks/ddp_options.py --rounds 2 --out bench_out/ddp

Variants of the 2-rank run: --ddp-bucket-mb 1 / 5 (anytrain's default on CPUs) / 25 (torch's) / 100 (one bucket: the
all-reduce cannot start before the backward pass ends, so nothing overlaps), and --ddp-comm-hook
fp16 (16-bit gradients on the wire). Scaling = steady samples/s of a variant / that of 1 x 2 (the
best round of each). For the fp16 hook it also states the effect on the weights: the largest
difference from the fp32 all-reduce's final weights, and both test accuracies.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import bench

VARIANTS = {
    # name: (accelerate config, extra options)
    "1x2": ("cpu.yaml", []),
    "2x1 bucket 25 MB (torch's default)": ("multi_cpu.yaml", ["--ddp-bucket-mb", "25"]),
    "2x1 bucket 1 MB": ("multi_cpu.yaml", ["--ddp-bucket-mb", "1"]),
    "2x1 bucket 5 MB (anytrain's CPU default)": ("multi_cpu.yaml", []),
    "2x1 bucket 100 MB (no overlap)": ("multi_cpu.yaml", ["--ddp-bucket-mb", "100"]),
    "2x1 fp16 all-reduce": ("multi_cpu.yaml", ["--ddp-comm-hook", "fp16"]),
}


def folder(name: str) -> str:
    return "ddp-" + "".join(c if c.isalnum() else "-" for c in name)


def weight_difference(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    wa, wb = load_file(str(a)), load_file(str(b))
    return max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out/ddp")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", nargs="+", metavar="TEXT", help="run only the variants whose names contain one of these (1x2 always runs)")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    runner = bench.Runner(out)
    _, opts, batch, steps = bench.WORKLOADS["large"]
    records = []
    names = [n for n in VARIANTS if n == "1x2" or not args.only or any(t in n for t in args.only)]
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        k = r % len(names)
        for name in names[k:] + names[:k]:
            config, extra = VARIANTS[name]
            per_rank = batch if config == "cpu.yaml" else batch // 2
            rec = bench.trainer_variant(runner, folder(name), config, [*opts, "--batch-size", str(per_rank), "--max-steps", str(steps), "--no-plot", *extra])
            rec["variant"], rec["round"] = name, r
            records.append(rec)
    base = bench.best(records, "1x2")
    rows = {name: {"steady_samples_per_s": bench.best(records, name), "scaling": bench.ratio(bench.best(records, name), base),
                   "runs": bench.runs_of(records, name)} for name in names}
    fp32, fp16 = (runner.runs_dir / folder(n) for n in ("2x1 bucket 5 MB (anytrain's CPU default)", "2x1 fp16 all-reduce"))
    rows = {**rows, **{f"{n}, median of runs": {"steady_samples_per_s": statistics.median(v for v in rows[n]["runs"] if v),
                                                "scaling": statistics.median(v for v in rows[n]["runs"] if v) / statistics.median(v for v in rows["1x2"]["runs"] if v),
                                                "runs": []} for n in names if n != "1x2"}}
    effect = None
    if (fp32 / "model.safetensors").exists() and (fp16 / "model.safetensors").exists():
        acc = [json.loads((d / "summary.json").read_text())["test_accuracy"] for d in (fp32, fp16)]
        effect = {"max_abs_weight_difference": weight_difference(fp32 / "model.safetensors", fp16 / "model.safetensors"),
                  "test_accuracy_fp32_all_reduce": acc[0], "test_accuracy_fp16_all_reduce": acc[1], "steps": steps}
    result = {"rows": rows, "fp16_effect": effect, "records": records}
    (out / "ddp_options.json").write_text(json.dumps(result, indent=1, default=str))
    print(table(result))
    return result


def table(result: dict) -> str:
    out = ["| variant | steady samples/s | / 1 x 2 | runs |", "|---|---|---|---|"]
    for name, row in result["rows"].items():
        runs = ", ".join(f"{v:,.0f}" for v in row["runs"] if v)
        out.append(f"| {name} | {bench.fmt(row['steady_samples_per_s'])} | {bench.fmt(row['scaling'], '.2f')} | {runs} |")
    e = result["fp16_effect"]
    if e:
        out.append(f"\nfp16 all-reduce after {e['steps']} steps: weights differ from the fp32 all-reduce's by at most {e['max_abs_weight_difference']:.2e}; "
                   f"test accuracy {100 * e['test_accuracy_fp16_all_reduce']:.2f} % against {100 * e['test_accuracy_fp32_all_reduce']:.2f} %.")
    return "\n".join(out)


if __name__ == "__main__":
    main()
