"""Entry point users launch: `accelerate launch src/train.py [options]` (`--help` lists them).

The hardware (CPU, GPUs, processes, machines, precision) comes from the accelerate config;
this file and the loop it runs stay the same everywhere.
"""

from anytrain.cli import main

if __name__ == "__main__":
    main()
