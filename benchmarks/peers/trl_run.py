"""What the TRL peer jobs (trl_sft_job.py, trl_dpo_job.py, ...) share: their command line, the clocks on TRL's
training loop (the loop, each step, a method's time), the LoRA configuration, and the end of a job (the peak, the
saved model, the result file)."""

import argparse
import functools
import json
import time
from pathlib import Path

from transformers import TrainerCallback

from anytrain.outputs import process_peak_rss


class Clock(TrainerCallback):
    """When training begins and when each optimizer step ends (perf_counter)."""

    begun = ended = None
    steps = 0

    def on_train_begin(self, args, state, control, **kwargs):
        Clock.begun = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        Clock.ended, Clock.steps = time.perf_counter(), Clock.steps + 1


class StepEnds(TrainerCallback):
    """When training begins and when each optimizer step ends (perf_counter): each step's own seconds."""

    def __init__(self):
        self.marks: list[float] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.marks = [time.perf_counter()]

    def on_step_end(self, args, state, control, **kwargs):
        self.marks.append(time.perf_counter())


def timed(seconds: dict, name: str, fn):
    """fn, its time added to seconds[name] at each call."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[name] += time.perf_counter() - start

    return wrapper


def parser(kinds: tuple[str, ...]) -> argparse.ArgumentParser:
    """--data, --model, --json, --out (folders and files), --kind (one of `kinds`) and --seed."""
    p = argparse.ArgumentParser()
    for flag in ("--data", "--model", "--json", "--out"):
        p.add_argument(flag, required=True, type=Path)
    p.add_argument("--kind", choices=kinds, required=True)
    p.add_argument("--seed", type=int, default=42)
    return p


def lora_config(r: int, alpha: int):
    """peft's LoraConfig on every linear projection, no dropout: the adapters anytrain's --lora-r trains."""
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear")


def train_and_save(trainer, tokenizer, args: argparse.Namespace, lora: bool) -> None:
    """Train (Clock times the loop), then write the process's own peak memory, the trainable parameters and the
    saved model's folder (LoRA: merged, for the shared scoring) to --json."""
    trainer.train()
    peak = process_peak_rss()
    trainable = sum(q.numel() for q in trainer.model.parameters() if q.requires_grad)
    final = trainer.model.merge_and_unload() if lora else trainer.model
    final.save_pretrained(args.out / "final")
    tokenizer.save_pretrained(args.out / "final")
    result = {"loop_s": Clock.ended - Clock.begun, "steps": Clock.steps, "peak_memory_bytes": peak}
    args.json.write_text(json.dumps({**result, "trainable_parameters": trainable, "model": str(args.out / "final")}))
