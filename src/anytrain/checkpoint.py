"""Checkpoints in the run folder, written atomically, and the checks that keep earlier work safe.

Layout of a run folder:
    checkpoints/step-000120/   accelerator.save_state(): model, optimizer, scheduler, grad scaler,
                               sampler, RNG states of every rank, and `progress` (custom_checkpoint_0.pkl)
    checkpoints/latest         text file naming the newest complete checkpoint
    checkpoints/best           text file naming the checkpoint with the lowest validation loss

A checkpoint is written to `checkpoints/.tmp-step-000120` and renamed when every rank is done,
so a kill during a save leaves the previous checkpoint and the pointers intact.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from .config import ConfigError, TrainConfig, save_config

CHECKPOINTS = "checkpoints"
# Options that may differ between a checkpoint and the run resuming it: they change how long or
# how verbosely the run goes on, not the model, the data or the optimisation so far.
RESUMABLE_CHANGES = {
    "epochs", "max_steps", "output_dir", "progress", "log_every_steps", "eval_every_steps",
    "num_workers", "pin_memory", "persistent_workers", "checkpoint_every_steps", "keep_checkpoints",
    "resume", "overwrite", "early_stopping_patience", "early_stopping_min_delta",
}
# Files accelerator.save_state() writes that a resume cannot do without.
REQUIRED_FILES = ("model.safetensors", "optimizer.bin", "custom_checkpoint_0.pkl", "random_states_0.pkl")


@dataclass
class Progress:
    """Where the loop is, saved in every checkpoint (registered with accelerator.register_for_checkpointing)."""

    epoch: int = 0
    batches_done: int = 0  # batches of `epoch` already consumed (per rank)
    step: int = 0  # optimizer steps taken
    best_val_loss: float = float("inf")
    evals_without_improvement: int = 0
    window: list = field(default_factory=list)  # (step, loss) of batches not yet logged, so the next log line is exact
    config: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)  # the task's facts about the data (features and classes, or vocabulary and tokens)

    def state_dict(self) -> dict:
        return dict(self.__dict__)

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def read_pointer(run_dir: Path, name: str) -> Path | None:
    pointer = run_dir / CHECKPOINTS / name
    if not pointer.is_file():
        return None
    target = run_dir / CHECKPOINTS / pointer.read_text().strip()
    return target if target.is_dir() else None


def write_pointer(run_dir: Path, name: str, target: Path) -> None:
    tmp = run_dir / CHECKPOINTS / f".{name}.tmp"
    tmp.write_text(target.name + "\n")
    os.replace(tmp, run_dir / CHECKPOINTS / name)  # atomic: readers see the old or the new name, never half


def save_checkpoint(accelerator, run_dir: Path, step: int, keep: int, is_best: bool) -> Path:
    """Every rank calls this together (save_state is collective and writes each rank's RNG state)."""
    folder = run_dir / CHECKPOINTS
    final = folder / checkpoint_name(step)
    tmp = folder / f".tmp-{checkpoint_name(step)}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # debris of a save that was killed
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()  # every rank has written its part before the rename
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        write_pointer(run_dir, "latest", final)
        if is_best:
            write_pointer(run_dir, "best", final)
        _prune(run_dir, keep)
    accelerator.wait_for_everyone()
    return final


def _prune(run_dir: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints plus the best one."""
    protected = {read_pointer(run_dir, "best"), read_pointer(run_dir, "latest")}
    saved = sorted(p for p in (run_dir / CHECKPOINTS).glob("step-*") if p.is_dir())
    for old in saved[:-keep] if keep else []:
        if old not in protected:
            shutil.rmtree(old, ignore_errors=True)


def find_resume_checkpoint(cfg: TrainConfig) -> Path:
    """The checkpoint --resume names: 'latest' (in the run folder) or a path; errors if there is none."""
    run_dir = Path(cfg.output_dir)
    if cfg.resume == "latest":
        target = read_pointer(run_dir, "latest")
        if target is None:
            raise ConfigError(f"--resume: no checkpoint in {run_dir / CHECKPOINTS} to resume from")
    else:
        target = Path(cfg.resume)
        if not target.is_dir():
            raise ConfigError(f"--resume: checkpoint folder not found: {cfg.resume}")
    missing = [f for f in REQUIRED_FILES if not (target / f).is_file() or (target / f).stat().st_size == 0]
    if missing:
        raise ConfigError(f"--resume: checkpoint {target} is incomplete or corrupt (missing or empty: {', '.join(missing)})")
    return target


def check_compatible(saved: dict, cfg: TrainConfig, checkpoint: Path) -> None:
    current = cfg.to_dict()
    if current["task"] == "lm" and current["block_size"] > saved.get("block_size", current["block_size"]):
        raise ConfigError(
            f"--block-size {current['block_size']} is beyond the positional table of the model in {checkpoint} "
            f"({saved['block_size']} positions); resume with --block-size {saved['block_size']}"
        )
    differing = sorted(k for k in current if k not in RESUMABLE_CHANGES and saved.get(k) != current[k])
    if differing:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {current[k]!r}" for k in differing)
        raise ConfigError(f"--resume: checkpoint {checkpoint} was made with a different config ({details})")


def check_run_folder(cfg: TrainConfig) -> None:
    """Refuse to start a fresh run over earlier work, before anything is written."""
    run_dir = Path(cfg.output_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--output-dir: {run_dir} exists and is not a folder")
    saved_config = run_dir / "config.yaml"
    if cfg.resume or cfg.overwrite or not saved_config.is_file():
        return
    try:
        saved = yaml.safe_load(saved_config.read_text()) or {}
    except yaml.YAMLError:
        saved = {}
    current = cfg.to_dict()
    differing = sorted(k for k in current if k not in ("resume", "overwrite") and saved.get(k) != current[k])
    if differing:
        raise ConfigError(
            f"--output-dir: {run_dir} holds a run with a different config ({', '.join(differing)}); "
            "pass --resume to continue it, --overwrite to replace it, or choose another --output-dir"
        )
    if read_pointer(run_dir, "latest") is not None and not (run_dir / "summary.json").exists():
        raise ConfigError(f"--output-dir: {run_dir} holds an unfinished run with this config; pass --resume to continue it or --overwrite to start over")


def check_writable(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"  # one per rank: ranks probing the same folder must not race
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"--output-dir: cannot write to {run_dir}: {e.strerror or e}") from None


def load_checkpoint(accelerator, checkpoint: Path, cfg: TrainConfig) -> None:
    """Check the checkpoint was made with a compatible config, then restore every registered object."""
    saved = torch.load(checkpoint / "custom_checkpoint_0.pkl", weights_only=False)  # our Progress, written by us
    check_compatible(saved.get("config", {}), cfg, checkpoint)
    try:
        accelerator.load_state(str(checkpoint))
    except Exception as e:
        first_line = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError(f"--resume: cannot load checkpoint {checkpoint}: {type(e).__name__}: {first_line}") from None


def start_run_folder(run_dir: Path, cfg: TrainConfig, resumed_at_step: int | None) -> None:
    """Main process: a fresh run clears the previous run's outputs (check_run_folder allowed it);
    a resumed one drops what the interrupted run logged after its checkpoint, about to be redone."""
    if resumed_at_step is None:
        shutil.rmtree(run_dir / CHECKPOINTS, ignore_errors=True)
        for stale in ("metrics.jsonl", "summary.json"):
            (run_dir / stale).unlink(missing_ok=True)
    else:
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists():
            kept = [line for line in metrics.read_text().splitlines() if line and json.loads(line)["step"] <= resumed_at_step]
            metrics.write_text("".join(line + "\n" for line in kept))
        (run_dir / "summary.json").unlink(missing_ok=True)
    save_config(cfg, run_dir / "config.yaml")
