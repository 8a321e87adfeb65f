"""anytrain's character-level GPT against nanoGPT's own train.py: same machine, same recipe, interleaved.

    python benchmarks/lm_vs_nanogpt.py --nanogpt DIR                       # 1 round, 2000 iters, eager
    python benchmarks/lm_vs_nanogpt.py --nanogpt DIR --rounds 3 --compile  # also both compiled

DIR is a checkout of karpathy/nanoGPT, run as a subprocess from its own folder (none of its code is here). What
each side runs and how the figures are read: docs/benchmarks.md, "Language model".
"""

import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import toolkit
from toolkit import PY, ROOT, TRAIN, launch_cmd, read_run, run_env, run_process

DEFAULT_DATA = Path("/work/shared/data/tinyshakespeare.txt")
# nanoGPT's README CPU recipe as overrides of config/train_shakespeare_char.py, plus no wandb and float32 (no
# arithmetic change on a CPU: it only turns the no-op GradScaler off); max_iters / lr_decay_iters / eval_interval
# / compile / out_dir are added per run.
NANOGPT_CONFIG = "config/train_shakespeare_char.py"
NANOGPT_RECIPE = dict(device="cpu", eval_iters=20, log_interval=1, block_size=64, batch_size=12, n_layer=4, n_head=4)
NANOGPT_RECIPE.update(n_embd=128, dropout=0.0, wandb_log=False, dtype="float32")
TOKENS = NANOGPT_RECIPE["batch_size"] * NANOGPT_RECIPE["block_size"]  # 768 per iteration, both sides
EVAL_INTERVAL = 250  # config/train_shakespeare_char.py's value, which anytrain's example uses too
ANYTRAIN_CONFIG = "examples/shakespeare_cpu.yaml"
ACCEL_CONFIG = {"eager": "cpu.yaml", "compiled": "cpu_compile.yaml"}
PREPARE_RUNNER = (  # prepare.py with an empty `requests` (imported at its top, used only to download input.txt)
    "import runpy, sys, types\n"
    "try:\n"
    "    import requests  # noqa: F401\n"
    "except ImportError:\n"
    "    sys.modules['requests'] = types.ModuleType('requests')\n"
    "sys.argv = [sys.argv[1]]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)
COLUMNS = ["round", "system", "mode", "val loss", "steady tok/s", "steady ms/iter", "first iter s", "wall s", "threads"]
COLUMNS += ["other load", "status"]
ITER_RE = re.compile(r"^iter (\d+): loss ([-+\d.eE]+|nan), time ([\d.]+)ms")
STEP_RE = re.compile(r"^step (\d+): train loss ([-+\d.eE]+|nan), val loss ([-+\d.eE]+|nan)")
TOKENS_RE = re.compile(r"^tokens per iteration will be: ([\d,]+)")
ACCEL_THREADS_RE = re.compile(r"num_cpu_threads_per_process`? was set to `?(\d+)")


def prepare_nanogpt_data(nanogpt: Path, data: Path, env: dict) -> dict:
    """Put --data in as data/shakespeare_char/input.txt and run its prepare.py, unless already done: input.txt
    has the same bytes and train.bin/val.bin/meta.pkl the sizes of prepare.py's 90/10 split (uint16 per char)."""
    d, src = nanogpt / "data" / "shakespeare_char", data.read_bytes()
    if not (d / "prepare.py").exists():
        sys.exit(f"{d / 'prepare.py'} not found: is --nanogpt a nanoGPT checkout?")
    n = len(src.decode("utf-8"))
    want = {"train.bin": 2 * int(n * 0.9), "val.bin": 2 * (n - int(n * 0.9))}
    info = {"dir": str(d), "characters": n, "train_tokens": want["train.bin"] // 2, "val_tokens": want["val.bin"] // 2}
    inp = d / "input.txt"
    same_input = inp.exists() and inp.read_bytes() == src
    if same_input and (d / "meta.pkl").exists() and all(size(d / f) == b for f, b in want.items()):
        return {**info, "prepared": "already"}
    if not same_input:
        if inp.exists():
            inp.chmod(0o644)
            inp.unlink()
        shutil.copyfile(data, inp)  # copyfile: not the source's (possibly read-only) mode
    cmd = [PY, "-c", PREPARE_RUNNER, "prepare.py"]
    out = subprocess.run(cmd, check=False, cwd=d, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode:
        sys.exit(f"nanoGPT's prepare.py failed:\n{out.stdout}\n{out.stderr}")
    for f, b in want.items():
        if size(d / f) != b:
            sys.exit(f"{d / f}: {size(d / f)} bytes, expected {b}")
    return {**info, "prepared": "now", "prepare_output": out.stdout.strip().splitlines()}


def size(path: Path) -> int | None:
    return path.stat().st_size if path.exists() else None


def nanogpt_eval_interval(iters: int) -> int:
    """250, or the run's length when that is no multiple of 250 (so that nanoGPT still reports a last val loss)."""
    return EVAL_INTERVAL if iters % EVAL_INTERVAL == 0 else iters


def command(system: str, args, mode: str, run_dir: Path) -> tuple[list[str], Path]:
    """(command, folder to run it in) of one run: nanoGPT's `python train.py config/... --key=value ...`
    as its README runs it (iterations 0..N), anytrain's `accelerate launch ... src/train.py --config ...`."""
    iters = args.max_iters
    if system == "nanogpt":
        per_run = dict(compile=mode == "compiled", max_iters=iters, lr_decay_iters=iters)
        overrides = {
            **NANOGPT_RECIPE,
            **per_run,
            "eval_interval": nanogpt_eval_interval(iters),
            "out_dir": str(run_dir),
        }
        return [PY, "train.py", NANOGPT_CONFIG, *(f"--{k}={v}" for k, v in overrides.items())], args.nanogpt
    opts = ["--config", ANYTRAIN_CONFIG, "--max-steps", str(iters), "--output-dir", str(run_dir), "--overwrite"]
    return launch_cmd(ACCEL_CONFIG[mode], TRAIN, *opts, "--no-progress"), ROOT


def parse_nanogpt(lines: list[tuple[float, str]], eval_interval: int, skip_iters: int) -> dict:
    """Figures from nanoGPT's printed lines: steady = the median iteration time, iteration 0, the first
    skip_iters and every evaluating iteration left out."""
    iters, evals, tokens = {}, [], None  # iters: iter -> (loss, ms, second it was printed)
    for t, text in lines:
        if m := ITER_RE.match(text):
            iters[int(m[1])] = (float(m[2]), float(m[3]), t)
        elif m := STEP_RE.match(text):
            evals.append((int(m[1]), float(m[2]), float(m[3])))
        elif m := TOKENS_RE.match(text):
            tokens = int(m[1].replace(",", ""))
    if not iters:
        return {"parse_error": "no `iter N: loss ..., time ...ms` lines"}
    tokens = tokens or TOKENS
    steady = [ms for i, (_, ms, _) in iters.items() if i > 0 and i >= skip_iters and i % eval_interval != 0]
    median_ms, last, first = statistics.median(steady) if steady else None, max(iters), iters.get(0)
    res = {"iters_logged": len(iters), "last_iter": last, "tokens_per_iter": tokens, "steady_iters": len(steady)}
    res.update(steady_ms_per_iter=median_ms, steady_tokens_per_s=tokens / (median_ms / 1000) if median_ms else None)
    res.update(steady_ms_p10_p90=quantiles(steady), first_iter_s=first[1] / 1000 if first else None)
    res["start_to_iter0_s"] = first[2] if first else None  # process start -> iteration 0 printed
    res["loop_s"] = sum(ms for _, ms, _ in iters.values()) / 1000  # evaluation and checkpoint saves in
    res["final_train_loss_logged"] = iters[last][0]
    res["evals"] = [{"step": s, "train_loss": tr, "val_loss": va} for s, tr, va in evals]
    if evals:
        res.update(val_loss_step=evals[-1][0], val_loss=evals[-1][2], best_val_loss=min(va for *_, va in evals))
    return res


def parse_anytrain(run_dir: Path, lines: list[tuple[float, str]], skip_windows: int = 1) -> dict:
    """Figures from anytrain's run folder: steady = the median logged tokens/s after the first window."""
    if not (run_dir / "metrics.jsonl").exists():
        return {"parse_error": f"{run_dir / 'metrics.jsonl'} not found"}
    train, evals, s = read_run(run_dir)
    rates = [r["tokens_per_s"] for r in train[skip_windows:] if r.get("tokens_per_s")]
    res: dict = {"train_windows": len(train), "steady_windows": len(rates)}
    res.update(steady_tokens_per_s=toolkit.steady_tokens_per_s(train, skip_windows))
    last = train[-1] if train else {}
    res.update(steady_tokens_per_s_p10_p90=quantiles(rates), final_train_loss_logged=last.get("loss"))
    res["last_step"] = last.get("step")
    res["evals"] = [{"step": r.get("step"), "val_loss": r.get("loss")} for r in evals]
    if s is None:
        res["parse_error"] = f"{run_dir / 'summary.json'} not found"
    else:
        for k in ("val_loss", "best_val_loss", "tokens_per_s", "wall_time_s", "first_step_s"):
            res[k if k != "tokens_per_s" else "run_tokens_per_s"] = s.get(k)
        res["threads"] = (s.get("scenario") or {}).get("cpu_threads_per_process")
    if res.get("threads") is None:  # accelerate says when it raised the thread count
        found = [int(m[1]) for _, text in lines if (m := ACCEL_THREADS_RE.search(text))]
        res["threads"] = found[-1] if found else None
    if res["steady_tokens_per_s"]:
        res["steady_ms_per_iter"] = 1000 * TOKENS / res["steady_tokens_per_s"]  # same recipe: 768 tokens/step
    return res


def quantiles(xs: list[float]) -> list[float] | None:
    q = statistics.quantiles(xs, n=10) if len(xs) > 1 else None
    return [q[0], q[-1]] if q else None


def fmt(x, spec: str = ".4f") -> str:
    return toolkit.fmt(x, spec, none="-")


def summarize(runs: list[dict], rounds: int, modes: list[str]) -> dict:
    """Per round: anytrain/nanoGPT steady tokens/s and, compiled, each side's compile overhead (its first
    iteration compiled - eager); per mode, the medians."""

    def get(r: int, system: str, mode: str) -> dict:
        return next((x for x in runs if (x["round"], x["system"], x["mode"]) == (r, system, mode)), None) or {}

    out: dict = {"per_round": [], "overall": {}}
    for mode in modes:
        ratios, comp = [], {"nanogpt": [], "anytrain": []}
        for r in range(rounds):
            ng, at, row = get(r, "nanogpt", mode), get(r, "anytrain", mode), {"round": r, "mode": mode}
            if ng.get("steady_tokens_per_s") and at.get("steady_tokens_per_s"):
                row["ratio_anytrain_over_nanogpt"] = at["steady_tokens_per_s"] / ng["steady_tokens_per_s"]
                ratios.append(row["ratio_anytrain_over_nanogpt"])
            first_keys = (("nanogpt", "first_iter_s"), ("anytrain", "first_step_s")) if mode == "compiled" else ()
            for system, key in first_keys:
                c, e = get(r, system, "compiled").get(key), get(r, system, "eager").get(key)
                if c is not None and e is not None:
                    row[f"{system}_compile_overhead_s"] = c - e
                    comp[system].append(c - e)
            out["per_round"].append(row)
        agg: dict = {"ratio_anytrain_over_nanogpt_median": statistics.median(ratios) if ratios else None}
        for system in ("nanogpt", "anytrain"):
            done = [x for x in runs if x["system"] == system and x["mode"] == mode and "error" not in x]
            for key in ("steady_tokens_per_s", "steady_ms_per_iter", "val_loss", "wall_s"):
                vals = [x[key] for x in done if x.get(key) is not None]
                agg[f"{system}_{key}_median"] = statistics.median(vals) if vals else None
            if comp[system]:
                agg[f"{system}_compile_overhead_s_median"] = statistics.median(comp[system])
        out["overall"][mode] = agg
    return out


def table(runs: list[dict], summary: dict) -> str:
    rows = toolkit.md_head(*COLUMNS)
    for x in runs:
        first, threads = x.get("first_iter_s", x.get("first_step_s")), x.get("threads")
        status = (x.get("error") or x.get("parse_error") or "ok").splitlines()[0]
        what = f"{x['round']} | {x['system']} | {x['mode']} | {fmt(x.get('val_loss'))}"
        speed = f"{fmt(x.get('steady_tokens_per_s'), ',.0f')} | {fmt(x.get('steady_ms_per_iter'), '.2f')}"
        times = f"{fmt(first, '.2f')} | {fmt(x.get('wall_s'), '.1f')} | {threads if threads is not None else '-'}"
        rows.append(f"| {what} | {speed} | {times} | {fmt(x.get('other_load'), '.2f')} | {status} |")
    lines = ["\n".join(rows), ""]
    if busy := [x["name"] for x in runs if (x.get("other_load") or 0) > 0.25]:
        squeezed = "those timings are squeezed; compare rounds, or rerun on a quiet machine"
        lines.append(f"- other work kept > 0.25 cores busy during {', '.join(busy)}: {squeezed}")
    for row in summary["per_round"]:
        extra = "".join(f", {k} {v:.1f}" for k, v in row.items() if k.endswith("_compile_overhead_s"))
        ratio = fmt(row.get("ratio_anytrain_over_nanogpt"), ".3f")
        lines.append(f"- round {row['round']} {row['mode']}: anytrain/nanoGPT steady tokens/s = {ratio}{extra}")
    for mode, a in summary["overall"].items():
        ng, at = (side(a, s) for s in ("nanogpt", "anytrain"))
        ratio = fmt(a["ratio_anytrain_over_nanogpt_median"], ".3f")
        lines.append(f"- **{mode}, median over rounds**: ratio {ratio}; nanoGPT {ng}; anytrain {at}")
    return "\n".join(lines) + "\n"


def side(agg: dict, system: str) -> str:
    speed, val, wall = (agg[f"{system}_{k}_median"] for k in ("steady_tokens_per_s", "val_loss", "wall_s"))
    return f"{fmt(speed, ',.0f')} tok/s, val {fmt(val)}, wall {fmt(wall, '.1f')} s"


def parse_args(argv=None):
    p = toolkit.parser(__doc__, out="bench_out/lm_vs_nanogpt", rounds=1)
    p.add_argument("--nanogpt", required=True, type=Path, help="a nanoGPT checkout (its data gets prepared)")
    p.add_argument(
        "--max-iters", type=int, default=2000, help="nanoGPT max_iters, lr_decay_iters; anytrain --max-steps"
    )
    p.add_argument("--compile", action="store_true", help="also both compiled (--compile=True, cpu_compile.yaml)")
    p.add_argument("--systems", nargs="+", choices=("nanogpt", "anytrain"), default=["nanogpt", "anytrain"])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Tiny Shakespeare text for nanoGPT's prepare.py")
    p.add_argument("--timeout", type=float, default=None, help="seconds per run (None: 300 + 0.6 x max-iters)")
    p.add_argument("--skip-iters", type=int, default=10, help="nanoGPT warm-up iterations out of its steady median")
    p.add_argument("--threads", type=int, default=0, help="OMP_NUM_THREADS for both sides; 0: as the launch decides")
    return p.parse_args(argv)


def run_one(name: str, system: str, mode: str, args, env: dict, meta: dict) -> dict:
    """One run, its figures read: nanoGPT's from its printed lines, anytrain's from its run folder."""
    run_dir, log_path = args.out / "runs" / name, args.out / "logs" / f"{name}.log"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd, cwd = command(system, args, mode, run_dir)
    # a fresh inductor cache per run: every compiled run pays (and measures) a cold compile
    cache = dict(env, TORCHINDUCTOR_CACHE_DIR=str(run_dir / "inductor_cache"))
    with log_path.open("w") as log:
        res, lines = run_process(cmd, log, env=cache, cwd=cwd, timeout=args.timeout)
    shutil.rmtree(run_dir / "inductor_cache", ignore_errors=True)
    rec = {"name": name, "system": system, "mode": mode, "cwd": str(cwd), **res, "log": str(log_path)}
    if system == "nanogpt":
        rec.update(parse_nanogpt(lines, nanogpt_eval_interval(args.max_iters), args.skip_iters))
        rec["threads"] = meta["torch_probe"].get("threads")
        (run_dir / "ckpt.pt").unlink(missing_ok=True)  # ~10 MB each; the figures are read
    else:
        rec.update(parse_anytrain(run_dir, lines))
    status = (rec.get("error") or rec.get("parse_error") or "ok").splitlines()[0]
    figures = f"steady {fmt(rec.get('steady_tokens_per_s'), ',.0f')} tok/s  val {fmt(rec.get('val_loss'))}"
    load = f"other load {fmt(rec.get('other_load'), '.2f')}"
    print(f"  {name:24s} wall {rec['wall_s']:7.1f} s  {figures}  {load}  {status}", flush=True)
    for text in rec.get("error_tail", []):
        print(f"      | {text}", flush=True)
    return rec


def metadata(args, env: dict, modes: list[str]) -> dict:
    meta = {"started": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node()}
    meta.update(platform=platform.platform(), cpu_count=os.cpu_count(), python=PY, nanogpt=str(args.nanogpt))
    meta.update(max_iters=args.max_iters, rounds=args.rounds, modes=modes, systems=args.systems, timeout_s=args.timeout)
    meta.update(skip_iters=args.skip_iters, nanogpt_eval_interval=nanogpt_eval_interval(args.max_iters))
    meta["omp_num_threads"] = env.get("OMP_NUM_THREADS")
    code = "import json, torch; print(json.dumps({'torch': torch.__version__, 'threads': torch.get_num_threads()}))"
    try:  # torch's version and the thread count a plain `python train.py` gets here
        out = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
        meta["torch_probe"] = json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as e:  # noqa: BLE001 - a probe failing must not stop the benchmark
        meta["torch_probe"] = {"error": repr(e)}
    if "nanogpt" in args.systems:
        meta["nanogpt_data"] = prepare_nanogpt_data(args.nanogpt, args.data.resolve(), env)
    return meta


def main(argv=None) -> None:
    args = parse_args(argv)
    args.nanogpt, args.out = args.nanogpt.resolve(), Path(args.out).resolve()
    args.timeout = args.timeout or 300 + 0.6 * args.max_iters
    env = run_env(args.threads, PYTHONUNBUFFERED="1")  # the same for both sides
    modes = ["eager", "compiled"] if args.compile else ["eager"]
    variants = [(s, m) for m in modes for s in ("nanogpt", "anytrain") if s in args.systems]
    if not (args.nanogpt / "train.py").exists():
        sys.exit(f"{args.nanogpt / 'train.py'} not found: --nanogpt must be a nanoGPT checkout")
    if "=" in str(args.out):
        sys.exit(f"--out {args.out}: nanoGPT's configurator splits --out_dir=... at '=', so it must not contain one")
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"meta": metadata(args, env, modes), "runs": []}
    probe, timeout = result["meta"]["torch_probe"], f"timeout {args.timeout:.0f} s each"
    runs = f"{args.rounds} round(s) x {len(variants)} runs of {args.max_iters} iterations, {timeout}"
    print(f"torch {probe.get('torch')}, {probe.get('threads')} threads by default; {runs}", flush=True)
    for r in range(args.rounds):
        for system, mode in toolkit.rotated(variants, r):
            rec = run_one(f"r{r}_{system}_{mode}", system, mode, args, env, result["meta"])
            result["runs"].append({"round": r, **rec})
            save(result, args)  # after every run: an interrupted benchmark keeps what it measured
    threads = {x["system"]: x.get("threads") for x in result["runs"] if x.get("threads") is not None}
    if len(set(threads.values())) > 1:
        print(f"WARNING: the two sides ran with different thread counts {threads}; rerun with --threads N", flush=True)
        result["meta"]["thread_mismatch"] = threads
    save(result, args)
    md = table(result["runs"], result["summary"])
    (args.out / "lm_vs_nanogpt.md").write_text(md)
    print(f"\n{md}\nJSON: {args.out / 'lm_vs_nanogpt.json'}")


def save(result: dict, args) -> None:
    result["summary"] = summarize(result["runs"], args.rounds, result["meta"]["modes"])
    toolkit.write_json(args.out / "lm_vs_nanogpt.json", result)


if __name__ == "__main__":
    main()
