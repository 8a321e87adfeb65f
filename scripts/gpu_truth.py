#!/usr/bin/env python
"""anytrain's GPU paths and its comparison with TRL, run on one CUDA machine by one command of under 10 minutes:
each step's figures and checks into one JSON and one markdown table, written again after every step (a step that
fails or runs out of time is recorded with its error; the next one still runs).

Steps, in this order (--only picks some):
  env         the GPU, torch, accelerate, transformers
  pytest      the suite's GPU tests (`pytest -m gpu`: fp16 overflow skips, precisions' accuracy, the fused
              LM-head loss and packing under CUDA)
  precisions  the default job launched with single_gpu.yaml, fp16.yaml and bf16.yaml: test accuracy, skipped
              steps, samples/s; the precision that ran is the one asked, bf16/fp16 within 0.02 of fp32
  fsdp        the default job with fsdp.yaml and one process: it starts and trains
  compile     gpu_compile.yaml against bf16.yaml on the default job and the GPT recipe: steady steps/s, first step
  mfu         benchmarks/gpu_bench.py (MLP, fp32/bf16/fp16 samples/s, MFU), one round
  lmhead      benchmarks/lmhead_bench.py: the fused loss against the full logits, tokens/s and peak memory
  llm         --task sft and --task dpo in bf16 on a random Llama-shaped model of about 100 M parameters
              (built from a config here, no download): tokens/s, peak memory, first and last loss
  grpo        --task grpo in bf16 on the same model: completions/s, the share of time generating, peak memory
  gpt         the GPT recipe (examples/shakespeare_gpu.yaml) in bf16 for a fixed step count: validation loss,
              tokens/s, MFU
  peers       anytrain beside TRL (SFT full and LoRA packed, DPO with a cached reference, GRPO with and without
              shared prompts) on random 0.5 B and 1 B Llama-shaped models at sequence 1,024 and 2,048, and what the GPU
              offers anytrain, each on and off: the fused loss's chunk, fused AdamW, Liger, torch.compile, the static
              cache and compiled decode for the rollout's generate (benchmarks/gpu_peers.py, gpu_plan.py): tokens/s,
              MFU, peak memory, loss; peers.json and peers.md beside truth.json (--docs: into docs/benchmarks.md)

Which steps: env, fsdp, lmhead and peers (the whole run, about 9 minutes on an H100; --quick: about 5, fewer and
smaller jobs), every step with --all, or those --only names. The plan and its time estimate are printed first.

    python scripts/gpu_truth.py --quick               # on the GPU machine: runs/gpu_truth/{truth,peers}.{json,md}
    python scripts/gpu_truth.py --all                 # every step, the earlier GPU paths too (beyond 9 minutes)
    python scripts/gpu_truth.py --only llm gpt        # some steps again
    python scripts/gpu_truth.py --export "$OUT"       # the whole run, its 5 result files also copied there
    python scripts/gpu_truth.py --quick --estimate    # anywhere: the plan and its estimate, nothing run
    python scripts/gpu_truth.py --docs-from runs/gpu_truth/peers.json   # its rows into docs/benchmarks.md's block
    python scripts/gpu_truth.py --dry-run             # on a CPU: the steps at toy sizes, the script checked

Needs torch with CUDA, accelerate, transformers, peft and datasets, and for peers trl (liger-kernel optional);
downloads nothing. Exit code 0 when every step ran and every check passed (a dry run: every step ran), 1 otherwise,
2 without CUDA and without --dry-run, or for a plan that does not fit the card.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "benchmarks")]

import gpu_peers  # noqa: E402  (benchmarks/gpu_peers.py: the peers step)
import gpu_plan  # noqa: E402  (benchmarks/gpu_plan.py: its jobs, sizes and estimate)
import toolkit  # noqa: E402  (benchmarks/toolkit.py: launches, logs, GPU peaks)
from peers import dpo_job, sft_job  # noqa: E402

LLAMA_100M = {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 12}
LLAMA_TOY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
SIZES = {  # the earlier steps at full size (about 7 minutes of --all on an H100/H200) and on the CPU dry run
    False: {"epochs": 10, "gpt_steps": 1000, "gpt": [], "llm_steps": 60, "llm_batch": 32, "vocab": 32768,
            "shape": LLAMA_100M, "mfu": ["--rounds", "1"],
            "lmhead": ["--rows", "16", "--length", "512", "--vocab", "32768", "128256", "--rounds", "1"]},
    True: {"epochs": 1, "gpt_steps": 4, "llm_steps": 3, "llm_batch": 4, "vocab": 1024, "shape": LLAMA_TOY,
           "gpt": ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32", "--batch-size", "4",
                   "--eval-windows", "4"],
           "lmhead": ["--rows", "2", "--length", "32", "--vocab", "512", "2048", "--rounds", "1", "--steps", "2"],
           "mfu": ["--rounds", "1"]},
}  # fmt: skip
QUICK = {"epochs": 4, "lmhead": ["--rows", "16", "--length", "512", "--vocab", "128256", "--rounds", "1"]}  # --quick
# (the lmhead step's 128k vocabulary alone is also the whole run's; --all measures 32k too, as before)
MARGIN = 0.02  # largest allowed test-accuracy drop of bf16/fp16 below fp32 (docs/equivalence.md)
DEFAULT_STEPS = ["env", "fsdp", "lmhead", "peers"]  # the whole run and --quick; --all: every step
DOCS = ROOT / "docs" / "benchmarks.md"  # --docs: the peers' rows go between gpu_peers.MARKERS there
PEERS_NEED = ("datasets", "peft", "trl")  # beside torch, accelerate and transformers (liger-kernel: optional)


class Run:
    """The script's state: options, sizes, output folder, deadline, and what each step found."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.dry, self.quick = args, args.dry_run, args.quick
        self.sizes = SIZES[args.dry_run]
        if not args.dry_run and (args.quick or not args.all):  # the fused loss at 128k only; --quick: fewer epochs
            self.sizes = {**self.sizes, "lmhead": QUICK["lmhead"], **(QUICK if args.quick else {})}
        self.out = toolkit.out_dir(args.out)
        self.deadline = time.monotonic() + args.budget
        self.steps: dict[str, dict] = {}

    def seconds_left(self, cap: float) -> float:
        return max(5.0, min(cap, self.deadline - time.monotonic()))

    def process(self, name: str, cmd: list, cap: float, env: dict | None = None) -> tuple[dict, list[str]]:
        """cmd with its output in OUT/<name>.log and a time limit: (record, output lines); raises on failure."""
        with (self.out / f"{name}.log").open("w") as log:
            rec, lines = toolkit.run_process([str(c) for c in cmd], log, env=env, timeout=self.seconds_left(cap))
        if "error" in rec:
            tail = " | ".join(text for _, text in lines[-6:])
            raise RuntimeError(f"{name}: {rec['error']}: {tail[-900:]}")
        return rec, [text for _, text in lines]

    def launch(self, name: str, config: str, options: list, cap: float = 180, launch_options=()) -> dict:
        """`accelerate launch --config_file accelerate_configs/<config> src/train.py <options>` into OUT/<name>:
        its summary.json, with wall_s and the run folder."""
        config_file = ROOT / "accelerate_configs" / config
        head = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config_file]
        run_dir = self.out / name
        fixed = ["--output-dir", run_dir, "--overwrite", "--no-progress", "--no-plot"]
        rec, _ = self.process(name, [*head, *launch_options, toolkit.TRAIN, *options, *fixed], cap)
        summary = json.loads((run_dir / "summary.json").read_text())
        return {**summary, "wall_s": rec["wall_s"], "run_dir": str(run_dir)}

    def check(self, step: dict, name: str, ok: bool, detail: str = "", real_run: bool = True) -> None:
        """A check of the step; on a dry run those that need a GPU and full sizes are recorded, not counted."""
        state = "pass" if ok else ("not a real run (dry run)" if self.dry and real_run else "FAIL")
        step.setdefault("checks", []).append({"check": name, "result": state, "detail": detail})

    def write(self) -> None:
        meta = {
            "dry_run": self.dry,
            "quick": self.quick,
            "date": time.strftime("%Y-%m-%d"),
            "budget_s": self.args.budget,
        }
        toolkit.write_json(self.out / "truth.json", {**meta, "steps": self.steps}, indent=1)
        (self.out / "truth.md").write_text(markdown(self.steps, self.dry))
        if self.args.export:
            export(self.out, Path(self.args.export))


def export(out: Path, to: Path) -> None:
    """The results copied to `to` (a GPU lease's folder that brings back a few files): truth and peers, JSON and
    Markdown, and in logs.tar.gz every log, each peers job's result and its anytrain run's metrics and summary."""
    to.mkdir(parents=True, exist_ok=True)
    for name in ("truth.json", "truth.md", "peers.json", "peers.md"):
        if (out / name).exists():
            shutil.copy(out / name, to / name)
    small = [*out.glob("*.log"), *out.glob("peers/*.json"), *out.glob("peers/results/*.json")]
    small += [*out.glob("peers/runs/*/metrics.jsonl"), *out.glob("peers/runs/*/summary.json")]
    with tarfile.open(to / "logs.tar.gz", "w:gz") as tar:
        for path in sorted(small):
            tar.add(path, arcname=str(path.relative_to(out)))


def on_gpu(summary: dict) -> bool:
    return summary["scenario"]["device"].startswith("cuda")


def step_env(run: Run, step: dict) -> None:
    import accelerate
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    gpu = torch.cuda.get_device_name(0) if cuda else "none"
    memory = torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda else 0.0
    step["rows"] = [{"gpu": gpu, "memory_gib": round(memory, 1), "torch": torch.__version__,
                     "cuda": torch.version.cuda, "accelerate": accelerate.__version__,
                     "transformers": transformers.__version__, "python": sys.version.split()[0],
                     **{name: installed(name) for name in PEERS_NEED + ("liger-kernel",)}}]  # fmt: skip
    run.check(step, "a CUDA device", cuda, gpu)
    missing = [name for name in PEERS_NEED if installed(name) == "missing"]
    run.check(step, f"the peers step's packages ({', '.join(PEERS_NEED)})", not missing, ", ".join(missing), False)


def installed(name: str) -> str:
    """The package's version, or "missing"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "missing"


def step_pytest(run: Run, step: dict) -> None:
    env = toolkit.run_env()
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rs", "tests"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=run.seconds_left(240))
    (run.out / "pytest.log").write_text(done.stdout + done.stderr)
    last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    step["rows"] = [{"result": last, "exit_code": done.returncode}]
    passed = done.returncode == 0 and "skipped" not in last
    run.check(step, "pytest -m gpu: all passed, none skipped", passed, last)


def step_precisions(run: Run, step: dict) -> None:
    options = ["--epochs", str(run.sizes["epochs"]), "--log-every-steps", "1"]
    rows, accuracy = [], {}
    for name, config, asked in (("fp32", "single_gpu.yaml", "fp32"), ("fp16", "fp16.yaml", "fp16"),
                                ("bf16", "bf16.yaml", "bf16")):  # fmt: skip
        s = run.launch(f"precision_{name}", config, options)
        scenario, accuracy[name] = s["scenario"], s["test_accuracy"]
        rows.append({"config": config, "device": scenario["device_name"], "precision": scenario["mixed_precision"],
                     "test_accuracy": s["test_accuracy"], "steps": s["optimizer_steps"],
                     "skipped": s["skipped_optimizer_steps"], "samples_per_s": s["samples_per_s"],
                     "wall_s": s["wall_s"]})  # fmt: skip
        run.check(step, f"{name}: on the GPU", on_gpu(s), scenario["device_name"])
        said = f"{scenario['mixed_precision']}, warnings {scenario['warnings']}"
        run.check(step, f"{name}: the precision asked, no warning", said == f"{asked}, warnings []", said)
    for name in ("fp16", "bf16"):
        gap = accuracy[name] - accuracy["fp32"]
        run.check(step, f"{name} within {MARGIN} of fp32's accuracy", gap >= -MARGIN, f"{gap:+.4f}", False)
    step["rows"] = rows


def step_fsdp(run: Run, step: dict) -> None:
    options = ["--epochs", str(run.sizes["epochs"])]
    s = run.launch("fsdp", "fsdp.yaml", options, launch_options=["--num_processes", "1"])
    scenario = s["scenario"]
    step["rows"] = [{"distributed_type": scenario["distributed_type"], "device": scenario["device_name"],
                     "precision": scenario["mixed_precision"], "test_accuracy": s["test_accuracy"],
                     "samples_per_s": s["samples_per_s"], "wall_s": s["wall_s"]}]  # fmt: skip
    run.check(step, "FSDP on the GPU", on_gpu(s) and scenario["distributed_type"] == "FSDP", str(scenario))
    run.check(step, "it trains (test accuracy >= 0.9)", s["test_accuracy"] >= 0.9, f"{s['test_accuracy']:.4f}")
    epochs = run.sizes["epochs"]  # the last GPU run stopped at its first checkpoint
    run.check(step, f"every epoch ran ({epochs})", s["epochs_completed"] == epochs, str(s["epochs_completed"]))


def step_compile(run: Run, step: dict) -> None:
    """gpu_compile.yaml (bf16, inductor) against bf16.yaml on the default job and on the GPT recipe: the steady rate
    (the median logged window after the first; the first step, where compilation happens, is timed on its own, and
    a recompilation later, for the short last batch of an epoch, falls in one window) and the whole run's rate."""
    rows = []
    default = ["--epochs", str(run.sizes["epochs"]), "--log-every-steps", "10"]
    for job, options, unit in (
        ("default job", default, "samples_per_s"),
        ("GPT recipe", gpt_options(run), "tokens_per_s"),
    ):
        for name, config in (("eager", "bf16.yaml"), ("compiled", "gpu_compile.yaml")):
            dry_config = "cpu.yaml" if run.dry and job == "GPT recipe" else config  # bf16 on this CPU: far slower
            s = run.launch(f"compile_{job.split()[0]}_{name}", dry_config, options, cap=300)
            train, _, _ = toolkit.read_run(Path(s["run_dir"]))
            windows = [r[unit] for r in train[1:] if r.get(unit)]
            rows.append({"job": job, "config": config, "compile": s["scenario"]["compile"],
                         "precision": s["scenario"]["mixed_precision"], "steps": s["optimizer_steps"], "rate": unit,
                         "steady": statistics.median(windows) if windows else None, "whole_run": s[unit],
                         "first_step_s": s["first_step_s"], "warnings": s["scenario"]["warnings"]})  # fmt: skip
        compiled, eager = rows[-1], rows[-2]
        said = f"compile {compiled['compile']}, warnings {compiled['warnings']}"
        ok = bool(compiled["compile"]) and not compiled["warnings"]
        run.check(step, f"{job}: compiled with inductor, no warning", ok, said)
        if compiled["steady"] and eager["steady"]:
            step.setdefault("compiled_over_eager", {})[job] = compiled["steady"] / eager["steady"]
    step["rows"] = rows


def gpt_options(run: Run) -> list:
    steps = run.sizes["gpt_steps"]
    options = ["--config", ROOT / "examples" / "shakespeare_gpu.yaml", "--max-steps", str(steps)]
    return options + [
        "--eval-every-steps",
        str(steps),
        "--log-every-steps",
        str(max(1, steps // 20)),
        *run.sizes["gpt"],
    ]


def step_mfu(run: Run, step: dict) -> None:
    result = run.out / "gpu_bench.json"
    run.process("gpu_bench", [sys.executable, ROOT / "benchmarks" / "gpu_bench.py", "--json", result,
                              *run.sizes["mfu"]], 240)  # fmt: skip
    figures = json.loads(result.read_text())
    step["rows"] = figures.get("rows", [figures])
    run.check(step, "measured on a GPU", "skipped" not in figures, figures.get("skipped", ""))


def step_lmhead(run: Run, step: dict) -> None:
    result = run.out / "lmhead.json"
    cmd = [sys.executable, ROOT / "benchmarks" / "lmhead_bench.py", llama(run), "--json", result, *run.sizes["lmhead"]]
    run.process("lmhead", cmd, 180)
    rows = json.loads(result.read_text())
    step["rows"] = rows
    by = {(r["vocabulary"], r["loss"]): r for r in rows}
    for vocabulary in sorted({r["vocabulary"] for r in rows}):
        full, fused = by[vocabulary, "full logits"], by[vocabulary, "fused"]
        less = fused["peak_memory_gib"] < full["peak_memory_gib"]
        said = f"{fused['peak_memory_gib']:.2f} vs {full['peak_memory_gib']:.2f} GiB"
        run.check(step, f"vocabulary {vocabulary}: the fused loss peaks lower", less, said)


def llama(run: Run) -> Path:
    """The random Llama-shaped model (about 100 M parameters on a GPU run), built once from a config."""
    sizes = run.sizes
    return sft_job.build_model(run.out / "llama", vocabulary=sizes["vocab"], positions=512, shape=sizes["shape"])


def step_llm(run: Run, step: dict) -> None:
    model, rows = llama(run), []
    steps, batch = str(run.sizes["llm_steps"]), str(run.sizes["llm_batch"])
    every = str(max(1, run.sizes["llm_steps"] // 12))
    common = ["--model", f"hf:{model}", "--max-steps", steps, "--batch-size", batch, "--log-every-steps", every]
    jobs = {
        "sft": [*common, "--dataset", sft_job.write_data(run.out / "sft_data"), "--task", "sft", "--lr", "3e-4"],
        "dpo": [*common, "--dataset", dpo_job.write_data(run.out / "dpo_data") / "train", "--task", "dpo",
                "--lr", "1e-5", "--beta", "0.1"],
    }  # fmt: skip
    for name, options in jobs.items():
        s = run.launch(f"llm_{name}", "bf16.yaml", [*options, "--final-weights", "last"], cap=240)
        train, _, _ = toolkit.read_run(Path(s["run_dir"]))
        rows.append({"task": name, "parameters": s["parameters"], "precision": s["scenario"]["mixed_precision"],
                     "tokens_per_s": toolkit.steady_tokens_per_s(train) or s.get("tokens_per_s"),
                     "peak_memory_gib": s["peak_memory_bytes"] / 2**30, "first_loss": train[0]["loss"],
                     "last_loss": train[-1]["loss"], "steps": s["optimizer_steps"], "wall_s": s["wall_s"]})  # fmt: skip
        run.check(step, f"{name}: on the GPU in bf16", on_gpu(s) and s["scenario"]["mixed_precision"] == "bf16")
        first, last = rows[-1]["first_loss"], rows[-1]["last_loss"]
        finite = all(abs(r["loss"]) < 1e9 for r in train)
        said = f"{first:.4f} -> {last:.4f}"
        run.check(step, f"{name}: finite losses, the last below the first", finite and last < first, said)
    step["rows"] = rows


def step_gpt(run: Run, step: dict) -> None:
    steps = run.sizes["gpt_steps"]
    s = run.launch(
        "gpt", "cpu.yaml" if run.dry else "bf16.yaml", gpt_options(run), cap=300
    )  # bf16 on this CPU: far slower
    train, _, _ = toolkit.read_run(Path(s["run_dir"]))
    tokens_per_s = toolkit.steady_tokens_per_s(train) or s["tokens_per_s"]
    peak = (toolkit.gpu_peak(s["scenario"]["device_name"]) or (None, None))[1]
    mfu = tokens_per_s * s["flops_per_token"] / (peak * 1e12) if peak else None
    step["rows"] = [{"steps": s["optimizer_steps"], "val_loss": s["val_loss"], "tokens_per_s": tokens_per_s,
                     "mfu": mfu, "peak_memory_gib": s["peak_memory_bytes"] / 2**30, "wall_s": s["wall_s"],
                     "device": s["scenario"]["device_name"]}]  # fmt: skip
    run.check(step, "on the GPU in bf16", on_gpu(s) and s["scenario"]["mixed_precision"] == "bf16")
    run.check(step, f"validation loss below 2.0 after {steps} steps", s["val_loss"] < 2.0, f"{s['val_loss']:.4f}")


def step_grpo(run: Run, step: dict) -> None:
    """--task grpo in bf16 on the 100 M Llama: the bundled questions, rewarded by exact answers and length (a random
    model answers none right; the length varies, so groups have a signal): completions/s and tokens/s, the share of
    the time spent generating, peak memory."""
    model, steps = llama(run), run.sizes["llm_steps"] // 3
    options = [
        "--model",
        f"hf:{model}",
        "--dataset",
        "questions",
        "--reward",
        "answer",
        "length:8",
        "--max-steps",
        str(steps),
        "--batch-size",
        str(max(2, run.sizes["llm_batch"] // 4)),
        "--num-generations",
        "8",
        "--max-new-tokens",
        "32",
        "--lr",
        "1e-5",
        "--log-every-steps",
        str(max(1, steps // 5)),
        "--val-fraction",
        "0.01",
        "--test-fraction",
        "0.01",
    ]  # fmt: skip: 40 held-out prompts each
    s = run.launch("grpo", "bf16.yaml", options, cap=300)
    train, _, _ = toolkit.read_run(Path(s["run_dir"]))
    generating = statistics.median(r["generating"] for r in train)
    step["rows"] = [{"completions_per_s": s["samples_per_s"], "tokens_per_s": s["tokens_per_s"],
                     "generating": generating, "peak_memory_gib": s["peak_memory_bytes"] / 2**30,
                     "reward_first": train[0]["reward"], "reward_last": train[-1]["reward"],
                     "steps": s["optimizer_steps"], "wall_s": s["wall_s"]}]  # fmt: skip
    run.check(step, "on the GPU in bf16", on_gpu(s) and s["scenario"]["mixed_precision"] == "bf16")


STEPS = {"env": step_env, "pytest": step_pytest, "precisions": step_precisions, "fsdp": step_fsdp,
         "compile": step_compile, "mfu": step_mfu, "lmhead": step_lmhead, "llm": step_llm, "grpo": step_grpo,
         "gpt": step_gpt, "peers": gpu_peers.step}  # fmt: skip


def cell(v) -> str:
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v).replace("|", "/")


def markdown(steps: dict, dry: bool) -> str:
    lines = [f"# GPU truth{' (CPU dry run)' if dry else ''}, {time.strftime('%Y-%m-%d')}", ""]
    for name, step in steps.items():
        lines += [f"## {name}: {step['status']} ({step['seconds']:.0f} s)", ""]
        if "error" in step:
            lines += [f"Error: `{step['error']}`", ""]
        rows = step.get("rows", [])
        if rows:
            keys = list(dict.fromkeys(k for r in rows for k in r))
            lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            lines += ["| " + " | ".join(cell(r.get(k, "")) for k in keys) + " |" for r in rows]
            lines.append("")
        extra = {k: v for k, v in step.items() if k not in ("status", "seconds", "error", "rows", "checks")}
        lines += [f"- {k}: {json.dumps(v)}" for k, v in extra.items()]
        lines += [f"- {c['result']}: {c['check']}" + (f" ({c['detail']})" if c["detail"] else "")
                  for c in step.get("checks", [])]  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def options(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "runs" / "gpu_truth"), help="folder for truth.json, truth.md, logs")
    p.add_argument("--only", nargs="+", choices=list(STEPS), help="run these steps only (in the script's order)")
    p.add_argument("--all", action="store_true", help="every step (the earlier GPU paths too), not just the default")
    p.add_argument("--quick", action="store_true", help="fewer and smaller jobs: about 5 minutes on an H100")
    p.add_argument("--budget", type=float, help="seconds for all steps, a step gets what is left (default 540; 300 "
                   "with --quick)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="on a CPU: every step at toy sizes (checks the script)")
    p.add_argument("--estimate", action="store_true", help="print the plan and its time estimate, run nothing")
    p.add_argument("--docs", action="store_true", help="after the run, peers.md's rows into docs/benchmarks.md")
    p.add_argument("--docs-from", type=Path, help="a peers.json: its rows into docs/benchmarks.md, nothing run")
    p.add_argument(
        "--export", help="also copy the results to this folder after each step (5 files: a GPU lease's $OUT)"
    )
    args = p.parse_args(argv)
    args.budget = args.budget or (300.0 if args.quick else 540.0)
    return args


def chosen(args: argparse.Namespace) -> list[str]:
    """The steps to run, in the script's order: --only's, every one with --all, else DEFAULT_STEPS."""
    wanted = args.only or (list(STEPS) if args.all else DEFAULT_STEPS)
    return [s for s in STEPS if s in wanted]


def estimate(args: argparse.Namespace, steps: list[str]) -> bool:
    """Print the plan of the peers step and every step's estimate; False where a job would not fit the card."""
    try:
        jobs = gpu_plan.plan(args.quick, False) if "peers" in steps else []  # a dry run's: those of a GPU run
    except gpu_plan.PlanError as e:
        print(f"gpu_truth: refused: {e}")
        return False
    total, text = gpu_plan.estimate(jobs, steps, args.quick, args.dry_run)
    print(text, flush=True)
    if total > args.budget and not args.dry_run:
        print(f"gpu_truth: the estimate is above the {args.budget:.0f} s budget: the last jobs may be skipped")
    return True


def run_steps(run: Run, steps: list[str]) -> None:
    for name in steps:
        step: dict = {"status": "ran"}
        start = time.monotonic()
        try:
            STEPS[name](run, step)
        except Exception as e:  # a step's failure is recorded; the next step runs
            step.update(status="failed", error=f"{type(e).__name__}: {e}"[-1500:])
        step["seconds"] = time.monotonic() - start
        if any(c["result"] == "FAIL" for c in step.get("checks", [])) and step["status"] == "ran":
            step["status"] = "check failed"
        run.steps[name] = step
        run.write()
        print(f"gpu_truth: {name}: {step['status']} in {step['seconds']:.0f} s", flush=True)


def main(argv=None) -> int:
    args = options(argv)
    if args.docs_from:
        rep = json.loads(args.docs_from.read_text())
        print("gpu_truth:", gpu_peers.write_docs(gpu_peers.render(rep), DOCS))
        return 0
    steps = chosen(args)
    if not estimate(args, steps):
        return 2
    import torch

    if args.estimate:
        return 0
    if not torch.cuda.is_available() and not args.dry_run:
        print("gpu_truth: no CUDA device here; run it on a GPU machine (or --dry-run to check the script)")
        return 2
    run = Run(args)
    run_steps(run, steps)
    print((run.out / "truth.md").read_text())
    if args.docs and (run.out / "peers.md").exists():
        print("gpu_truth:", gpu_peers.write_docs((run.out / "peers.md").read_text(), DOCS))
    return 0 if all(s["status"] == "ran" for s in run.steps.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
