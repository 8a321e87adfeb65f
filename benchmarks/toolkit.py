"""What every script in benchmarks/ shares (`python benchmarks/<script>.py` puts this folder on sys.path): runs
and their rounds, run folders, the TRL comparisons' runs and rows (*_vs_trl.py), the machine, formats, and at the
bottom the only calls into anytrain's internals."""

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
BENCH, TRAIN, CONFIGS = ROOT / "benchmarks", ROOT / "src" / "train.py", ROOT / "accelerate_configs"
PY = sys.executable
ACCELERATE = str(Path(PY).with_name("accelerate")) if Path(PY).with_name("accelerate").exists() else None
TIMEOUT = 300  # seconds per subprocess: a hung run fails its figure, never the whole benchmark

LARGE = "--dataset synthetic --synthetic-samples 21942 --synthetic-features 784 --hidden-sizes 1024 1024 --dropout 0"
LARGE = LARGE.split()
WORKLOADS = {
    # name: (description, trainer options, batch per process, steps)
    # 120 steps = 6 epochs of the digits' 1,259 training rows; 60 steps = 1 epoch of the 15,360
    # training rows of 21,942 synthetic ones (70/10/20 split), so windows end exactly at epoch ends.
    "default": ("digits (bundled), MLP 64-256-256-10, dropout 0.2, batch 64", [], 64, 120),
    "large": ("synthetic 22k x 784, MLP 784-1024-1024-10, batch 256", LARGE, 256, 60),
}


def gpu_peak(name: str) -> tuple[float, float] | None:
    """(fp32, bf16) dense peak TFLOP/s of the GPU called `name` (the table's home: anytrain/flops.py, which every
    summary.json's MFU uses), None when it is not in the table. Imported here on use: torch loads with it."""
    from anytrain.flops import gpu_peak as peak

    return peak(name)


def parser(doc: str, **defaults) -> argparse.ArgumentParser:
    """A script's options, described by its docstring: --out, --json, --rounds with the defaults given."""
    formatter = argparse.ArgumentDefaultsHelpFormatter
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=formatter)
    helps = {"out": "output folder", "json": "write the figures here", "rounds": "rounds of interleaved runs"}
    for name, default in defaults.items():
        p.add_argument(f"--{name}", type=int if name == "rounds" else str, default=default, help=helps[name])
    return p


def out_dir(path) -> Path:
    """The folder `path`, made absolute and created."""
    path = Path(path).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_env(threads: int | None = None, **extra: str) -> dict:
    """Every run's environment: hubs offline, this checkout's src first on the path, and no thread settings (the launch
    decides, as it does for users) unless `threads` sets OMP_NUM_THREADS."""
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)  # before, not instead
    e = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONPATH=path)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        e.pop(k, None)
    return {**e, **({"OMP_NUM_THREADS": str(threads)} if threads else {}), **extra}


def launch_cmd(config: str, script: Path | str, *args: str) -> list[str]:
    """`accelerate launch --config_file accelerate_configs/<config> <script> <args>`, as users type it."""
    head = [ACCELERATE, "launch"] if ACCELERATE else [PY, "-m", "accelerate.commands.launch"]
    port = ["--main_process_port", "0"] if config == "multi_cpu.yaml" else []
    return [*head, "--config_file", str(CONFIGS / config), *port, str(script), *args]


def busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (Linux /proc/stat), None elsewhere."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # guest time is already in user


QUIET_WAIT_S, QUIET_CORES = 120, 0.3  # before a timed run: wait (at most) until the rest of the machine is this quiet


def settle() -> float:
    """Wait, at most QUIET_WAIT_S, until the machine's other processes keep less than QUIET_CORES cores busy over
    2 s (a shared machine: someone else's job in the middle of a run shifts its loop time): seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < QUIET_WAIT_S:
        before = busy_cpu_s()
        time.sleep(2)
        after = busy_cpu_s()
        if before is None or after is None or (after - before) / 2 < QUIET_CORES:
            break
    return time.perf_counter() - start


def children_cpu_s() -> float:
    return sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])  # user + system seconds


def _stop(proc: subprocess.Popen) -> None:
    """End a run and its children (its own session: accelerate launch starts the trainer as a child)."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


def run_process(cmd, log, env=None, cwd=ROOT, timeout=TIMEOUT, first_step=None) -> tuple[dict, list]:
    """Run cmd with a time limit, its output into the open file `log`: (record, [(second it arrived, line)]).
    The record: wall_s, returncode, error if any, cpu_s (the run's CPU seconds), other_load (cores everything
    else kept busy meanwhile) and, with `first_step` (a metrics.jsonl), first_step_s: when its first train line came."""
    rec, lines, first = {"cmd": cmd, "load1_before": os.getloadavg()[0], "start_unix": time.time()}, [], None
    log.write(f"\n$ (cd {cwd} && {' '.join(map(str, cmd))})\n")
    log.flush()
    busy0, cpu0, start = busy_cpu_s(), children_cpu_s(), time.perf_counter()
    out = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "errors": "replace", "bufsize": 1}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env or run_env(), start_new_session=True, **out)

    def read() -> None:
        for line in proc.stdout:
            lines.append((time.perf_counter() - start, line.rstrip("\n")))
            log.write(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while first_step and first is None and proc.poll() is None and time.perf_counter() - start < timeout:
        if first_step.exists() and '"train"' in first_step.read_text():
            first = time.perf_counter() - start
        time.sleep(0.005)
    try:
        proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - start)))
    except subprocess.TimeoutExpired:
        _stop(proc)
        rec["error"] = f"timed out after {timeout:.0f} s"
    wall, cpu, busy1 = time.perf_counter() - start, children_cpu_s() - cpu0, busy_cpu_s()
    reader.join(10)
    log.flush()
    other = max(0.0, (busy1 - busy0 - cpu) / wall) if busy0 is not None and busy1 is not None else None
    rec.update(wall_s=wall, returncode=proc.returncode, cpu_s=cpu, other_load=other, load1_after=os.getloadavg()[0])
    if proc.returncode and "error" not in rec:
        rec["error"] = f"exit code {proc.returncode} (see {Path(log.name).name})"
        rec["error_tail"] = [text for _, text in lines[-15:]]
    if first is not None:
        rec["first_step_s"] = first
    return rec, lines


def rotated(items: list, r: int, step: int = 1) -> list:
    """items in the order of round r: rotated so that no item always runs first or after the same one."""
    k = (r * step) % max(1, len(items))
    return items[k:] + items[:k]


def interleave(names: list, rounds: int, run) -> dict:
    """run(name, round) for every name once per round, in an order rotating per round: {name: its results}."""
    results = {name: [] for name in names}
    for r in range(rounds):
        for name in rotated(list(names), r):
            results[name].append(run(name, r))
    return results


class Runner:
    """Runs the commands of a benchmark into <out>/bench.log, one record per run, a line printed each."""

    def __init__(self, out: Path):
        self.out, self.runs_dir = out, out / "runs"
        self.log = (out / "bench.log").open("w")
        self.records: list[dict] = []

    def run(self, name: str, cmd: list[str], env=None, first_step: Path | None = None, timeout=TIMEOUT) -> dict:
        rec = {"name": name, **run_process(cmd, self.log, env=env, timeout=timeout, first_step=first_step)[0]}
        self.records.append(rec)
        status = rec.get("error", "ok")
        print(f"  {name:34s} {rec['wall_s']:6.1f} s  load {rec['load1_before']:.1f}  {status}", flush=True)
        return rec

    def fresh(self, name: str) -> Path:
        """An empty run folder <out>/runs/<name>."""
        d = self.runs_dir / name
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        return d

    def rounds(self, variants: list, rounds: int, step: int = 1, label: str = "round") -> list[dict]:
        """Every (name, fn(runner) -> record) of variants once per round, in an order rotating per round."""
        records = []
        for r in range(rounds):
            print(f"{label} {r + 1}/{rounds}", flush=True)
            for name, fn in rotated(variants, r, step):
                records.append(fn(self))
                records[-1].update(variant=name, round=r)
        return records


def trl_missing(job: str) -> bool:
    """Whether trl or peft is missing (said in one line): the TRL comparisons are left out then."""
    import importlib.util

    if importlib.util.find_spec("trl") and importlib.util.find_spec("peft"):
        return False
    print(f'  not installed, left out: {job} against TRL (pip install -e ".[peers]")', flush=True)
    return True


def peer_rounds(runner: Runner, variants: list, rounds: int, name: str, job, summarise, table) -> list:
    """A comparison's interleaved rounds, its rows (summarise), <out>/<name>_vs_trl.json (rows, records, the job's
    one-line description from its module's docstring) and its printed table."""
    records = runner.rounds(variants, rounds, label=f"{name} round")
    rows = summarise(records)
    first = job.__doc__.split("\n\n")[0].strip()
    write_json(runner.out / f"{name}_vs_trl.json", {"rows": rows, "records": records, "job": first})
    print(table(rows), flush=True)
    return rows


def peer_folder(job: str, name: str) -> str:
    """A comparison's run folder for a variant: ("dpo", "anytrain dpo full, live reference") ->
    dpo-anytrain-dpo-full-live-reference; its runs are labelled <job>/<name>."""
    return f"{job}-{name.replace(',', '').replace(' ', '-')}"


def anytrain_peer(runner: Runner, job: str, name: str, data: Path, model: Path, options: list, timeout=TIMEOUT):
    """src/train.py in one CPU process on a comparison's data and hf:<model>, with the job's `options`: (record, run
    folder, train lines, summary.json). The record gains loop_s (the start of training to the end of the last
    optimizer step), steps, peak_memory_bytes and trainable_parameters; lines and summary are empty when it failed."""
    d = runner.fresh(peer_folder(job, name))
    args = ["--model", f"hf:{model}", "--dataset", str(data), "--output-dir", str(d), "--no-progress", "--no-plot"]
    rec = runner.run(f"{job}/{name}", launch_cmd("cpu.yaml", TRAIN, *args, *options), timeout=timeout)
    if "error" in rec:
        return rec, d, [], {}
    train, _, s = read_run(d)
    rec.update(loop_s=s["first_step_s"] + s["train_seconds"], steps=s["optimizer_steps"])
    rec.update(peak_memory_bytes=s["peak_memory_bytes"], trainable_parameters=s["trainable_parameters"])
    return rec, d, train, s


def anytrain_saved(runner: Runner, job: str, name: str, data: Path, model: Path, options: list, timeout=TIMEOUT):
    """anytrain_peer for a comparison that scores the saved model: (record, train lines); a record that ran gains
    tokens_per_s and start_to_first_step_s (summary.json's) and model (the run folder's hf/ export)."""
    rec, d, train, s = anytrain_peer(runner, job, name, data, model, options, timeout=timeout)
    if "error" not in rec:
        rec.update(tokens_per_s=s["tokens_per_s"], start_to_first_step_s=s["start_to_first_step_s"])
        rec.update(model=str(d / "hf"))
    return rec, train


def trl_peer(runner: Runner, job: str, name: str, script: str, data: Path, model: Path, args: list, timeout=TIMEOUT):
    """peers/<script>, TRL's trainer on the same job (`args`: its --kind, --seed and more): its record, with the job's
    result.json (loop_s, steps, peak_memory_bytes, trainable_parameters, ...) when it ran."""
    d = runner.fresh(peer_folder(job, name))
    cmd = [PY, str(BENCH / "peers" / script), "--data", str(data), "--model", str(model), *args]
    out = ["--json", str(d / "result.json"), "--out", str(d / "run")]
    rec = runner.run(f"{job}/{name}", [*cmd, *out], timeout=timeout)
    if "error" not in rec:
        rec.update(json.loads((d / "result.json").read_text()))
    return rec


def peer_variant(job: str, name: str, go, scores=None, quiet: bool = True):
    """A comparison's variant for Runner.rounds: go(runner, seed) -> record, seeded 42 + the rounds the variant has
    run (every variant the same seed in a round), after waiting for a quiet machine (settle: the wait recorded)
    unless not `quiet`; a run that did not fail gains its seed and scores(record), a dict."""

    def run(runner: Runner) -> dict:
        seed = 42 + sum(1 for r in runner.records if r["name"] == f"{job}/{name}")
        waited = settle() if quiet else None
        rec = go(runner, seed)
        if waited is not None:
            rec["waited_for_quiet_s"] = waited
        if "error" not in rec:
            rec.update(seed=seed, **(scores(rec) if scores else {}))
        return rec

    return run


def peer_rows(records: list[dict], names: list[str], row) -> dict:
    """A comparison's rows: {variant: row(name, its runs that did not fail)}, None for a variant whose runs all
    failed."""
    rows = {}
    for name in names:
        ok = [r for r in records if r.get("variant") == name and "error" not in r]
        rows[name] = row(name, ok) if ok else None
    return rows


def peer_figures(ok: list[dict], time: str) -> dict:
    """What every comparison's row holds: the best and the median run's `time` (loop_s, step_s), the median peak
    RSS in MiB, the trainable parameters, steps and runs, and the median load of the machine's other processes."""
    return {
        time: min(r[time] for r in ok),
        f"{time}_median": statistics.median(r[time] for r in ok),
        "peak_mib": statistics.median(r["peak_memory_bytes"] for r in ok) / 2**20,
        "trainable_parameters": ok[0]["trainable_parameters"],
        "steps": ok[0]["steps"],
        "runs": len(ok),
        "other_load_median": statistics.median(r["other_load"] or 0.0 for r in ok),
    }


def reward_figures(ok: list[dict], loss: str) -> dict:
    """A preference comparison's row (dpo_vs_trl.py, kto_vs_trl.py): peer_figures of the loop time, the held-out
    reward accuracy and `loss` (mean, sd over the runs), and anytrain's tokens/s (the best run's, as the loop time's;
    the median) and median start to first step."""
    out = peer_figures(ok, "loop_s")
    out.update(reward_accuracy=spread([r["reward_accuracy"] for r in ok]), loss=spread([r[loss] for r in ok]))
    if "tokens_per_s" in ok[0]:
        out["tokens_per_s"] = max(r["tokens_per_s"] for r in ok)
        out["tokens_per_s_median"] = statistics.median(r["tokens_per_s"] for r in ok)
        out["start_to_first_step_s"] = statistics.median(r["start_to_first_step_s"] for r in ok)
    return out


def reward_cells(row: dict) -> list[str]:
    """A preference comparison's cells of a variant's row, after its name."""
    (acc, acc_sd), (loss, loss_sd) = row["reward_accuracy"], row["loss"]
    rate = f"{row['tokens_per_s']:,.0f}" if "tokens_per_s" in row else ""
    times = [f"{row['loop_s']:.1f} s", f"{row['loop_s_median']:.1f} s", f"{row['peak_mib']:,.0f} MiB"]
    scores = [f"{acc:.3f} ± {acc_sd:.3f}", f"{loss:.4f} ± {loss_sd:.4f}", rate]
    return [*times, *scores, f"{row['trainable_parameters']:,}", f"{row['other_load_median']:.2f}"]


REWARD_HEAD = ["variant", "loop time (best)", "median", "peak RSS (median)", "held-out reward accuracy"]


def reward_pairs(rows: dict, pairs: list[tuple[str, str, str]]) -> list[str]:
    """A preference comparison's line per (what, anytrain's variant, TRL's variant) where both ran: the ratios and
    the held-out scores' differences against their seed-to-seed sd."""
    out = []
    for what, a_name, t_name in pairs:
        a, t = rows.get(a_name), rows.get(t_name)
        if a and t:
            sd = max(a["reward_accuracy"][1], t["reward_accuracy"][1])
            out.append(
                f"\n{what}: TRL / anytrain loop time {t['loop_s'] / a['loop_s']:.3f}, peak RSS "
                f"{t['peak_mib'] / a['peak_mib']:.3f}; held-out reward accuracy anytrain - TRL "
                f"{a['reward_accuracy'][0] - t['reward_accuracy'][0]:+.3f} (seed-to-seed sd {sd:.3f}), loss "
                f"{a['loss'][0] - t['loss'][0]:+.4f} (sd {max(a['loss'][1], t['loss'][1]):.4f})"
            )
    return out


def peer_table(head: list[str], rows: dict, cells) -> list[str]:
    """A comparison's Markdown table: `head`, then a line per variant, its name and cells(row) (strings), or `failed`
    where its runs all failed."""
    out = md_head(*head)
    for name, row in rows.items():
        out.append(f"| {name} | " + (" | ".join(cells(row)) if row else "failed" + " |" * (len(head) - 2)) + " |")
    return out


def spread(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation; 0 for one value)."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def read_run(run_dir: Path) -> tuple[list[dict], list[dict], dict | None]:
    """An anytrain run folder: (its metrics.jsonl train lines by step, its validation lines, summary.json)."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = sorted((r for r in lines if r.get("kind") == "train"), key=lambda r: r["step"])
    evals = [r for r in lines if r.get("kind") == "eval" and r.get("split") == "validation"]
    summary = run_dir / "summary.json"
    return train, evals, json.loads(summary.read_text()) if summary.exists() else None


def steady_tokens_per_s(train: list[dict], skip: int = 1) -> float | None:
    """The median tokens/s of the logged windows after the first `skip` (compilation, warm-up)."""
    rates = [r["tokens_per_s"] for r in train[skip:] if r.get("tokens_per_s")]
    return statistics.median(rates) if rates else None


def lm_run(config: str, run_dir: Path, recipe: str, options: list[str], timeout: float) -> tuple:
    """`accelerate launch` of src/train.py --config examples/<recipe> <options> into run_dir, its log beside it:
    (record, output lines, train lines of metrics.jsonl, summary.json), the last two empty when it failed."""
    fixed = ["--output-dir", str(run_dir), "--overwrite", "--no-progress"]
    cmd = launch_cmd(config, TRAIN, "--config", str(ROOT / "examples" / recipe), *options, *fixed)
    with (run_dir.parent / f"{run_dir.name}.log").open("w") as log:
        rec, lines = run_process(cmd, log, timeout=timeout)
    train, _, summary = read_run(run_dir) if "error" not in rec else ([], [], None)
    return rec, lines, train, summary


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def physical_cores() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        return os.cpu_count() or 1


def machine() -> dict:
    import accelerate
    import torch

    cuda = torch.cuda.is_available()
    gpu = torch.cuda.get_device_name(0) if cuda else None
    m = dict(date=datetime.date.today().isoformat(), cpu=cpu_name(), logical_cpus=os.cpu_count())
    m.update(physical_cores=physical_cores(), cuda=cuda, gpu=gpu, python=platform.python_version())
    return {**m, "torch": torch.__version__, "accelerate": accelerate.__version__, "platform": platform.platform()}


def fmt(v, spec: str = ",.0f", none: str = "n/a") -> str:
    return none if v is None else format(v, spec)


def pct(v) -> str:
    return "n/a" if v is None else f"{100 * v:.1f} %"


def md_head(*columns: str) -> list[str]:
    """A Markdown table's header and separator lines."""
    return ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]


def write_json(path: Path, data, indent: int = 1) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=indent, default=str))


# ----- anytrain's internals: everything the benchmarks need from inside anytrain, beyond launching src/train.py
# and reading its run folder. Callers get plain values (settings(): their own names), never a TrainConfig to read.


def _config(options: list[str]):
    from anytrain.config import parse_config

    return parse_config(options)


def settings(cfg) -> SimpleNamespace:
    """The values of a parsed config the benchmarks use."""
    names = "seed lr weight_decay batch_size max_steps epochs max_grad_norm log_every_steps"
    return SimpleNamespace(**{n: cfg.get(n) for n in names.split()})


def mlp(hidden_sizes: list[int], features: int, classes: int):
    """anytrain's registry MLP (Standardize, (Linear, ReLU) x layers, Linear), no dropout."""
    from anytrain.config import ModelConfig
    from anytrain.shape import DataShape
    from anytrain.usermodel import make_model

    shape = DataShape("tabular", num_classes=classes, num_features=features)
    return make_model(ModelConfig(name="mlp", hidden_sizes=list(hidden_sizes), dropout=0.0), shape)


def plain_job(options: list[str]):
    """For plain_loop.py, seeded and loaded as the trainer does: (settings, inputs, targets, model, lr_factor)."""
    import torch

    from anytrain.optim import lr_factor
    from anytrain.tasks.settle import load
    from anytrain.usermodel import make_model

    cfg = _config(options)
    torch.manual_seed(cfg.run.seed)
    data = load(cfg)[2]
    model = make_model(cfg.model, data.shape)
    return settings(cfg), data.train.inputs, data.train.targets, model, lambda s, total: lr_factor(s, cfg.optim, total)


def trainer_job(options: list[str]):
    """anytrain.trainer.train of the options in this process, as a callable (the options parsed now)."""
    from anytrain.trainer import train

    cfg = _config(options)
    return lambda: train(cfg)


def prepared_job(options: list[str], accelerator=None):
    """For data_wait.py: (accelerator, model and optimizer prepared, settings, loader(workers, pin, persistent))."""
    import torch

    from anytrain.data.splits import make_loader
    from anytrain.optim import build_optimizer
    from anytrain.scenario import make_accelerator
    from anytrain.tasks.settle import load
    from anytrain.usermodel import make_model

    cfg = _config(options)
    accelerator = accelerator or make_accelerator(cfg)
    data = load(cfg)[2]
    torch.manual_seed(cfg.run.seed)
    model = make_model(cfg.model, data.shape)
    model, optimizer = accelerator.prepare(model, build_optimizer(cfg.optim, model))

    def loader(workers: int, pin: bool, persistent: bool):
        c = cfg.replace(num_workers=workers, pin_memory=pin, persistent_workers=persistent)
        return make_loader(data.train, c, shuffle=True)

    return accelerator, model, optimizer, settings(cfg), loader


def two_stages(model, devices, micro_batches: int | None = None):
    """The model split in two stages (anytrain.model_parallel): naive, or pipelined over micro-batches."""
    from anytrain.model_parallel import PipelinedTwoStageModel, TwoStageModel

    if micro_batches is None:
        return TwoStageModel(model, devices=devices)
    return PipelinedTwoStageModel(model, micro_batches=micro_batches, devices=devices)


def stage_devices(use_cpu: bool | None):
    """anytrain.model_parallel's placement: (first device, second device, why)."""
    from anytrain.model_parallel import pick_devices

    return pick_devices(use_cpu=use_cpu)
