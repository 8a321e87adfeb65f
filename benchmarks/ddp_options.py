"""What each DDP setting buys on CPU: 2 ranks x 1 thread (multi_cpu.yaml, batch 128 each) with each bucket size
and the fp16 all-reduce, against 1 rank x 2 threads (cpu.yaml, batch 256), bench.py's large workload, interleaved
(docs/benchmarks.md, "DDP options")."""

import json
import statistics
from pathlib import Path

import toolkit
from bench import trainer_variant
from bench_summary import best, ratio, runs_of
from toolkit import WORKLOADS, Runner, fmt, md_head, write_json

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


def variant(name: str):
    config, extra = VARIANTS[name]
    _, opts, batch, steps = WORKLOADS["large"]
    per_rank = batch if config == "cpu.yaml" else batch // 2
    args = [*opts, "--batch-size", str(per_rank), "--max-steps", str(steps), "--no-plot", *extra]
    return name, lambda runner: trainer_variant(runner, folder(name), config, args)


def fp16_effect(runs_dir: Path) -> dict | None:
    """The fp16 all-reduce's final weights against the fp32 one's: the largest difference, both test accuracies."""
    from safetensors.torch import load_file

    fp32, fp16 = (runs_dir / folder(n) for n in ("2x1 bucket 5 MB (anytrain's CPU default)", "2x1 fp16 all-reduce"))
    if not ((fp32 / "model.safetensors").exists() and (fp16 / "model.safetensors").exists()):
        return None
    wa, wb = (load_file(str(d / "model.safetensors")) for d in (fp32, fp16))
    acc = [json.loads((d / "summary.json").read_text())["test_accuracy"] for d in (fp32, fp16)]
    diff = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)
    effect = {"max_abs_weight_difference": diff, "test_accuracy_fp32_all_reduce": acc[0]}
    return {**effect, "test_accuracy_fp16_all_reduce": acc[1], "steps": WORKLOADS["large"][3]}


def main(argv=None) -> dict:
    p = toolkit.parser(__doc__, out="bench_out/ddp", rounds=2)
    only = "run only the variants whose names contain one of these (1x2 always runs)"
    p.add_argument("--only", nargs="+", metavar="TEXT", help=only)
    args = p.parse_args(argv)
    runner = Runner(toolkit.out_dir(args.out))
    names = [n for n in VARIANTS if n == "1x2" or not args.only or any(t in n for t in args.only)]
    records = runner.rounds([variant(n) for n in names], args.rounds)
    base = best(records, "1x2")
    rows = {n: {"steady_samples_per_s": best(records, n), "scaling": ratio(best(records, n), base)} for n in names}
    for n in names:
        rows[n]["runs"] = runs_of(records, n)
    median = {n: statistics.median(v for v in rows[n]["runs"] if v) for n in names}
    for n in names[1:]:
        row = {"steady_samples_per_s": median[n], "scaling": median[n] / median["1x2"], "runs": []}
        rows[f"{n}, median of runs"] = row
    result = {"rows": rows, "fp16_effect": fp16_effect(runner.runs_dir), "records": records}
    write_json(runner.out / "ddp_options.json", result)
    print(table(result))
    return result


def table(result: dict) -> str:
    out = md_head("variant", "steady samples/s", "/ 1 x 2", "runs")
    for name, row in result["rows"].items():
        runs = ", ".join(f"{v:,.0f}" for v in row["runs"] if v)
        out.append(f"| {name} | {fmt(row['steady_samples_per_s'])} | {fmt(row['scaling'], '.2f')} | {runs} |")
    if e := result["fp16_effect"]:
        weights = f"weights differ from the fp32 all-reduce's by at most {e['max_abs_weight_difference']:.2e}"
        fp16, fp32 = e["test_accuracy_fp16_all_reduce"], e["test_accuracy_fp32_all_reduce"]
        accuracy = f"test accuracy {100 * fp16:.2f} % against {100 * fp32:.2f} %"
        out.append(f"\nfp16 all-reduce after {e['steps']} steps: {weights}; {accuracy}.")
    return "\n".join(out)


if __name__ == "__main__":
    main()
