"""CPU DDP on the GPT CPU recipe, interleaved: steady tokens/s of 2 ranks x 1 thread (multi_cpu.yaml, batch 6 per
rank) / 1 rank x 2 threads (cpu.yaml, batch 12); 1.0: the all-reduce and the smaller matmuls cost nothing."""

import json

import toolkit

VARIANTS = {"1x2": ("cpu.yaml", 12), "2x1": ("multi_cpu.yaml", 6)}


def run(name: str, steps: int, out) -> dict:
    config, batch = VARIANTS[name]
    options = ["--batch-size", str(batch), "--max-steps", str(steps), *"--eval-every-steps 0 --eval-windows 64".split()]
    rec, _, train, summary = toolkit.lm_run(config, out / name, "shakespeare_cpu.yaml", options, timeout=1200)
    if "error" in rec:
        raise SystemExit(f"{name} failed: {rec['error']}\n" + "\n".join(rec.get("error_tail", [])))
    res = {"variant": name, "steady_tokens_per_s": toolkit.steady_tokens_per_s(train), "wall_s": rec["wall_s"]}
    scenario = summary["scenario"]
    res.update(processes=scenario["num_processes"], threads=scenario["cpu_threads_per_process"])
    return {**res, "val_loss": summary["val_loss"]}


def main(argv=None) -> None:
    p = toolkit.parser(__doc__, out="bench_out/lm_ddp_scaling", rounds=2)
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args(argv)
    out, results = toolkit.out_dir(args.out), []

    def variant(name: str, r: int) -> dict:
        results.append({"round": r, **run(name, args.steps, out)})
        print(json.dumps(results[-1]), flush=True)
        return results[-1]["steady_tokens_per_s"]

    rates = toolkit.interleave(list(VARIANTS), args.rounds, variant)
    best = {name: max(rates[name]) for name in VARIANTS}
    ratios = [a / b for a, b in zip(rates["2x1"], rates["1x2"])]
    report = {"results": results, "best_tokens_per_s": best, "scaling_best": best["2x1"] / best["1x2"]}
    toolkit.write_json(out / "lm_ddp_scaling.json", {**report, "scaling_per_round": ratios}, indent=2)
    per_round = ", ".join(f"{x:.3f}" for x in ratios)
    speeds = f"({best['2x1']:,.0f} / {best['1x2']:,.0f}); per round {per_round}"
    print(f"2 ranks x 1 thread / 1 rank x 2 threads, steady tokens/s: best {report['scaling_best']:.3f} {speeds}")


if __name__ == "__main__":
    main()
