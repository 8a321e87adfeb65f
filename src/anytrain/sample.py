"""Print text sampled from a trained language-model run:

    anytrain sample runs/shakespeare --prompt "ROMEO:" --tokens 300 --temperature 0.8 --top-k 40
    python -m anytrain.sample runs/shakespeare

A character or byte vocabulary travels in model.safetensors' metadata with the weights, so the run
folder (or the weights file alone) is all it needs; a BPE run's tokenizer.json is read from beside the
weights.
"""

from __future__ import annotations

import argparse
import sys

import torch

from .config import ConfigError, OneLineParser
from .reload import load_model, read_weights_metadata, weights_file


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="anytrain sample", description="Print text sampled from a trained language-model run.")
    parser.add_argument("run_dir", help="run folder (or its model.safetensors) of a language-model run")
    parser.add_argument(
        "--prompt", default="\n", help="text to continue; cropped to the last block_size tokens (default: a newline)"
    )
    parser.add_argument("--tokens", type=int, default=500, help="tokens to generate (default: %(default)s)")
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        help="softmax temperature, > 0; lower is more conservative (default: %(default)s)",
    )
    parser.add_argument(
        "--top-k", type=int, default=0, help="sample only among the k likeliest tokens; 0 = all (default: %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="random seed: the same seed gives the same text (default: %(default)s)"
    )
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="device to run on (default: %(default)s)",
    )
    return parser


def sample(
    run_dir: str,
    prompt: str = "\n",
    tokens: int = 500,
    temperature: float = 0.8,
    top_k: int = 0,
    seed: int = 0,
    device: str = "cpu",
) -> str:
    """The prompt followed by `tokens` sampled tokens, decoded, by the run's task. ConfigError on bad input."""
    from .tasks import task_of_run
    from .tasks.contract import sampler

    weights = weights_file(run_dir)
    if tokens < 0 or temperature <= 0 or top_k < 0:
        bad = (
            "--tokens must not be negative"
            if tokens < 0
            else "--temperature must be positive"
            if temperature <= 0
            else "--top-k must not be negative"
        )
        raise ConfigError(bad)
    try:
        _, cfg, meta = read_weights_metadata(weights)
    except Exception as e:  # noqa: BLE001 - not a safetensors file written by anytrain
        raise ConfigError(
            f"run_dir: cannot read {weights}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from None
    if not prompt:
        raise ConfigError("--prompt must not be empty")
    settings = {"tokens": tokens, "temperature": temperature, "top_k": top_k, "seed": seed, "device": device}
    task = sampler(task_of_run(cfg, meta), "run_dir")  # a task that cannot sample says so before the model loads
    return task.sample(load_model(weights), weights.parent, meta, prompt, settings)


def main(argv: list[str] | None = None) -> None:
    try:
        args = build_parser().parse_args(argv)
        print(sample(args.run_dir, args.prompt, args.tokens, args.temperature, args.top_k, args.seed, args.device))
    except ConfigError as err:
        print(f"anytrain sample: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
