"""Train the digits MLP three ways — on one device, split naively over two stages, and split and
pipelined over micro-batches — and compare. With two GPUs the stages sit on cuda:0 and cuda:1;
with one GPU both share it; without a GPU both run on the CPU (the placement is printed).

    python examples/model_parallel_digits.py                 # 20 epochs, 4 micro-batches
    python examples/model_parallel_digits.py --epochs 5 --micro-batches 8 --split-at 2

The same run from the command line, one mode at a time: python -m anytrain.model_parallel --help
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout without installing

from anytrain import TrainConfig
from anytrain.config import ConfigError
from anytrain.model_parallel import train_model_parallel


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per batch for the pipelined run")
    p.add_argument(
        "--split-at", type=int, default=None, help="first layer of stage 2; default: balanced by parameter count"
    )
    p.add_argument("--hidden-sizes", type=int, nargs="+", default=[256, 256])
    args = p.parse_args()

    # dropout 0: the three runs then make the same updates (pipelined: up to float rounding), so they end equal.
    cfg = TrainConfig(dataset="digits", model="mlp", hidden_sizes=args.hidden_sizes, dropout=0.0, epochs=args.epochs)
    results = []
    try:
        for mode in ("single", "naive", "pipelined"):
            print(f"\n--- {mode} ---")
            _, summary, _ = train_model_parallel(cfg, mode, split_at=args.split_at, micro_batches=args.micro_batches)
            results.append(summary)
    except ConfigError as err:
        sys.exit(f"error: {err}")

    # No timings here: a model this small says nothing about speed (benchmarks/model_parallel_bench.py does).
    print(f"\n{'mode':<10} {'micro-batches':>13} {'test acc':>9} {'test loss':>10}")
    for r in results:
        print(f"{r['mode']:<10} {r['micro_batches']:>13} {r['test_accuracy']:>9.4f} {r['test_loss']:>10.4f}")


if __name__ == "__main__":
    main()
