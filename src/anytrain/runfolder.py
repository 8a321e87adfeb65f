"""The run folder's policy: a fresh run never replaces earlier work unless told to (--overwrite), a
resumed one drops what the interrupted run logged after its checkpoint, and the folder must be writable
before anything is written. The files themselves: outputs.py (metrics, weights, summary) and
checkpoint.py (checkpoints/)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .checkpoint import CHECKPOINTS, read_pointer
from .config import CONFIG_FILE, ConfigError, TrainConfig, read_saved, save_config, saved_options, with_defaults
from .files import write_atomically


def check_run_folder(cfg: TrainConfig) -> None:
    """Refuse to start a fresh run over earlier work, before anything is written."""
    run_dir = Path(cfg.run.output_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--output-dir: {run_dir} exists and is not a folder")
    saved_config = run_dir / CONFIG_FILE
    if cfg.run.resume or cfg.run.overwrite or not saved_config.is_file():
        return
    try:
        saved = read_saved(saved_config)
    except ConfigError:
        saved = {}  # not a config this run could continue: it differs
    saved = with_defaults(saved_options(saved))  # both settled (tasks/settle.py): the tasks compare as they are
    current = cfg.flat()
    differing = sorted(k for k in current if k not in ("resume", "overwrite") and saved.get(k) != current[k])
    if differing:
        raise ConfigError(
            f"--output-dir: {run_dir} holds a run with a different config ({', '.join(differing)}); "
            "pass --resume to continue it, --overwrite to replace it, or choose another --output-dir"
        )
    if read_pointer(run_dir, "latest") is not None and not (run_dir / "summary.json").exists():
        raise ConfigError(
            f"--output-dir: {run_dir} holds an unfinished run with this config; pass --resume to continue it or "
            "--overwrite to start over"
        )


def check_writable(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"  # one per rank: ranks probing the same folder must not race
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"--output-dir: cannot write to {run_dir}: {e.strerror or e}") from None


def start_run_folder(run_dir: Path, cfg: TrainConfig, resumed_at_step: int | None) -> str | None:
    """Main process: a fresh run clears the previous run's outputs (check_run_folder allowed it);
    a resumed one drops what the interrupted run logged after its checkpoint, about to be redone.
    Returns a note for the user when a torn log line was dropped."""
    note = None
    if resumed_at_step is None:
        shutil.rmtree(run_dir / CHECKPOINTS, ignore_errors=True)
        for stale in ("metrics.jsonl", "summary.json"):
            (run_dir / stale).unlink(missing_ok=True)
    else:
        note = trim_metrics(run_dir / "metrics.jsonl", resumed_at_step)
        (run_dir / "summary.json").unlink(missing_ok=True)
    save_config(cfg, run_dir / CONFIG_FILE)
    return note


def trim_metrics(metrics: Path, step: int) -> str | None:
    """Keep the log lines up to `step`; a torn last line (a kill mid-write) is dropped. Returns a note when one was."""
    if not metrics.exists():
        return None
    kept, torn = [], None
    for number, line in enumerate(metrics.read_text().splitlines(), 1):
        try:
            record = json.loads(line) if line.strip() else None
        except ValueError:
            torn = f"dropped an incomplete line {number} of {metrics} (written when the run was killed)"
            continue
        if record is not None and record.get("step", 0) <= step:
            kept.append(line)
    write_atomically(metrics, "".join(line + "\n" for line in kept))
    return torn
