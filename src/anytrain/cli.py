"""Command-line entry: `accelerate launch src/train.py [options]`, or the `anytrain` script:
`anytrain [train] [options]` trains, `anytrain sample RUN_DIR ...` prints text from a language model."""

from __future__ import annotations

import os
import sys

from .config import ConfigError, exit_on_config_error, is_main_rank, parse_config
from .scenario import LaunchError


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["sample"]:
        from .sample import main as sample_main

        return sample_main(argv[1:])
    if argv[:1] == ["train"]:
        argv = argv[1:]
    try:
        cfg = parse_config(argv)
        from .trainer import NonFiniteLoss, Preempted, train  # imported late so `--help` and bad flags answer fast

        try:
            train(cfg)
        except Preempted as stop:  # SIGTERM -> 143, SIGINT -> 130, after saving a checkpoint
            _say(f"train.py: {stop}")
            _exit(stop.exit_code)
        except NonFiniteLoss as err:
            _say(f"train.py: error: {err}")
            _exit(1)
    except ConfigError as err:
        exit_on_config_error(err)
    except LaunchError as err:
        _say(f"train.py: error: {err}")
        _exit(1)
    _exit(0)


def _say(message: str) -> None:
    if is_main_rank():  # one line per job, not one per rank
        print(message, file=sys.stderr, flush=True)


def _exit(code: int) -> None:
    """End a rank of a multi-process job without interpreter finalization: a gloo worker thread that
    releases its last collective while Python shuts down can abort the rank (SIGABRT) after every
    output was written, failing a finished job (docs/equivalence.md). Single processes exit normally."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        sys.exit(code)
