"""Command-line entry: `accelerate launch src/train.py [options]` (or the `anytrain` script)."""

from __future__ import annotations

import sys

from .config import ConfigError, exit_on_config_error, is_main_rank, parse_config
from .scenario import LaunchError


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = parse_config(argv)
        from .trainer import NonFiniteLoss, Preempted, train  # imported late so `--help` and bad flags answer fast

        try:
            train(cfg)
        except Preempted as stop:  # SIGTERM -> 143, SIGINT -> 130, after saving a checkpoint
            _say(f"train.py: {stop}")
            sys.exit(stop.exit_code)
        except NonFiniteLoss as err:
            _say(f"train.py: error: {err}")
            sys.exit(1)
    except ConfigError as err:
        exit_on_config_error(err)
    except LaunchError as err:
        _say(f"train.py: error: {err}")
        sys.exit(1)


def _say(message: str) -> None:
    if is_main_rank():  # one line per job, not one per rank
        print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
