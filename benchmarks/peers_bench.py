"""The peers section of `make bench`: the job of peers/job.py through anytrain (`accelerate launch`, its README's
command), a plain loop and, when installed (`make install-peers`), Lightning and the HF Trainer (`python script.py`),
in interleaved rounds; the fastest round of each counts, every run is kept in peers.json (docs/benchmarks.md)."""

import importlib.util
import json
import statistics
from pathlib import Path

import toolkit
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
    extra = [] if name == "plain" else ["--out", str(d / "run")]
    cmd = [PY, str(BENCH / "peers" / script), "--data", str(data), "--json", str(d / "result.json"), *extra]
    rec = runner.run(f"peers/{name}", cmd)
    if "error" not in rec:
        rec.update(json.loads((d / "result.json").read_text()))
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
    rows, med = {}, statistics.median
    for name in names:
        ok = [r for r in records if r["variant"] == name and "error" not in r]
        loop, wall = [r["loop_s"] for r in ok], [r["wall_s"] for r in ok]
        rows[name] = {"loop_s": min(loop), "loop_s_median": med(loop), "wall_s": min(wall)} if ok else None
        if ok:
            rows[name].update(wall_s_median=med(wall), test_accuracy=med(r["test_accuracy"] for r in ok))
            rows[name].update(steps=ok[0]["steps"], runs=len(ok))
    a = rows.get("anytrain")  # ratios > 1: anytrain faster
    peers = [(n, row) for n, row in rows.items() if n != "anytrain" and row and a]
    ratios = {n: {"loop": row["loop_s"] / a["loop_s"], "wall": row["wall_s"] / a["wall_s"]} for n, row in peers}
    return {"rows": rows, "anytrain_speed_vs": ratios}


def main(argv=None) -> dict:
    args = toolkit.parser(__doc__, out="bench_out/peers", rounds=3).parse_args(argv)
    out = toolkit.out_dir(args.out)
    variants, missing = plan(job.write_data(out / "data"))
    for m in missing:
        print(f"  not installed, left out: {m}", flush=True)
    records = Runner(out).rounds(variants, args.rounds, label="peers round")
    summary = summarise(records, [n for n, _ in variants])
    result = {"summary": summary, "missing": missing, "records": records, "job": job.__doc__.split("\n\n")[1].strip()}
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
