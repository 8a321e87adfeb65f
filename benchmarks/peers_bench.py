"""The peers section of `make bench`: the job of peers/job.py through anytrain (`accelerate launch`, its README's
command), a plain loop and, when installed (`make install-peers`), Lightning and the HF Trainer (`python script.py`);
and, with transformers, the text job of peers/text_job.py (a tiny BERT fine-tuned) through anytrain's
`--model hf:FOLDER` and the HF Trainer. All in interleaved rounds; the fastest round of each counts, every run is
kept in peers.json (docs/benchmarks.md)."""

import importlib.util
import json
import statistics
from pathlib import Path

import toolkit
from peers import job, text_job
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


def text_data(folder: Path) -> tuple[Path, Path]:
    """shakespeare-speakers as DIR/{train,validation,test}.parquet, and the tiny BERT built on its training texts."""
    from anytrain.data.speakers import load_speakers

    folder.mkdir(parents=True, exist_ok=True)
    splits = load_speakers()
    for name, ds in splits.items():
        if not (folder / f"{name}.parquet").exists():
            ds.to_parquet(str(folder / f"{name}.parquet"))
    return folder, text_job.build_bert(folder.parent / "bert", splits["train"][text_job.TEXT])


def anytrain_text_variant(runner: Runner, data: Path, model: Path) -> dict:
    d = runner.fresh("peer-text-anytrain")
    args = ["--model", f"hf:{model}", "--dataset", str(data), "--output-dir", str(d), "--no-progress"]
    rec = runner.run("peers/text-anytrain", launch_cmd("cpu.yaml", TRAIN, *args, *text_job.ANYTRAIN_OPTIONS))
    if "error" not in rec:
        summary = json.loads((d / "summary.json").read_text())
        rec.update(loop_s=summary["loop_seconds"], val_accuracy=summary["val_accuracy"])
        rec.update(test_accuracy=summary["test_accuracy"], steps=summary["optimizer_steps"])
        rec.update(start_to_first_step_s=summary["start_to_first_step_s"])
    return rec


def text_trainer_variant(runner: Runner, data: Path, model: Path) -> dict:
    d = runner.fresh("peer-text-hf-trainer")
    script = BENCH / "peers" / "hf_trainer_text_job.py"
    cmd = [PY, str(script), "--data", str(data), "--model", str(model), "--json", str(d / "result.json")]
    rec = runner.run("peers/text-hf-trainer", [*cmd, "--out", str(d / "run")])
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
    if importlib.util.find_spec("transformers") is not None:
        text, model = text_data(data.parent / "text")
        variants.append(("text-anytrain", lambda r: anytrain_text_variant(r, text, model)))
        variants.append(("text-hf-trainer", lambda r: text_trainer_variant(r, text, model)))
    else:
        missing.append('the text job (pip install -e ".[hf]")')
    return variants, missing


def summarise(records: list[dict], names: list[str]) -> dict:
    rows, med = {}, statistics.median
    for name in names:
        ok = [r for r in records if r["variant"] == name and "error" not in r]
        loop, wall = [r["loop_s"] for r in ok], [r["wall_s"] for r in ok]
        rows[name] = {"loop_s": min(loop), "loop_s_median": med(loop), "wall_s": min(wall)} if ok else None
        if ok:
            rows[name].update(wall_s_median=med(wall), test_accuracy=med(r["test_accuracy"] for r in ok))
            rows[name].update(steps=ok[0]["steps"], runs=len(ok), val_accuracy=med(r["val_accuracy"] for r in ok))
            if "start_to_first_step_s" in ok[0]:
                rows[name]["start_to_first_step_s"] = min(r["start_to_first_step_s"] for r in ok)
    ratios = {}  # > 1: anytrain faster; the text job's trainers against anytrain on the text job
    for n, row in rows.items():
        a = rows.get("text-anytrain" if n.startswith("text-") else "anytrain")
        if row and a and n not in ("anytrain", "text-anytrain"):
            ratios[n] = {"loop": row["loop_s"] / a["loop_s"], "wall": row["wall_s"] / a["wall_s"]}
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
    print(text_table(result["summary"]))
    return result


def text_table(s: dict) -> str:
    """The text job: loop and wall time, start-up (import to the end of the first step), accuracies."""
    out = md_head(
        "trainer", "loop time", "wall time", "start-up", "it / anytrain, loop", "val accuracy", "test accuracy"
    )
    for name in ("text-anytrain", "text-hf-trainer"):
        row = s["rows"].get(name)
        if row is None:
            continue
        vs = s["anytrain_speed_vs"].get(name, {"loop": 1.0})
        out.append(
            f"| {name.removeprefix('text-')} | {row['loop_s']:.2f} s | {row['wall_s']:.2f} s | "
            f"{row.get('start_to_first_step_s', float('nan')):.2f} s | {vs['loop']:.3f} | "
            f"{100 * row['val_accuracy']:.1f} % | {100 * row['test_accuracy']:.1f} % |"
        )
    return "\n".join(out)


def table(s: dict) -> str:
    out = md_head(*COLUMNS)
    plain = (s["rows"].get("plain") or {}).get("loop_s")
    for name, row in s["rows"].items():
        if name.startswith("text-"):
            continue  # the text job has its own table
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
