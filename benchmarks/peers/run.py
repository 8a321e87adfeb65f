"""The peers section of `make bench`: the same job (job.py) through anytrain, a hand-written loop,
and, when installed (`pip install -e ".[peers]"`), PyTorch Lightning and the Hugging Face Trainer.

    python benchmarks/peers/run.py --out bench_out/peers --rounds 3

Each is started the way its users start it: anytrain with `accelerate launch --config_file
accelerate_configs/cpu.yaml src/train.py ...` (its README's command), the others with `python
script.py`. Rounds are interleaved, in an order that rotates per round. Per run: loop time (the
epochs with their validations and checkpoints, from each script's own clock) and wall time (process
start to exit, this runner's clock). The fastest round of each counts (other work on the machine
only slows a run down); every run is kept in peers.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # bench.py: the runner, the launch command, the environment

import bench  # noqa: E402
import job  # noqa: E402

PEERS = {"lightning": ("lightning", "lightning_job.py"), "hf-trainer": ("transformers", "hf_trainer_job.py")}


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def anytrain_variant(runner: bench.Runner, data: Path) -> dict:
    d = runner.fresh("peer-anytrain")
    rec = runner.run("peers/anytrain", bench.launch_cmd("cpu.yaml", bench.TRAIN, "--dataset", str(data), "--output-dir", str(d), "--no-progress", *job.ANYTRAIN_OPTIONS))
    if "error" not in rec:
        summary = json.loads((d / "summary.json").read_text())
        rec.update(loop_s=summary["loop_seconds"], val_accuracy=summary["val_accuracy"], test_accuracy=summary["test_accuracy"], steps=summary["optimizer_steps"])
    return rec


def script_variant(runner: bench.Runner, name: str, script: str, data: Path) -> dict:
    d = runner.fresh(f"peer-{name}")
    out = d / "result.json"
    extra = [] if name == "plain" else ["--out", str(d / "run")]
    rec = runner.run(f"peers/{name}", [bench.PY, str(HERE / script), "--data", str(data), "--json", str(out), *extra])
    if "error" not in rec:
        rec.update(json.loads(out.read_text()))
    return rec


def plan(data: Path) -> tuple[list, list[str]]:
    variants = [("anytrain", lambda r: anytrain_variant(r, data)), ("plain", lambda r: script_variant(r, "plain", "plain.py", data))]
    missing = []
    for name, (module, script) in PEERS.items():
        if installed(module):
            variants.append((name, lambda r, n=name, s=script: script_variant(r, n, s, data)))
        else:
            missing.append(f"{name} (pip install -e \".[peers]\")")
    return variants, missing


def summarise(records: list[dict], names: list[str]) -> dict:
    rows = {}
    for name in names:
        ok = [r for r in records if r["variant"] == name and "error" not in r]
        if not ok:
            rows[name] = None
            continue
        rows[name] = {
            "loop_s": min(r["loop_s"] for r in ok), "loop_s_median": statistics.median(r["loop_s"] for r in ok),
            "wall_s": min(r["wall_s"] for r in ok), "wall_s_median": statistics.median(r["wall_s"] for r in ok),
            "test_accuracy": statistics.median(r["test_accuracy"] for r in ok), "steps": ok[0]["steps"], "runs": len(ok),
        }
    a = rows.get("anytrain")
    ratios = {}
    for name, row in rows.items():
        if name != "anytrain" and row and a:
            ratios[name] = {"loop": row["loop_s"] / a["loop_s"], "wall": row["wall_s"] / a["wall_s"]}  # > 1: anytrain is faster
    return {"rows": rows, "anytrain_speed_vs": ratios}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out/peers")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = job.write_data(out / "data")
    runner = bench.Runner(out)
    variants, missing = plan(data)
    for m in missing:
        print(f"  not installed, left out: {m}", flush=True)
    records = []
    for r in range(args.rounds):
        print(f"peers round {r + 1}/{args.rounds}", flush=True)
        k = r % len(variants)
        for name, fn in variants[k:] + variants[:k]:
            rec = fn(runner)
            rec["variant"], rec["round"] = name, r
            records.append(rec)
    result = {"summary": summarise(records, [n for n, _ in variants]), "missing": missing, "records": records, "job": job.__doc__.split("\n\n")[1]}
    (out / "peers.json").write_text(json.dumps(result, indent=1, default=str))
    print(table(result["summary"]))
    return result


def table(s: dict) -> str:
    out = ["| trainer | loop time | wall time | plain loop / it, loop | it / anytrain, loop | it / anytrain, wall | test accuracy | steps |",
           "|---|---|---|---|---|---|---|---|"]
    plain = (s["rows"].get("plain") or {}).get("loop_s")
    for name, row in s["rows"].items():
        if row is None:
            out.append(f"| {name} | failed (see bench.log) | | | | | | |")
            continue
        vs = s["anytrain_speed_vs"].get(name)
        out.append(f"| {name} | {row['loop_s']:.2f} s | {row['wall_s']:.2f} s | {plain / row['loop_s'] if plain else float('nan'):.3f} | "
                   f"{'%.3f' % vs['loop'] if vs else '1'} | {'%.3f' % vs['wall'] if vs else '1'} | {100 * row['test_accuracy']:.2f} % | {row['steps']} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
