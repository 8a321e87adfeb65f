"""Command-line entry: `accelerate launch src/train.py [options]`, or the `anytrain` script:
`anytrain [train] [options]` trains, `anytrain sample RUN_DIR ...` prints text from a language model,
`anytrain plot RUN_DIR ...` draws a run's curves to a PNG, `anytrain predict RUN_DIR --dataset FILE`
classifies new rows."""

from __future__ import annotations

import os
import sys
import time
import typing

from . import tasks  # noqa: F401 - the registry: --task's help, and your own task's options as flags
from .config import ConfigError, LaunchError, parse_config


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["sample"]:
        from .sample import main as sample_main

        return sample_main(argv[1:])
    if argv[:1] == ["plot"]:
        from .plot import main as plot_main

        return plot_main(argv[1:])
    if argv[:1] == ["predict"]:
        from .predict import main as predict_main

        return predict_main(argv[1:])
    if argv[:1] == ["train"]:
        argv = argv[1:]
    try:
        cfg = parse_config(argv)
        from .checkpoint import CheckpointWriteError
        from .trainer import NonFiniteLoss, Preempted, train  # imported late so `--help` and bad flags answer fast

        try:
            train(cfg)
        except Preempted as stop:  # SIGTERM -> 143, SIGINT -> 130, after saving a checkpoint
            _say(f"train.py: {stop}")
            _exit(stop.exit_code)
        except (NonFiniteLoss, CheckpointWriteError) as err:
            _say(f"train.py: error: {err}")
            _exit(1)
        except RuntimeError as err:
            if not is_collective_timeout(err):
                raise
            # every surviving rank says it: the stuck one cannot, and which rank noticed is the clue
            rank = os.environ.get("RANK", "0")
            print(
                f"train.py: error: rank {rank} waited more than --collective-timeout {cfg.run.collective_timeout} s "
                "for the other ranks "
                "in a collective operation: a rank is hung, stopped or gone. The last checkpoint is in "
                f"{cfg.run.output_dir}/checkpoints "
                f"(continue with --resume)",
                file=sys.stderr,
                flush=True,
            )
            _exit(1)
    except ConfigError as err:
        exit_on_config_error(err)
    except LaunchError as err:
        _say(f"train.py: error: {err}")
        _exit(1)
    _exit(0)


def is_collective_timeout(err: RuntimeError) -> bool:
    """gloo raises a plain RuntimeError 'Timed out waiting 10000ms for recv operation to complete';
    NCCL's watchdog reports a 'collective operation timeout'. (Failing to connect is not this.)"""
    text = str(err).lower()
    return ("timed out waiting" in text and "operation" in text) or "collective operation timeout" in text


def is_main_rank() -> bool:
    """Before the Accelerator exists: only rank 0 prints errors, so a 2-rank launch says it once."""
    return int(os.environ.get("RANK", "0")) == 0


def exit_on_config_error(err: ConfigError) -> typing.NoReturn:
    # The one line is all the user gets, so the error keeps no traceback: the failed run's frames (its model, a
    # DataLoader iterator and its worker processes) are freed now, not by a later garbage collection of the exit's
    # reference cycle (a caller that keeps the SystemExit, e.g. a test), where each worker's shutdown waits 5 s.
    cause: BaseException | None = err
    while cause is not None:
        cause.__traceback__, cause = None, cause.__cause__ or cause.__context__
    if is_main_rank():
        print(f"train.py: error: {err}", file=sys.stderr)
    else:
        # The other ranks hit the same error. The launcher kills every rank once one exits, so a
        # rank that got there first would cut the main rank off before it says why: let it speak.
        time.sleep(3)
    sys.exit(2)


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


if __name__ == "__main__":  # python -m anytrain.cli
    main()
