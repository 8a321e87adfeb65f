"""anytrain's character-level GPT against nanoGPT's own train.py: same machine, same recipe, interleaved.

    python benchmarks/lm_vs_nanogpt.py --nanogpt /work/nanogpt                 # 1 round, 2000 iters, eager
    python benchmarks/lm_vs_nanogpt.py --nanogpt /work/nanogpt --rounds 3 --compile
    python benchmarks/lm_vs_nanogpt.py --nanogpt /work/nanogpt --max-iters 200 --systems nanogpt   # quick look

--nanogpt is a checkout of https://github.com/karpathy/nanoGPT (e.g. `git --git-dir=<bare repo> archive
HEAD | tar -x -C DIR`). None of its code is copied here: its train.py runs as a subprocess, from its own
folder, exactly as its README's CPU recipe says, plus --out_dir (a run folder under --out, so nothing is
written into the checkout except the prepared data), --wandb_log=False and --dtype=float32.
--dtype=float32 changes no arithmetic on a CPU (train.py autocasts only on CUDA); it only turns nanoGPT's
no-op GradScaler off explicitly instead of letting it warn "enabled, but CUDA is not available. Disabling."
No compatibility shim is needed for train.py on torch 2.13 (torch.cuda.amp.GradScaler still exists there,
deprecated). The one shim is for data preparation: data/shakespeare_char/prepare.py does `import requests`
at the top (only used to download input.txt), and the project's venv has no `requests`; since input.txt is
copied in from --data first, the download never happens, so the harness runs prepare.py with runpy after
putting an empty stand-in module in sys.modules['requests'] (only when `requests` is not importable).

The recipe (nanoGPT's README, "I only have a macbook"): 4 layers, 4 heads, n_embd 128, block_size 64,
batch_size 12 (768 tokens per iteration), dropout 0, AdamW lr 1e-3 -> min_lr 1e-4 (cosine, 100 warm-up
iterations), beta2 0.99, weight_decay 0.1, grad_clip 1.0, eval every 250 iterations over 20 batches, CPU,
fp32. anytrain runs examples/shakespeare_cpu.yaml (which must encode the same recipe) through
`accelerate launch --config_file accelerate_configs/cpu.yaml` (cpu_compile.yaml with --compile).

--max-iters N (default 2000) goes to nanoGPT as max_iters AND lr_decay_iters and to anytrain as
--max-steps, so a short N shortens the cosine schedule for both identically (final losses of a short N
are not comparable with the full run's). If N is not a multiple of 250, nanoGPT's eval_interval becomes N
(evaluation at iteration 0 and N only) so that it still reports a validation loss at the end.
Note nanoGPT trains iterations 0..N inclusive (N+1 optimizer steps: its loop breaks when iter > N);
anytrain trains N.

Figures per run:
  * steady tokens/s. nanoGPT: tokens per iteration (768) / the median of its printed per-iteration
    `time` (it is wall time between the ends of consecutive iterations, so it includes data loading),
    leaving out iteration 0, the first --skip-iters iterations, and every iteration at which it
    evaluated (iter % eval_interval == 0: that iteration's time contains the evaluation and the
    checkpoint save). anytrain: the median `tokens_per_s` of its metrics.jsonl train lines, leaving out
    the first window (anytrain leaves evaluation and checkpoint pauses out of its windows itself).
  * final validation loss. nanoGPT: the last `val loss` it printed (mean over 20 random val batches of
    12x64, so it carries a few 0.01 of sampling noise); anytrain: summary.json's val_loss.
  * wall: the whole process, start to exit, timed from outside (imports, data, compile, evaluation in).
  * other load: the average number of cores other processes kept busy during the run (from
    /proc/stat minus the run's own CPU time); the table flags runs where it exceeded 0.25.
  * first iteration: nanoGPT's printed time of iteration 0 (it contains the step-0 evaluation and, with
    --compile, the compilation of the eval and train graphs); anytrain: summary.json's first_step_s.
    With --compile the table also gives compile overhead = compiled first iteration - eager first
    iteration of the same round. Every run gets its own empty TORCHINDUCTOR_CACHE_DIR, so each compiled
    run compiles cold (no run profits from an earlier one's cache).
The ratio is anytrain/nanoGPT steady tokens/s, per round and mode, and the median over rounds.

Runs are interleaved: every round runs every (system, mode) once, the order rotating per round, so slow
spells of a shared machine hit both sides alike. Every run is a subprocess with a timeout (--timeout).
Threads: both sides get the same environment with OMP_NUM_THREADS/MKL_NUM_THREADS removed, so nanoGPT
uses torch's default (the physical core count) and accelerate launch sets OMP_NUM_THREADS to the physical
core count for anytrain: the same number (2 on a 2-core machine). --threads T sets OMP_NUM_THREADS=T for
both instead. The threads each side used are recorded and a mismatch is flagged.
Known difference not levelled here: anytrain flushes denormals to zero on CPU, nanoGPT does not.

Output: <out>/lm_vs_nanogpt.json (every run, every figure, the commands), <out>/lm_vs_nanogpt.md (the
table printed at the end), <out>/logs/<run>.log (each process's output), <out>/runs/<run>/ (run folders).
The JSON is rewritten after every run, so an interrupted benchmark keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PY = ROOT / ".venv" / "bin" / "python"
DEFAULT_DATA = Path("/work/shared/data/tinyshakespeare.txt")

# nanoGPT's README CPU recipe, as command-line overrides of config/train_shakespeare_char.py.
# max_iters / lr_decay_iters / eval_interval / compile / out_dir are added per run.
NANOGPT_CONFIG = "config/train_shakespeare_char.py"
NANOGPT_RECIPE = {
    "device": "cpu",
    "eval_iters": 20,
    "log_interval": 1,
    "block_size": 64,
    "batch_size": 12,
    "n_layer": 4,
    "n_head": 4,
    "n_embd": 128,
    "dropout": 0.0,
    # not in the README's command line, see the module docstring
    "wandb_log": False,
    "dtype": "float32",
}
EVAL_INTERVAL = 250  # config/train_shakespeare_char.py's value, which anytrain's example uses too

ANYTRAIN_CONFIG = "examples/shakespeare_cpu.yaml"
ACCEL_CONFIG = {"eager": "accelerate_configs/cpu.yaml", "compiled": "accelerate_configs/cpu_compile.yaml"}

# Runs prepare.py with an empty stand-in for `requests` when that is not installed (it is imported at
# the top of prepare.py but only used to download input.txt, which the harness has put in place).
PREPARE_RUNNER = (
    "import runpy, sys, types\n"
    "try:\n"
    "    import requests  # noqa: F401\n"
    "except ImportError:\n"
    "    sys.modules['requests'] = types.ModuleType('requests')\n"
    "sys.argv = [sys.argv[1]]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)

ITER_RE = re.compile(r"^iter (\d+): loss ([-+\d.eE]+|nan), time ([\d.]+)ms")
STEP_RE = re.compile(r"^step (\d+): train loss ([-+\d.eE]+|nan), val loss ([-+\d.eE]+|nan)")
TOKENS_RE = re.compile(r"^tokens per iteration will be: ([\d,]+)")
ACCEL_THREADS_RE = re.compile(r"num_cpu_threads_per_process`? was set to `?(\d+)")


# ----------------------------------------------------------------------------- environment


def base_env(threads: int | None) -> dict:
    """The environment of every run: the same for both systems."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(k, None)  # torch's default for nanoGPT, the launch's choice for anytrain (both = cores)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def probe_torch(python: str, env: dict) -> dict:
    """torch version and the intra-op thread count a plain `python train.py` gets in this environment."""
    code = "import json, torch; print(json.dumps({'torch': torch.__version__, 'threads': torch.get_num_threads()}))"
    try:
        out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as e:  # noqa: BLE001 - a probe failing must not stop the benchmark
        return {"error": repr(e)}


# ----------------------------------------------------------------------------- nanoGPT data


def prepare_nanogpt_data(nanogpt: Path, data: Path, python: str, env: dict) -> dict:
    """Put --data in as data/shakespeare_char/input.txt and run its prepare.py, unless already done.

    Done = input.txt has the same bytes as --data and train.bin/val.bin/meta.pkl exist with the sizes
    prepare.py's 90/10 split of that text gives (uint16 per character).
    """
    d = nanogpt / "data" / "shakespeare_char"
    if not (d / "prepare.py").exists():
        sys.exit(f"{d / 'prepare.py'} not found: is --nanogpt a nanoGPT checkout?")
    src = data.read_bytes()
    n = len(src.decode("utf-8"))
    want = {"train.bin": 2 * int(n * 0.9), "val.bin": 2 * (n - int(n * 0.9))}
    inp = d / "input.txt"
    same_input = inp.exists() and inp.read_bytes() == src
    done = same_input and (d / "meta.pkl").exists() and all(
        (d / f).exists() and (d / f).stat().st_size == size for f, size in want.items()
    )
    info = {"dir": str(d), "characters": n, "train_tokens": want["train.bin"] // 2, "val_tokens": want["val.bin"] // 2}
    if done:
        return {**info, "prepared": "already"}
    if not same_input:
        if inp.exists():
            inp.chmod(0o644)
            inp.unlink()
        shutil.copyfile(data, inp)  # copyfile: not the source's (possibly read-only) mode
    out = subprocess.run([python, "-c", PREPARE_RUNNER, "prepare.py"], check=False, cwd=d, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode:
        sys.exit(f"nanoGPT's prepare.py failed:\n{out.stdout}\n{out.stderr}")
    for f, size in want.items():
        if (d / f).stat().st_size != size:
            sys.exit(f"{d / f}: {(d / f).stat().st_size} bytes, expected {size}")
    return {**info, "prepared": "now", "prepare_output": out.stdout.strip().splitlines()}


# ----------------------------------------------------------------------------- commands


def nanogpt_cmd(python: str, iters: int, compiled: bool, out_dir: Path) -> list[str]:
    """`python train.py config/train_shakespeare_char.py --key=value ...`, as nanoGPT's README runs it."""
    overrides = dict(NANOGPT_RECIPE)
    overrides.update(
        compile=compiled,
        max_iters=iters,
        lr_decay_iters=iters,
        eval_interval=nanogpt_eval_interval(iters),
        out_dir=str(out_dir),
    )
    return [python, "train.py", NANOGPT_CONFIG, *(f"--{k}={v}" for k, v in overrides.items())]


def nanogpt_eval_interval(iters: int) -> int:
    return EVAL_INTERVAL if iters % EVAL_INTERVAL == 0 else iters


def anytrain_cmd(python: str, iters: int, compiled: bool, out_dir: Path) -> list[str]:
    return [
        python, "-m", "accelerate.commands.launch", "--config_file", ACCEL_CONFIG["compiled" if compiled else "eager"],
        "src/train.py", "--config", ANYTRAIN_CONFIG, "--max-steps", str(iters),
        "--output-dir", str(out_dir), "--overwrite", "--no-progress",
    ]


# ----------------------------------------------------------------------------- running


def busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (Linux /proc/stat), None elsewhere."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # guest time is already in user


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_process(cmd: list[str], cwd: Path, env: dict, timeout: float, log_path: Path) -> dict:
    """Run cmd with a wall-clock limit; return wall seconds, exit code and its output lines.

    The process gets its own session, so a timeout ends it and its children (accelerate launch starts
    the trainer as a child) by process group. Each line is kept with the second it arrived.
    Also measured: the CPU seconds the run used (`cpu_s`) and `other_load`, the average number of
    cores that everything else on the machine kept busy meanwhile (0 on a quiet machine; on a 2-core
    machine anything near 1 or more means the run's timings were squeezed by other work).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    lines: list[tuple[float, str]] = []
    timed_out = threading.Event()
    busy0, cpu0 = busy_cpu_s(), children_cpu_s()
    start = time.perf_counter()
    with log_path.open("w") as log:
        log.write(f"$ (cd {cwd} && {' '.join(cmd)})\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1, start_new_session=True)

        def stop() -> None:
            timed_out.set()
            for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    return
                try:
                    proc.wait(timeout=grace or None)
                    return
                except subprocess.TimeoutExpired:
                    pass

        timer = threading.Timer(timeout, stop)
        timer.daemon = True
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append((time.perf_counter() - start, line.rstrip("\n")))
                log.write(line)
            proc.wait()
        finally:
            timer.cancel()
    wall = time.perf_counter() - start
    cpu, busy1 = children_cpu_s() - cpu0, busy_cpu_s()
    rec = {"wall_s": wall, "returncode": proc.returncode, "log": str(log_path), "cpu_s": cpu,
           "other_load": max(0.0, (busy1 - busy0 - cpu) / wall) if busy0 is not None and busy1 is not None else None}
    if timed_out.is_set():
        rec["error"] = f"timed out after {timeout:.0f} s"
    elif proc.returncode:
        rec["error"] = f"exit code {proc.returncode} (see {log_path.name})"
        rec["error_tail"] = [text for _, text in lines[-15:]]
    rec["lines"] = lines
    return rec


# ----------------------------------------------------------------------------- parsing


def parse_nanogpt(lines: list[tuple[float, str]], eval_interval: int, skip_iters: int) -> dict:
    """Figures from nanoGPT's printed lines (see the module docstring)."""
    iters: dict[int, tuple[float, float, float]] = {}  # iter -> (loss, ms, arrival s)
    evals: list[tuple[int, float, float]] = []
    tokens_per_iter = None
    for t, text in lines:
        if m := ITER_RE.match(text):
            iters[int(m[1])] = (float(m[2]), float(m[3]), t)
        elif m := STEP_RE.match(text):
            evals.append((int(m[1]), float(m[2]), float(m[3])))
        elif m := TOKENS_RE.match(text):
            tokens_per_iter = int(m[1].replace(",", ""))
    if not iters:
        return {"parse_error": "no `iter N: loss ..., time ...ms` lines"}
    tokens_per_iter = tokens_per_iter or NANOGPT_RECIPE["batch_size"] * NANOGPT_RECIPE["block_size"]
    steady = [ms for i, (_, ms, _) in iters.items() if i > 0 and i >= skip_iters and i % eval_interval != 0]
    median_ms = statistics.median(steady) if steady else None
    last = max(iters)
    res = {
        "iters_logged": len(iters),
        "last_iter": last,
        "tokens_per_iter": tokens_per_iter,
        "steady_iters": len(steady),
        "steady_ms_per_iter": median_ms,
        "steady_tokens_per_s": tokens_per_iter / (median_ms / 1000) if median_ms else None,
        "steady_ms_p10_p90": quantiles(steady),
        "first_iter_s": iters[0][1] / 1000 if 0 in iters else None,
        "start_to_iter0_s": iters[0][2] if 0 in iters else None,  # process start -> iteration 0 printed
        "loop_s": sum(ms for _, ms, _ in iters.values()) / 1000,  # evaluation and checkpoint saves in
        "final_train_loss_logged": iters[last][0],
        "evals": [{"step": s, "train_loss": tr, "val_loss": va} for s, tr, va in evals],
    }
    if evals:
        res["val_loss_step"], res["val_loss"] = evals[-1][0], evals[-1][2]
        res["best_val_loss"] = min(va for _, _, va in evals)
    return res


def parse_anytrain(run_dir: Path, lines: list[tuple[float, str]], skip_windows: int = 1) -> dict:
    """Figures from anytrain's metrics.jsonl and summary.json (see the module docstring)."""
    metrics, summary = run_dir / "metrics.jsonl", run_dir / "summary.json"
    if not metrics.exists():
        return {"parse_error": f"{metrics} not found"}
    recs = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    train = sorted((r for r in recs if r.get("kind") == "train"), key=lambda r: r["step"])
    evals = [r for r in recs if r.get("kind") == "eval" and r.get("split") == "validation"]
    rates = [r["tokens_per_s"] for r in train[skip_windows:] if r.get("tokens_per_s")]
    res: dict = {
        "train_windows": len(train),
        "steady_windows": len(rates),
        "steady_tokens_per_s": statistics.median(rates) if rates else None,
        "steady_tokens_per_s_p10_p90": quantiles(rates),
        "final_train_loss_logged": train[-1]["loss"] if train else None,
        "last_step": train[-1]["step"] if train else None,
        "evals": [{"step": r.get("step"), "val_loss": r.get("loss")} for r in evals],
    }
    if summary.exists():
        s = json.loads(summary.read_text())
        for k in ("val_loss", "best_val_loss", "tokens_per_s", "wall_time_s", "first_step_s"):
            res[k if k != "tokens_per_s" else "run_tokens_per_s"] = s.get(k)
        res["threads"] = (s.get("scenario") or {}).get("cpu_threads_per_process")
    else:
        res["parse_error"] = f"{summary} not found"
    if res.get("threads") is None:  # accelerate says when it raised the thread count
        found = [int(m[1]) for _, text in lines if (m := ACCEL_THREADS_RE.search(text))]
        res["threads"] = found[-1] if found else None
    if res.get("steady_ms_per_iter") is None and res["steady_tokens_per_s"]:
        tokens = NANOGPT_RECIPE["batch_size"] * NANOGPT_RECIPE["block_size"]
        res["steady_ms_per_iter"] = 1000 * tokens / res["steady_tokens_per_s"]  # same recipe: 768 tokens/step
    return res


def quantiles(xs: list[float]) -> list[float] | None:
    if len(xs) < 2:
        return None
    q = statistics.quantiles(xs, n=10)
    return [q[0], q[-1]]


# ----------------------------------------------------------------------------- report


def fmt(x, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def summarize(runs: list[dict], rounds: int, modes: list[str]) -> dict:
    def get(r: int, system: str, mode: str) -> dict | None:
        return next((x for x in runs if (x["round"], x["system"], x["mode"]) == (r, system, mode)), None)

    out: dict = {"per_round": [], "overall": {}}
    for mode in modes:
        ratios, comp = [], {"nanogpt": [], "anytrain": []}
        for r in range(rounds):
            ng, at = get(r, "nanogpt", mode), get(r, "anytrain", mode)
            row = {"round": r, "mode": mode}
            if ng and at and ng.get("steady_tokens_per_s") and at.get("steady_tokens_per_s"):
                row["ratio_anytrain_over_nanogpt"] = at["steady_tokens_per_s"] / ng["steady_tokens_per_s"]
                ratios.append(row["ratio_anytrain_over_nanogpt"])
            if mode == "compiled":
                for system, key in (("nanogpt", "first_iter_s"), ("anytrain", "first_step_s")):
                    c, e = get(r, system, "compiled"), get(r, system, "eager")
                    if c and e and c.get(key) is not None and e.get(key) is not None:
                        row[f"{system}_compile_overhead_s"] = c[key] - e[key]
                        comp[system].append(c[key] - e[key])
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
    head = "| round | system | mode | val loss | steady tok/s | steady ms/iter | first iter s | wall s | threads | other load | status |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for x in runs:
        first = x.get("first_iter_s", x.get("first_step_s"))
        status = "ok" if "error" not in x and "parse_error" not in x else (x.get("error") or x.get("parse_error")).splitlines()[0]
        rows.append(
            f"| {x['round']} | {x['system']} | {x['mode']} | {fmt(x.get('val_loss'))} | {fmt(x.get('steady_tokens_per_s'), ',.0f')} "
            f"| {fmt(x.get('steady_ms_per_iter'), '.2f')} | {fmt(first, '.2f')} | {fmt(x.get('wall_s'), '.1f')} "
            f"| {x.get('threads') if x.get('threads') is not None else '-'} | {fmt(x.get('other_load'), '.2f')} | {status} |"
        )
    lines = ["\n".join(rows), ""]
    busy = [x for x in runs if (x.get("other_load") or 0) > 0.25]
    if busy:
        lines.append(f"- other work kept > 0.25 cores busy during {', '.join(x['name'] for x in busy)}: "
                     "those timings are squeezed; compare rounds, or rerun on a quiet machine")
    for row in summary["per_round"]:
        extra = "".join(f", {k} {v:.1f}" for k, v in row.items() if k.endswith("_compile_overhead_s"))
        lines.append(f"- round {row['round']} {row['mode']}: anytrain/nanoGPT steady tokens/s = "
                     f"{fmt(row.get('ratio_anytrain_over_nanogpt'), '.3f')}{extra}")
    for mode, agg in summary["overall"].items():
        lines.append(
            f"- **{mode}, median over rounds**: ratio {fmt(agg['ratio_anytrain_over_nanogpt_median'], '.3f')}; "
            f"nanoGPT {fmt(agg['nanogpt_steady_tokens_per_s_median'], ',.0f')} tok/s, val {fmt(agg['nanogpt_val_loss_median'])}, "
            f"wall {fmt(agg['nanogpt_wall_s_median'], '.1f')} s; anytrain {fmt(agg['anytrain_steady_tokens_per_s_median'], ',.0f')} tok/s, "
            f"val {fmt(agg['anytrain_val_loss_median'])}, wall {fmt(agg['anytrain_wall_s_median'], '.1f')} s"
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Details: the module docstring of this file.")
    p.add_argument("--nanogpt", required=True, type=Path, help="a checkout of karpathy/nanoGPT (its data/shakespeare_char gets prepared)")
    p.add_argument("--rounds", type=int, default=1, help="rounds of interleaved runs (default: %(default)s)")
    p.add_argument("--max-iters", type=int, default=2000, help="nanoGPT max_iters and lr_decay_iters, anytrain --max-steps (default: %(default)s)")
    p.add_argument("--compile", action="store_true", help="also run both compiled (nanoGPT --compile=True, anytrain cpu_compile.yaml)")
    p.add_argument("--systems", nargs="+", choices=("nanogpt", "anytrain"), default=["nanogpt", "anytrain"], help="which sides to run (default: both)")
    p.add_argument("--out", type=Path, default=Path("bench_out/lm_vs_nanogpt"), help="output folder (default: %(default)s)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Tiny Shakespeare text for nanoGPT's prepare.py (default: %(default)s)")
    p.add_argument("--python", default=str(DEFAULT_PY) if DEFAULT_PY.exists() else sys.executable, help="interpreter for both sides (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per run (default: 300 + 0.6 x max-iters)")
    p.add_argument("--skip-iters", type=int, default=10, help="nanoGPT warm-up iterations left out of its steady median (default: %(default)s)")
    p.add_argument("--threads", type=int, default=0, help="set OMP_NUM_THREADS to this for both sides; 0 = leave it to torch/accelerate (default)")
    p.add_argument("--dry-run", action="store_true", help="prepare nothing, run nothing: print the commands")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    nanogpt = args.nanogpt.resolve()
    out = args.out.resolve()
    timeout = args.timeout or 300 + 0.6 * args.max_iters
    env = base_env(args.threads)
    modes = ["eager", "compiled"] if args.compile else ["eager"]
    variants = [(s, m) for m in modes for s in ("nanogpt", "anytrain") if s in args.systems]
    if not (nanogpt / "train.py").exists():
        sys.exit(f"{nanogpt / 'train.py'} not found: --nanogpt must be a nanoGPT checkout")
    if "=" in str(out):
        sys.exit(f"--out {out}: nanoGPT's configurator splits --out_dir=... at '=', so the path must not contain one")

    def plan(r: int) -> list[tuple[str, str]]:
        k = r % len(variants)  # rotate the order per round
        return variants[k:] + variants[:k]

    if args.dry_run:
        for r in range(args.rounds):
            for system, mode in plan(r):
                d = out / "runs" / f"r{r}_{system}_{mode}"
                cmd = (nanogpt_cmd if system == "nanogpt" else anytrain_cmd)(args.python, args.max_iters, mode == "compiled", d)
                print(f"(cd {nanogpt if system == 'nanogpt' else ROOT} && {' '.join(cmd)})")
        return

    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": platform.node(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "python": args.python, "nanogpt": str(nanogpt), "max_iters": args.max_iters, "rounds": args.rounds,
        "modes": modes, "systems": args.systems, "timeout_s": timeout, "skip_iters": args.skip_iters,
        "nanogpt_eval_interval": nanogpt_eval_interval(args.max_iters), "omp_num_threads": env.get("OMP_NUM_THREADS"),
        "torch_probe": probe_torch(args.python, env),
    }
    if "nanogpt" in args.systems:
        meta["nanogpt_data"] = prepare_nanogpt_data(nanogpt, args.data.resolve(), args.python, env)
    print(f"torch {meta['torch_probe'].get('torch')}, {meta['torch_probe'].get('threads')} threads by default; "
          f"{args.rounds} round(s) x {len(variants)} runs of {args.max_iters} iterations, timeout {timeout:.0f} s each", flush=True)

    runs: list[dict] = []
    result = {"meta": meta, "runs": runs}

    def save() -> None:
        result["summary"] = summarize(runs, args.rounds, modes)
        (out / "lm_vs_nanogpt.json").write_text(json.dumps(result, indent=1))

    for r in range(args.rounds):
        for system, mode in plan(r):
            name = f"r{r}_{system}_{mode}"
            run_dir = out / "runs" / name
            shutil.rmtree(run_dir, ignore_errors=True)
            run_dir.mkdir(parents=True)
            cmd = (nanogpt_cmd if system == "nanogpt" else anytrain_cmd)(args.python, args.max_iters, mode == "compiled", run_dir)
            cwd = nanogpt if system == "nanogpt" else ROOT
            rec = {"name": name, "round": r, "system": system, "mode": mode, "cmd": cmd, "cwd": str(cwd), "load1_before": os.getloadavg()[0]}
            # a fresh inductor cache per run: every compiled run pays (and measures) a cold compile
            run_env = dict(env, TORCHINDUCTOR_CACHE_DIR=str(run_dir / "inductor_cache"))
            res = run_process(cmd, cwd, run_env, timeout, out / "logs" / f"{name}.log")
            shutil.rmtree(run_dir / "inductor_cache", ignore_errors=True)
            lines = res.pop("lines")
            rec.update(res, load1_after=os.getloadavg()[0])
            if system == "nanogpt":
                rec.update(parse_nanogpt(lines, nanogpt_eval_interval(args.max_iters), args.skip_iters))
                rec["threads"] = meta["torch_probe"].get("threads")
                (run_dir / "ckpt.pt").unlink(missing_ok=True)  # ~10 MB each; the figures are read
            else:
                rec.update(parse_anytrain(run_dir, lines))
            runs.append(rec)
            save()
            print(f"  {name:24s} wall {rec['wall_s']:7.1f} s  steady {fmt(rec.get('steady_tokens_per_s'), ',.0f')} tok/s  "
                  f"val {fmt(rec.get('val_loss'))}  other load {fmt(rec.get('other_load'), '.2f')}  "
                  f"{(rec.get('error') or rec.get('parse_error') or 'ok').splitlines()[0]}", flush=True)
            for text in rec.get("error_tail", []):
                print(f"      | {text}", flush=True)

    threads = {x["system"]: x.get("threads") for x in runs if x.get("threads") is not None}
    if len(set(threads.values())) > 1:
        print(f"WARNING: the two sides ran with different thread counts {threads}; rerun with --threads N", flush=True)
        result["meta"]["thread_mismatch"] = threads
    save()
    md = table(runs, result["summary"])
    (out / "lm_vs_nanogpt.md").write_text(md)
    print()
    print(md)
    print(f"JSON: {out / 'lm_vs_nanogpt.json'}")


if __name__ == "__main__":
    main()
