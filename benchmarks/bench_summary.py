"""bench.py's runs turned into figures and goals: summarise(records, ...) -> the summary that bench_render.py
renders and bench.json keeps (how: docs/benchmarks.md, "How it measures")."""

import statistics

from toolkit import WORKLOADS, pct, physical_cores

WARMUP_STEPS = 20  # windows ending at or before this step are warm-up
NOISY = 1.3  # a variant whose best run is this many times its worst: its wall-clock ratios say nothing
# The plain loop under the OpenMP settings a process can get: (label, threads, extra environment,
# description). 2 threads is what cpu.yaml gives (accelerate sets OMP_NUM_THREADS to the core count).
THREAD_VARIANTS = [
    ("omp2", 0, {}, "all cores (cpu.yaml), libgomp defaults"),
    ("omp2-spin10k", 0, {"GOMP_SPINCOUNT": "10000"}, "all cores, GOMP_SPINCOUNT=10000"),
    ("omp2-passive", 0, {"OMP_WAIT_POLICY": "PASSIVE"}, "all cores, OMP_WAIT_POLICY=PASSIVE"),
    ("omp1", 1, {}, "1 thread"),
]


def steady(windows: list[tuple[int, int, float]], epoch_ends: list[int]) -> float | None:
    """Median samples/s of (first step, last step, rate) windows after warm-up that contain no epoch end."""
    rates = [rate for a, b, rate in windows if b > WARMUP_STEPS and not any(a < e < b for e in epoch_ends)]
    return statistics.median(rates) if rates else None


def runs_of(records, name, key="steady_samples_per_s"):
    return [r.get(key) for r in records if r["variant"] == name]


def best(records: list[dict], name: str, key: str = "steady_samples_per_s", lowest: bool = False):
    vals = [v for v in runs_of(records, name, key) if v is not None]
    return (min(vals) if lowest else max(vals)) if vals else None


def ratio(a, b):
    return a / b if a is not None and b else None


def spread(records, *names, key="steady_samples_per_s") -> float:
    """The largest best/worst of these variants' runs (1.0 without repeated runs)."""
    per = [[v for v in runs_of(records, n, key) if v] for n in names]
    return max([max(v) / min(v) for v in per if len(v) > 1] or [1.0])


def overhead(records: list[dict], w: str, desc: str) -> dict:
    p, t = best(records, f"plain/{w}"), best(records, f"trainer/{w}")
    pr, tr = best(records, f"plain/{w}", "run_samples_per_s"), best(records, f"trainer/{w}", "run_samples_per_s")
    paired = [ratio(b, a) for a, b in zip(runs_of(records, f"plain/{w}"), runs_of(records, f"trainer/{w}")) if a and b]
    o = {"workload": desc, "plain_steady": p, "trainer_steady": t, "ratio_steady": ratio(t, p)}
    o["ratio_steady_paired_median"] = statistics.median(paired) if paired else None
    o.update(plain_run=pr, trainer_run=tr, ratio_run=ratio(tr, pr))
    return {**o, "spread": spread(records, f"plain/{w}", f"trainer/{w}")}


def launch_and_scaling(records: list[dict]) -> tuple[dict, dict]:
    empty = best(records, "launch/empty", "wall_s", lowest=True)
    first = best(records, "launch/trainer", "first_step_s", lowest=True)
    plain_first = best(records, "plain/default", "start_to_first_step_s", lowest=True)
    launch = {
        "empty_launch_s": empty,
        "trainer_first_step_s": first,
        "extra_s": first - empty if first and empty else None,
    }
    launch["plain_first_step_s"] = plain_first
    t12, t21 = best(records, "trainer/large"), best(records, "trainer/large-2x1")
    p12, p21 = best(records, "plain/large"), best(records, "plain/large-2x1")
    run12, run21 = (best(records, n, "run_samples_per_s") for n in ("trainer/large", "trainer/large-2x1"))
    scaling = {"trainer_1x2": t12, "trainer_2x1": t21, "trainer_ratio": ratio(t21, t12)}
    scaling.update(plain_1x2=p12, plain_2x1_independent=p21, plain_ratio=ratio(p21, p12))
    scaling.update(trainer_2x1_vs_independent=ratio(t21, p21), trainer_ratio_run=ratio(run21, run12))
    return launch, scaling


def summarise(records: list[dict], data_wait: dict | None, gpu: dict | None, cpu=None, peers=None) -> dict:
    s: dict = {"overhead": {w: overhead(records, w, desc) for w, (desc, *_) in WORKLOADS.items()}}
    s.update(goals=[], cpu=cpu, peers=peers)
    s["launch"], s["scaling"] = launch_and_scaling(records)
    jobs = [r for r in records if r["variant"] == "default-job" and "error" not in r]
    if jobs:
        walls = [r["wall_s"] for r in jobs]
        accuracy = statistics.median(r["test_accuracy"] for r in jobs)
        s["default_job"] = {"wall_s_best": min(walls), "wall_s_median": statistics.median(walls)}
        s["default_job"].update(test_accuracy=accuracy, runs=len(jobs))
    threads = {}
    for w in WORKLOADS:
        for label, *_ in THREAD_VARIANTS:
            if (v := best(records, f"threads/{w}/{label}")) is not None:
                threads.setdefault(w, {})[label] = v
    s["threads"] = threads
    if data_wait:  # the default loader's share per dataset
        s["data_wait"] = {r["dataset"]: r["wait_share"] for r in data_wait["rows"] if r["default"]}
    s["gpu"] = gpu
    goals(s, Goals(s["goals"], records), data_wait, jobs)
    return s


class Goals:
    """Appends goal rows to a list. Wall-clock figures are undecided when repeated runs disagree
    (spread) or the machine was overloaded (1-minute load above cores + 1.5); a time limit met even then stands."""

    def __init__(self, rows: list, records: list[dict]):
        self.rows, self.records, self.cores = rows, records, physical_cores()

    def load_of(self, *names: str) -> float:
        loads = [r["load1_before"] for r in self.records if r["variant"] in names]
        return statistics.median(loads) if loads else 0.0

    def add(self, what, value, target, ok, fmt, noise=None, load=0.0, conclusive_if_met=False) -> None:
        text, why = fmt(value) if value is not None else "n/a", []
        if noise is not None and noise > NOISY:
            why.append(f"runs spread {noise:.1f}x")
        if load > self.cores + 1.5:
            why.append(f"load {load:.1f} on {self.cores} cores")
        met = None if value is None else bool(ok(value))
        if why and not (met and conclusive_if_met):
            text += f" ({', '.join(why)}: noise)"
            met = None
        self.rows.append({"what": what, "value": value, "target": target, "met": met, "text": text})


def goals(s: dict, g: Goals, data_wait: dict | None, jobs: list[dict]) -> None:
    """The goal rows, in the table's order."""
    at_least_99, at_most_2 = (">= 99 %", lambda v: v >= 0.99, pct), ("<= 2 %", lambda v: v <= 0.02, pct)
    for w, o in s["overhead"].items():
        what, load = f"trainer / plain loop, {w} workload", g.load_of(f"plain/{w}", f"trainer/{w}")
        if s["cpu"] and w in s["cpu"]:
            g.add(f"{what}, CPU time per step (1 thread)", s["cpu"][w]["ratio"], *at_least_99)
        g.add(f"{what}, wall clock, steady state", o["ratio_steady"], *at_least_99, o["spread"], load)
        g.add(f"{what}, wall clock, whole run", o["ratio_run"], *at_least_99, o["spread"], load)
    what, load = "launch to first step, over an empty `accelerate launch`", g.load_of("launch/empty", "launch/trainer")
    launch = ("<= 2 s", lambda v: v <= 2, lambda v: f"+{v:.2f} s")
    g.add(what, s["launch"]["extra_s"], *launch, load=load, conclusive_if_met=True)
    for r in (data_wait or {}).get("rows", []):
        what = f"waiting for data, default loader, {r['dataset'].split(',')[0]}"
        if r["default"]:
            g.add(f"{what}, wall clock", r["wait_share"], *at_most_2, load=data_wait.get("load1_end", 0.0))
            if r.get("wait_share_cpu") is not None:
                g.add(f"{what}, main-thread CPU time", r["wait_share_cpu"], *at_most_2)
    noise, load = (
        spread(g.records, "trainer/large", "trainer/large-2x1"),
        g.load_of("trainer/large", "trainer/large-2x1"),
    )
    scaling = (">= 0.9", lambda v: v >= 0.9, lambda v: f"{v:.2f}", noise, load)
    g.add("2 ranks x 1 thread / 1 rank x 2 threads (trainer)", s["scaling"]["trainer_ratio"], *scaling)
    if jobs:
        dj = s["default_job"]
        value, what = dj["test_accuracy"] if dj["wall_s_best"] <= 30 else 0.0, f"in {dj['wall_s_best']:.1f} s"
        job = (">= 97 % in <= 30 s", lambda v: v >= 0.97, lambda v: f"{pct(dj['test_accuracy'])} {what}")
        load = g.load_of("default-job")
        g.add("default job (README command): accuracy, wall time", value, *job, load=load, conclusive_if_met=True)
    peer_goals(g, s["peers"])
    bf = (s["gpu"] or {}).get("bf16_over_fp32")
    g.add("GPU: bf16 / fp32 samples/s", bf, ">= 2.5x", lambda v: v >= 2.5, lambda v: f"{v:.2f}x")


def peer_goals(g: Goals, peers: dict | None) -> None:
    """The peers section's goals: anytrain's loop and wall time against each trainer (from the fastest rounds)."""
    if not peers:
        return
    rows = peers["summary"]["rows"]
    a, plain = rows.get("anytrain"), rows.get("plain")
    three = lambda v: f"{v:.3f}"  # noqa: E731
    value = plain["loop_s"] / a["loop_s"] if a and plain else None
    g.add("peers job: plain loop time / anytrain loop time", value, ">= 0.97", lambda v: v >= 0.97, three)
    for name in ("lightning", "hf-trainer"):
        row = rows.get(name)
        for key, what in (("loop_s", "loop"), ("wall_s", "wall")):
            value = row[key] / a[key] if row and a else None
            g.add(f"peers job: {name} {what} time / anytrain {what} time", value, ">= 1.00", lambda v: v >= 1.0, three)
    a, row = rows.get("text-anytrain"), rows.get("text-hf-trainer")  # the text job: a tiny BERT fine-tuned
    value = row["loop_s"] / a["loop_s"] if row and a else None
    g.add("text job: hf-trainer loop time / anytrain loop time", value, ">= 1.00", lambda v: v >= 1.0, three)
    value = a["val_accuracy"] - row["val_accuracy"] if row and a else None  # 125 speeches: 4 points is noise
    g.add("text job: anytrain - hf-trainer val accuracy", value, ">= -0.04", lambda v: v >= -0.04, three)
