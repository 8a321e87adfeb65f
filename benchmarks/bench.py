"""anytrain performance benchmark, every figure of docs/benchmarks.md: `make bench`, or for a quick look
`python benchmarks/bench.py --rounds 1 --out /tmp/b`. Runs the variants (subprocesses) in interleaved rounds;
bench_summary.py turns them into figures and goals, bench_render.py into tables, a plot and docs."""

import json
import os
import shutil
import time
from pathlib import Path

import bench_render
import bench_summary
import dpo_vs_trl
import grpo_vs_trl
import peers_bench
import sft_vs_trl
import toolkit
from toolkit import BENCH, PY, TRAIN, WORKLOADS, Runner, launch_cmd, physical_cores, read_run, run_env

SECTIONS = ["overhead", "cpu", "data", "scaling", "default", "threads", "peers", "gpu"]
# The trainer flushes denormals to zero on CPU (docs/benchmarks.md, finding 1): the plain loop does
# the same, so both sides do the same arithmetic.
PLAIN_FLUSH_DENORMAL = True
FTZ = ["--flush-denormal"] if PLAIN_FLUSH_DENORMAL else []


def trainer_figures(run_dir: Path) -> dict:
    train, evals, s = read_run(run_dir)
    windows = [(a["step"] if a else 0, b["step"], b["samples_per_s"]) for a, b in zip([None, *train], train)]
    figures = {"steady_samples_per_s": bench_summary.steady(windows, [r["step"] for r in evals])}
    figures["run_samples_per_s"] = s["samples_per_s"]  # whole run: warm-up and checkpoints in, evaluation out
    figures.update({k: s[k] for k in ("train_seconds", "wall_time_s", "test_accuracy")}, steps=s["optimizer_steps"])
    return {**figures, "threads": s["scenario"]["cpu_threads_per_process"], "processes": s["scenario"]["num_processes"]}


def plain_figures(path: Path, start_unix: float | None = None) -> dict:
    d = json.loads(path.read_text())
    spe, steps = d["steps_per_epoch"], [0] + [w[0] for w in d["windows"]]
    windows = [(a, b, samples / seconds) for a, (b, samples, seconds) in zip(steps, d["windows"])]
    figures = {"steady_samples_per_s": bench_summary.steady(windows, list(range(spe, d["steps"] + spe, spe)))}
    figures["run_samples_per_s"] = sum(w[1] for w in d["windows"]) / d["train_seconds"] if d["windows"] else None
    first = d["first_step_unix"] - start_unix if start_unix else None
    figures.update(train_seconds=d["train_seconds"], start_to_first_step_s=first)
    return {**figures, "threads": d["threads"], "steps": d["steps"]}


def trainer_variant(runner: Runner, name: str, config: str, args: list[str], as_readme: bool = False) -> dict:
    """The trainer launched with `config`; as_readme: the README's command as is (progress bar on)."""
    d = runner.fresh(name)
    quiet = [] if as_readme else ["--no-progress"]
    rec = runner.run(name, launch_cmd(config, TRAIN, *quiet, "--output-dir", str(d), *args))
    if "error" not in rec:
        rec.update(trainer_figures(d))
    shutil.rmtree(d / "checkpoints", ignore_errors=True)  # tens of MB per large run; the figures are read
    return rec


def plain_variant(runner: Runner, name: str, args: list[str], threads: int, extra_env: dict | None = None) -> dict:
    d = runner.fresh(name)
    cmd = [PY, str(BENCH / "plain_loop.py"), "--json", str(d / "plain.json"), *FTZ, *args]
    rec = runner.run(name, cmd, env=run_env(threads, **(extra_env or {})))
    if "error" not in rec:
        rec.update(plain_figures(d / "plain.json", rec["start_unix"]))
    return rec


def plain_pair_variant(runner: Runner, name: str, args: list[str]) -> dict:
    """Two independent plain loops at once, 1 thread each: 2 ranks' compute with no communication."""
    jsons = [str(runner.fresh(f"{name}-{i}") / "plain.json") for i in range(2)]
    script = (
        "import subprocess, sys\n"
        f"procs = [subprocess.Popen([{PY!r}, {str(BENCH / 'plain_loop.py')!r}, '--json', d, *sys.argv[1:]])"
        f" for d in {jsons!r}]\n"
        "sys.exit(max(p.wait() for p in procs))\n"
    )
    rec = runner.run(name, [PY, "-c", script, *FTZ, *args], env=run_env(1))
    if "error" not in rec:
        parts = [plain_figures(Path(j)) for j in jsons]
        rec.update(steady_samples_per_s=sum(p["steady_samples_per_s"] for p in parts), threads=1, processes=2)
        rec.update(run_samples_per_s=sum(p["run_samples_per_s"] for p in parts))
    return rec


def launch_variants() -> list:
    def first_step(r: Runner) -> dict:
        d = r.fresh("launch-first-step")
        args = ["--no-progress", "--output-dir", str(d), "--max-steps", "2", "--log-every-steps", "1"]
        return r.run("launch/trainer-first-step", launch_cmd("cpu.yaml", TRAIN, *args), first_step=d / "metrics.jsonl")

    empty = launch_cmd("cpu.yaml", BENCH / "empty_script.py")
    return [("launch/empty", lambda r: r.run("launch/empty-script", empty)), ("launch/trainer", first_step)]


def build_plan(sections: set[str]) -> list[tuple[str, object]]:
    """(variant name, callable(runner) -> record) for one round."""
    plan, cores = [], physical_cores()
    for w, (_, opts, batch, steps) in WORKLOADS.items():
        if "overhead" in sections or (w != "default" and "scaling" in sections):
            a = [*opts, "--batch-size", str(batch), "--max-steps", str(steps)]
            plan.append((f"plain/{w}", lambda r, a=a, w=w: plain_variant(r, f"plain-{w}", a, cores)))
            plan.append((f"trainer/{w}", lambda r, a=a, w=w: trainer_variant(r, f"trainer-{w}", "cpu.yaml", a)))
    if "scaling" in sections:
        _, opts, batch, steps = WORKLOADS["large"]
        half = [*opts, "--batch-size", str(batch // 2), "--max-steps", str(steps)]
        plan.append(("trainer/large-2x1", lambda r: trainer_variant(r, "trainer-large-2x1", "multi_cpu.yaml", half)))
        plan.append(("plain/large-2x1", lambda r: plain_pair_variant(r, "plain-large-2x1", half)))
    if "overhead" in sections:
        plan += launch_variants()
    if "default" in sections:  # the README's command
        plan.append(("default-job", lambda r: trainer_variant(r, "default-job", "cpu.yaml", [], as_readme=True)))
    if "threads" in sections:
        plan += thread_variants(cores)
    return plan


def thread_variants(cores: int) -> list:
    """The plain loop under each OpenMP setting a launch can give it, on both workloads."""
    plan = []
    for w, (_, opts, batch, _) in WORKLOADS.items():
        a = [*opts, "--batch-size", str(batch), "--max-steps", "40" if w == "large" else "100"]
        for label, threads, env, _ in bench_summary.THREAD_VARIANTS:
            n, t = f"threads-{w}-{label}", threads or cores
            plan.append((f"threads/{w}/{label}", lambda r, a=a, t=t, e=env, n=n: plain_variant(r, n, a, t, e)))
    return plan


def json_of(runner: Runner, name: str, script: str, rounds: int, env: dict | None = None) -> dict | None:
    """Run benchmarks/<script> --json <out>/<name>.json [--rounds]: its figures, None when it failed."""
    path = runner.out / f"{name.replace('-', '_')}.json"
    cmd = [PY, str(BENCH / script), "--json", str(path), *(["--rounds", str(rounds)] if rounds else [])]
    rec = runner.run(name, cmd, env=env)
    return json.loads(path.read_text()) if "error" not in rec else None


def side_sections(runner: Runner, sections: set[str], rounds: int) -> dict:
    """The sections that run their own scripts, after the interleaved variants."""
    side = {"data_wait": None, "cpu": None, "peers": None, "sft": None, "dpo": None, "grpo": None}
    side["gpu"] = {"skipped": "not asked for (--sections)"}
    if "data" in sections:
        print("data path (in-process, interleaved rounds)", flush=True)
        env = run_env(physical_cores())
        side["data_wait"] = json_of(runner, "data-wait", "data_wait.py", max(2, rounds - 1), env)
    if "cpu" in sections:
        print("CPU time per step (1 thread, fresh processes)", flush=True)
        side["cpu"] = json_of(runner, "cpu-per-step", "cpu_per_step.py", max(2, rounds - 1))
    if "peers" in sections:
        print("peers: one job through anytrain, a plain loop, Lightning, the HF Trainer (interleaved)", flush=True)
        side["peers"] = peers_bench.main(["--out", str(runner.out / "peers"), "--rounds", str(rounds + 1)])
        print("peers: chat fine-tuning through anytrain --task sft and TRL's SFTTrainer (interleaved)", flush=True)
        side["sft"] = sft_vs_trl.main(["--out", str(runner.out / "sft"), "--rounds", str(rounds + 1)])
        print("peers: preference tuning through anytrain --task dpo/reward and TRL's DPO/RewardTrainer", flush=True)
        side["dpo"] = dpo_vs_trl.main(["--out", str(runner.out / "dpo"), "--rounds", str(rounds)])
        print("peers: online RL through anytrain --task grpo and TRL's GRPOTrainer (interleaved)", flush=True)
        side["grpo"] = grpo_vs_trl.main(["--out", str(runner.out / "grpo"), "--rounds", str(rounds)])
    if "gpu" in sections:
        import torch

        side["gpu"] = {"skipped": "no CUDA device on this machine"}
        if torch.cuda.is_available():
            print("GPU", flush=True)
            failed = {"skipped": "gpu_bench.py failed (see bench.log)"}
            side["gpu"] = json_of(runner, "gpu", "gpu_bench.py", 0) or failed
    return side


def main(argv=None) -> None:
    p = toolkit.parser(__doc__, out="bench_out", rounds=2)
    p.add_argument("--docs", help="also regenerate <docs>/benchmarks.md (the generated block) and benchmarks.png")
    p.add_argument("--sections", nargs="+", default=SECTIONS, choices=SECTIONS)
    args = p.parse_args(argv)
    started, out, sections = time.perf_counter(), toolkit.out_dir(args.out), set(args.sections)
    runner, m = Runner(out), toolkit.machine()
    what = f"{m['cpu']}, {m['physical_cores']} cores, torch {m['torch']}, accelerate {m['accelerate']}"
    print(f"anytrain bench: {what}, {args.rounds} round(s)", flush=True)
    records = runner.rounds(build_plan(sections), args.rounds, step=3)
    side = side_sections(runner, sections, args.rounds)
    dw = side["data_wait"]
    s = bench_summary.summarise(records, dw, side["gpu"], side["cpu"], side["peers"])
    loads = [r["load1_before"] for r in runner.records] or [os.getloadavg()[0]]
    elapsed = time.perf_counter() - started
    result = {"machine": m, "summary": s, "records": records, "data_wait": dw, "cpu_per_step": side["cpu"]}
    result["sft_vs_trl"] = side["sft"]  # its table: bench_out/sft/ and docs/benchmarks.md, "Chat fine-tuning"
    result["dpo_vs_trl"] = side["dpo"]  # its table: bench_out/dpo/ and docs/benchmarks.md, "Preference tuning"
    result["grpo_vs_trl"] = side["grpo"]  # its table: bench_out/grpo/ and docs/benchmarks.md, "Online RL"
    toolkit.write_json(out / "bench.json", {**result, "elapsed_s": elapsed, "rounds": args.rounds})
    bench_render.plot(s, dw, out / "bench.png")
    table = bench_render.tables(s, dw)
    (out / "bench.md").write_text(table + "\n")
    print(f"\n{table}\n\nfigures: {out / 'bench.json'}, plot: {out / 'bench.png'}; {elapsed / 60:.1f} min")
    if args.docs:
        bench_render.write_docs(Path(args.docs), out / "bench.png", s, dw, m, loads, elapsed)
        print(f"regenerated {Path(args.docs) / 'benchmarks.md'} and {Path(args.docs) / 'benchmarks.png'}")
    print(bench_render.last_line(s))


if __name__ == "__main__":
    main()
