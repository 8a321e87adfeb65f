"""The peers section of `make bench`: the same job (peers/job.py) through anytrain, a hand-written
loop (peers/plain.py) and, when installed (`make install-peers`), PyTorch Lightning and the Hugging
Face Trainer (peers/lightning_job.py, peers/hf_trainer_job.py).

    python benchmarks/peers_bench.py --out bench_out/peers --rounds 3

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
from pathlib import Path

from peers import job
from toolkit import BENCH, PY, TRAIN, Runner, launch_cmd, md_head, write_json

COLUMNS = ["trainer", "loop time", "wall time", "plain loop / it, loop", "it / anytrain, loop", "it / anytrain, wall"]
COLUMNS += ["test accuracy", "steps"]
PEERS = {"lightning": ("lightning", "lightning_job.py"), "hf-trainer": ("transformers", "hf_trainer_job.py")}


def anytrain_variant(runner: Runner, data: Path) -> dict:
    d = runner.fresh("peer-anytrain")
    args = ["--dataset", str(data), "--output-dir", str(d), "--no-progress", *job.ANYTRAIN_OPTIONS]
    rec = runner.run("peers/anytrain", launch_cmd("cpu.yaml", TRAIN, *args))
    if "error" not in rec:
        summary = json.loads((d / "summary.json").read_text())
        rec.update(loop_s=summary["loop_seconds"], val_accuracy=summary["val_accuracy"])
        rec.update(test_accuracy=summary["test_accuracy"], steps=summary["optimizer_steps"])
    return rec


def script_variant(runner: Runner, name: str, script: str, data: Path) -> dict:
    d = runner.fresh(f"peer-{name}")
    out = d / "result.json"
    extra = [] if name == "plain" else ["--out", str(d / "run")]
    cmd = [PY, str(BENCH / "peers" / script), "--data", str(data), "--json", str(out), *extra]
    rec = runner.run(f"peers/{name}", cmd)
    if "error" not in rec:
        rec.update(json.loads(out.read_text()))
    return rec


def plan(data: Path) -> tuple[list, list[str]]:
    variants = [("anytrain", lambda r: anytrain_variant(r, data))]
    variants.append(("plain", lambda r: script_variant(r, "plain", "plain.py", data)))
    missing = []
    for name, (module, script) in PEERS.items():
        if importlib.util.find_spec(module) is not None:
            variants.append((name, lambda r, n=name, s=script: script_variant(r, n, s, data)))
        else:
            missing.append(f'{name} (pip install -e ".[peers]")')
    return variants, missing


def summarise(records: list[dict], names: list[str]) -> dict:
    rows = {}
    for name in names:
        ok = [r for r in records if r["variant"] == name and "error" not in r]
        rows[name] = None
        if ok:
            loop, wall = [r["loop_s"] for r in ok], [r["wall_s"] for r in ok]
            rows[name] = {"loop_s": min(loop), "loop_s_median": statistics.median(loop), "wall_s": min(wall)}
            accuracy = statistics.median(r["test_accuracy"] for r in ok)
            rows[name].update(
                wall_s_median=statistics.median(wall), test_accuracy=accuracy, steps=ok[0]["steps"], runs=len(ok)
            )
    a = rows.get("anytrain")
    ratios = {}
    for name, row in rows.items():
        if name != "anytrain" and row and a:
            ratios[name] = {
                "loop": row["loop_s"] / a["loop_s"],
                "wall": row["wall_s"] / a["wall_s"],
            }  # > 1: anytrain faster
    return {"rows": rows, "anytrain_speed_vs": ratios}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out/peers")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    runner = Runner(out)
    variants, missing = plan(job.write_data(out / "data"))
    for m in missing:
        print(f"  not installed, left out: {m}", flush=True)
    records = runner.rounds(variants, args.rounds, label="peers round")
    summary = summarise(records, [n for n, _ in variants])
    result = {"summary": summary, "missing": missing, "records": records, "job": job.__doc__.split("\n\n")[1]}
    write_json(out / "peers.json", result)
    print(table(result["summary"]))
    return result


def table(s: dict) -> str:
    out = md_head(*COLUMNS)
    plain = (s["rows"].get("plain") or {}).get("loop_s")
    for name, row in s["rows"].items():
        if row is None:
            out.append(f"| {name} | failed (see bench.log) | | | | | | |")
            continue
        vs = s["anytrain_speed_vs"].get(name)
        loop, wall = ("%.3f" % vs["loop"], "%.3f" % vs["wall"]) if vs else ("1", "1")
        times = (
            f"{row['loop_s']:.2f} s | {row['wall_s']:.2f} s | {plain / row['loop_s'] if plain else float('nan'):.3f}"
        )
        out.append(f"| {name} | {times} | {loop} | {wall} | {100 * row['test_accuracy']:.2f} % | {row['steps']} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
