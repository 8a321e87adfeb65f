"""Checkpoints in the run folder, written atomically, and the checks that keep earlier work safe.

Layout of a run folder:
    checkpoints/step-000120/   accelerator.save_state(): model.safetensors, optimizer.bin (tensors),
                               random_states_<rank>.pkl (every rank's RNG states), the fp16 grad
                               scaler; and progress.json: the loop's position, the LR schedule's
                               state, the config and the process count, as plain JSON; and
                               best_weights.safetensors when an earlier step validated best (best.py)
    checkpoints/latest         text file naming the newest complete checkpoint
    checkpoints/best           text file naming the checkpoint of the best validation (--best-metric)

A checkpoint is written to `checkpoints/.tmp-step-000120` and renamed when every rank is done,
so a kill during a save leaves the previous checkpoint and the pointers intact.

Loading one executes nothing: progress.json is JSON, the weights are safetensors, and the
optimizer and RNG files are read with `torch.load(weights_only=True)` (accelerate's loader, whose
allow-list holds numpy's array types only); a file that needs anything else is refused.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from safetensors.torch import load_file, save_file

from .best import changing_tensors
from .config import OPTIONS, ConfigError, TrainConfig, saved_options, with_defaults
from .files import write_atomically

CHECKPOINTS = "checkpoints"
PROGRESS = "progress.json"
# Files a resume cannot do without (accelerator.save_state's and ours).
REQUIRED_FILES = ("model.safetensors", "optimizer.bin", PROGRESS, "random_states_0.pkl")


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, a file-size limit, a vanished folder)."""


@dataclass
class Progress:
    """Where the loop is, saved in every checkpoint's progress.json."""

    epoch: int = 0
    batches_done: int = 0  # batches of `epoch` already consumed (per rank)
    step: int = 0  # optimizer steps taken
    best_value: float | None = None  # the best validation's --best-metric (None: none yet)
    best_step: int = -1  # the optimizer step of that validation (-1: none yet)
    best_val: dict = field(default_factory=dict)  # that validation's metrics
    evals_without_improvement: int = 0
    window: list = field(default_factory=list)  # (step, loss) of batches not yet logged, so the next log line is exact
    config: dict = field(default_factory=dict)
    data: dict = field(
        default_factory=dict
    )  # the task's facts about the data (features and classes, or vocabulary and tokens)

    def state_dict(self) -> dict:
        return dict(self.__dict__)

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        lowest_loss = state.pop("best_val_loss", None)  # checkpoints made when the best was always the lowest loss
        if "best_value" not in state and lowest_loss is not None and math.isfinite(lowest_loss):
            state["best_value"] = lowest_loss
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
    write_atomically(
        run_dir / CHECKPOINTS / name, target.name + "\n"
    )  # readers see the old or the new name, never half


def save_checkpoint(
    accelerator,
    run_dir: Path,
    step: int,
    keep: int,
    is_best: bool,
    state: dict,
    tensors: dict | None = None,
    rank_tensors: dict | None = None,
) -> Path:
    """Every rank calls this together (save_state is collective and writes each rank's RNG state).
    `state` is what progress.json holds: plain JSON values; `tensors` more safetensors files, by name (the main
    process writes them); `rank_tensors` this process's own (the task's rank_state), in task_RANK.safetensors."""
    folder = run_dir / CHECKPOINTS
    final = folder / checkpoint_name(step)
    tmp = folder / f".tmp-{checkpoint_name(step)}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # debris of a save that was killed
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(str(tmp))
        if accelerator.is_main_process:
            (tmp / PROGRESS).write_text(json.dumps({**state, "num_processes": accelerator.num_processes}, indent=1))
            for name, named_tensors in (tensors or {}).items():
                save_file(named_tensors, str(tmp / name))
        if rank_tensors:
            save_file({k: v.contiguous().cpu() for k, v in rank_tensors.items()}, str(tmp / rank_file(accelerator)))
    except Exception as e:  # noqa: BLE001 - OSError, safetensors' own error type around one, or another: one line
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(write_failure(e, final.name, folder)) from None
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


STORAGE_ERRORS = ("IoError", "No space left", "File too large", "Disk quota")  # safetensors' text around an OSError


def write_failure(e: Exception, name: str, folder: Path) -> str:
    """The one line for a checkpoint that could not be written: a storage error (disk full, a file-size limit)
    says so; anything else is named as it is, not blamed on the disk (an FSDP2 DTensor that safetensors could not
    read once was)."""
    reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    what = f"could not write checkpoint {name} in {folder}"
    kept = "The previous checkpoint and checkpoints/latest are intact"
    if isinstance(e, OSError) or any(text in str(e) for text in STORAGE_ERRORS):
        return f"{what} ({reason}): disk full or a file-size limit? {kept}; free space, then --resume"
    return f"{what}: {type(e).__name__}: {reason}. {kept}"


def rank_file(accelerator) -> str:
    """The checkpoint file of this process's own task tensors (Task.rank_state)."""
    return f"task_{accelerator.process_index}.safetensors"


def rank_state(accelerator, checkpoint: Path) -> dict:
    """This process's task tensors from a checkpoint; {} where it saved none."""
    path = checkpoint / rank_file(accelerator)
    return load_file(str(path)) if path.is_file() else {}


def save_what_trains(accelerator) -> None:
    """Checkpoints of a model with frozen weights (LoRA's) hold what training changes only: the trainable
    tensors and the buffers. The frozen ones are the pretrained model's, loaded from its folder again."""

    def keep_trained(models, weights, output_dir) -> None:
        for model, state in zip(models, weights):
            if all(p.requires_grad for p in model.parameters()):
                continue
            trained = changing_tensors(model)  # the same tensors a best-validation copy holds
            for name in [name for name in state if name not in trained]:
                del state[name]

    accelerator.register_save_state_pre_hook(keep_trained)


def _prune(run_dir: Path, keep: int) -> None:
    """Keep the newest `keep` checkpoints plus the best one."""
    protected = {read_pointer(run_dir, "best"), read_pointer(run_dir, "latest")}
    saved = sorted(p for p in (run_dir / CHECKPOINTS).glob("step-*") if p.is_dir())
    for old in saved[:-keep] if keep else []:
        if old not in protected:
            shutil.rmtree(old, ignore_errors=True)


def missing_files(checkpoint: Path) -> list[str]:
    return [f for f in REQUIRED_FILES if not (checkpoint / f).is_file() or (checkpoint / f).stat().st_size == 0]


def newest_complete(run_dir: Path) -> Path | None:
    """The newest checkpoint folder whose required files are all there and progress.json reads."""
    for candidate in sorted((p for p in (run_dir / CHECKPOINTS).glob("step-*") if p.is_dir()), reverse=True):
        if not missing_files(candidate):
            try:
                json.loads((candidate / PROGRESS).read_text())
                return candidate
            except (OSError, ValueError):
                continue
    return None


def resolve_auto_resume(cfg: TrainConfig) -> TrainConfig:
    """--resume auto: 'latest' when the run folder holds a checkpoint (a restarted or re-queued job
    continues), nothing otherwise (its first start). Any other value is returned as it is."""
    if cfg.run.resume != "auto":
        return cfg
    run_dir = Path(cfg.run.output_dir)
    has_checkpoint = read_pointer(run_dir, "latest") is not None or newest_complete(run_dir) is not None
    return cfg.replace(resume="latest" if has_checkpoint else "")


def find_resume_checkpoint(cfg: TrainConfig) -> tuple[Path, str | None]:
    """The checkpoint --resume names: 'latest' (in the run folder) or a path; errors if there is none.
    A damaged `latest` pointer falls back to the newest complete checkpoint, with a warning."""
    run_dir = Path(cfg.run.output_dir)
    warning = None
    if cfg.run.resume == "latest":
        target = read_pointer(run_dir, "latest")
        if target is None or missing_files(target):
            fallback = newest_complete(run_dir)
            if fallback is None and target is not None:
                raise ConfigError(
                    f"--resume: checkpoint {target} is incomplete or corrupt (missing or empty: "
                    f"{', '.join(missing_files(target))}), and no other complete one is in {run_dir / CHECKPOINTS}"
                )
            if fallback is None:
                raise ConfigError(f"--resume: no checkpoint in {run_dir / CHECKPOINTS} to resume from")
            pointer = run_dir / CHECKPOINTS / "latest"
            what = (
                "names an incomplete checkpoint"
                if target is not None
                else "is damaged"
                if pointer.exists()
                else "is missing"
            )
            warning = f"{pointer} {what}: resuming from the newest complete checkpoint, {fallback}"
            target = fallback
    else:
        target = Path(cfg.run.resume)
        if not target.is_dir():
            raise ConfigError(f"--resume: checkpoint folder not found: {cfg.run.resume}")
    missing = missing_files(target)
    if missing:
        raise ConfigError(
            f"--resume: checkpoint {target} is incomplete or corrupt (missing or empty: {', '.join(missing)})"
        )
    return target, warning


def check_compatible(saved: dict, cfg: TrainConfig, checkpoint: Path, positions: str | None = None) -> None:
    """Only options marked resumable (how long or how verbosely the run goes on, not the model, the
    data or the optimisation so far) may differ between a checkpoint and the run resuming it. An option
    the checkpoint does not name (made before it existed) had its default. `positions`: the option that
    sizes the model's positions (the task's), which may shrink but not grow."""
    named = saved_options(saved)
    saved, current = with_defaults(named), cfg.flat()
    if "best_metric" not in named:  # made before --best-metric, when the best validation's was the lowest loss
        saved["best_metric"] = "loss"
    if positions and current[positions] > saved.get(positions, current[positions]):
        flag = OPTIONS[positions].flag
        raise ConfigError(
            f"{flag} {current[positions]} is beyond the positional table of the model in {checkpoint} "
            f"({saved[positions]} positions); resume with {flag} {saved[positions]}"
        )
    differing = sorted(k for k in current if not OPTIONS[k].resumable and saved.get(k) != current[k])
    if differing:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {current[k]!r}" for k in differing)
        raise ConfigError(f"--resume: checkpoint {checkpoint} was made with a different config ({details})")


def load_checkpoint(accelerator, checkpoint: Path, cfg: TrainConfig, positions: str | None = None) -> dict:
    """Check the checkpoint fits this run, restore model, optimizer, scaler and RNG states; returns
    progress.json's content (the caller restores the loop's progress and the LR schedule from it)."""
    try:
        state = json.loads((checkpoint / PROGRESS).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--resume: cannot read {checkpoint / PROGRESS}: {e}") from None
    check_compatible(state.get("progress", {}).get("config", {}), cfg, checkpoint, positions)
    saved_processes = state.get("num_processes")
    if saved_processes != accelerator.num_processes:
        raise ConfigError(
            f"--resume: checkpoint {checkpoint} was made by {saved_processes} process(es) and this launch has "
            f"{accelerator.num_processes}: every rank's data position and random state are in it, so resume with "
            f"{saved_processes} process(es) (the same accelerate config), or start a new run in another --output-dir"
        )
    check_safe_to_load(checkpoint, accelerator.process_index)
    try:
        # A LoRA run's checkpoints hold the adapters only (save_what_trains); the frozen weights are the model's
        accelerator.load_state(str(checkpoint), strict=not cfg.model.lora_r)
    except Exception as e:
        first_line = str(e).splitlines()[0] if str(e) else ""
        raise ConfigError(f"--resume: cannot load checkpoint {checkpoint}: {type(e).__name__}: {first_line}") from None
    return state


def check_safe_to_load(checkpoint: Path, rank: int) -> None:
    """accelerate reads the RNG file inside a try that only logs a failure; read it here first, the
    same safe way (weights_only), so a file that would need code to unpickle stops the resume."""
    from accelerate.utils.other import load

    for name in ("optimizer.bin", f"random_states_{rank}.pkl"):
        try:
            load(checkpoint / name, map_location="cpu")
        except Exception as e:  # noqa: BLE001 - UnpicklingError and friends: refuse, one line
            first = (str(e).strip().splitlines() or [""])[0].split(". ")[0]
            raise ConfigError(
                f"--resume: cannot load checkpoint {checkpoint}: {name} does not load as plain tensors without "
                "running code "
                f"(refused: {type(e).__name__}: {first[:120]})"
            ) from None
