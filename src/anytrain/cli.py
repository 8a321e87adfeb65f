"""Command-line entry: `accelerate launch src/train.py [options]` (or the `anytrain` script)."""

from __future__ import annotations

import sys

from .config import ConfigError, exit_on_config_error, parse_config
from .scenario import LaunchError


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = parse_config(argv)
        from .trainer import train  # imported late so `--help` and bad flags answer fast

        train(cfg)
    except ConfigError as err:
        exit_on_config_error(err)
    except LaunchError as err:
        print(f"train.py: error: {err}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
