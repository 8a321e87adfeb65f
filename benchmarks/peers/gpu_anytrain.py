"""An anytrain job of the GPU comparison (gpu_worker.py runs it): the job's options for src/train.py, run through
anytrain.trainer.train in this process (the loop `accelerate launch src/train.py` runs, under this worker's launch
config), and its figures from the run folder.

What the benchmark changes in anytrain, and only for the run: it evaluates nothing (as TRL's runs here: a compiled
model would recompile for the evaluation's shapes), and its end writes no checkpoint, weights or exported model and
hashes no weights (a 1 B run's would write ~25 GB and take longer than its timed steps; the benchmark reads
metrics.jsonl and summary.json only); and an offer's one change: the fused loss's chunk (CHUNK_ELEMENTS in
tasks/causal_lm/head.py), AdamW without its fused kernel (optim.fused_devices), or Liger's RMSNorm, RoPE and SwiGLU
kernels in transformers' Llama (left in place for the rest of the process: the worker runs it last)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import statistics
from pathlib import Path

LORA = ["--lora-r", "16", "--lora-alpha", "32"]


def options(job: dict) -> list[str]:
    """src/train.py's options for the job."""
    common = ["--model", f"hf:{job['model']}", "--dataset", job["data"], "--max-steps", job["steps"], "--lr", job["lr"]]
    common += ["--weight-decay", "0", "--schedule", "constant", "--warmup-steps", "0", "--max-grad-norm", "1.0"]
    common += ["--log-every-steps", "1", "--eval-every-steps", "0", "--seed", "42", "--final-weights", "last"]
    common += ["--output-dir", job["run_dir"], "--overwrite", "--no-progress", "--no-plot"]
    if job["task"] == "sft":
        own = ["--task", "sft", "--packing", "--max-length", job["length"], "--batch-size", job["rows"]]
    elif job["task"] == "dpo":
        own = ["--task", "dpo", "--dpo-loss", "sigmoid", "--beta", "0.1", "--reference", "cached"]
        own += ["--max-length", job["length"], "--batch-size", job["rows"]]
    else:
        own = ["--task", "grpo", "--reward", f"{job['rewards']}:ones", "--num-generations", job["generations"]]
        own += ["--max-new-tokens", job["new_tokens"], "--temperature", "1", "--top-p", "1", "--kl-beta", "0"]
        own += ["--grpo-loss", "dapo", "--scale-rewards", "group", "--epsilon", "0.2", "--grpo-iterations", "1"]
        own += [
            "--batch-size",
            job["prompts"],
            "--share-prompts" if job["variant"] == "share" else "--no-share-prompts",
        ]
    return [str(o) for o in common + own + (LORA if job["variant"] == "lora" else [])]


def liger() -> None:
    """Liger's kernels in transformers' Llama (the loss stays anytrain's fused one)."""
    from liger_kernel.transformers import apply_liger_kernel_to_llama

    apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                fused_linear_cross_entropy=False)  # fmt: skip


@contextlib.contextmanager
def patched(patch: dict):
    """anytrain with the run's end writing nothing but its summary and metrics, and the offer's change, meanwhile."""
    import anytrain.optim as optim
    import anytrain.trainer as trainer
    from anytrain.tasks.causal_lm import head

    saved = [(trainer.Loop, "checkpoint"), (trainer.Loop, "validate"), (trainer.Loop, "test")]
    saved += [(trainer, "save_weights"), (trainer, "exporter")]
    saved += [(trainer, "weights_fingerprint"), (head, "CHUNK_ELEMENTS"), (optim, "fused_devices")]
    before = [(owner, name, getattr(owner, name)) for owner, name in saved]
    trainer.Loop.checkpoint = lambda self: Path(self.cfg.run.output_dir)  # type: ignore[method-assign]
    trainer.Loop.validate = lambda self: False  # type: ignore[method-assign]  # no early stop
    trainer.Loop.test = lambda self, epochs_completed: {}  # type: ignore[method-assign]
    trainer.save_weights, trainer.exporter = lambda *a, **k: None, lambda task: None
    trainer.weights_fingerprint = lambda state: "not hashed (benchmark)"
    head.CHUNK_ELEMENTS = patch.get("chunk_elements", head.CHUNK_ELEMENTS)
    if patch.get("fused_adamw") is False:
        optim.fused_devices = lambda: ()
    try:
        yield
    finally:
        for owner, name, value in before:
            setattr(owner, name, value)


def run(job: dict) -> dict:
    """Train, then the figures: per timed step (after the warm-up) the tokens a second, their median, the first and
    last loss, and what the summary says of the run."""
    from anytrain.config import parse_config
    from anytrain.trainer import train

    if job["patch"].get("liger"):
        if importlib.util.find_spec("liger_kernel") is None:
            return {"status": "skipped", "note": "liger-kernel is not installed (pip install liger-kernel)"}
        liger()
    with patched(job["patch"]):
        summary = train(parse_config(options(job)))
    folder = Path(job["run_dir"])
    lines = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = sorted((r for r in lines if r.get("kind") == "train"), key=lambda r: r["step"])
    timed = [r for r in steps if r["step"] > job["warmup"]]
    rates = [step_tokens_per_s(r, job) for r in timed]
    scenario = summary["scenario"]
    return {"tokens_per_s": statistics.median(rates), "step_tokens_per_s": rates, "steps": summary["optimizer_steps"],
            "loss_first": steps[0]["loss"], "loss_last": steps[-1]["loss"], "first_step_s": summary["first_step_s"],
            "compile": scenario.get("compile"), "precision": scenario.get("mixed_precision"),
            "anytrain_mfu": summary.get("mfu")}  # fmt: skip


def step_tokens_per_s(line: dict, job: dict) -> float:
    """A step's tokens a second; GRPO's logs completions and completion tokens: its prompts' tokens added."""
    if job["task"] != "grpo":
        return line["tokens_per_s"]
    return line["tokens_per_s"] + line["samples_per_s"] * job["prompt_tokens"]
