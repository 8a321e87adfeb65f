"""Print text sampled from a trained language-model run:

    anytrain sample runs/shakespeare --prompt "ROMEO:" --tokens 300 --temperature 0.8 --top-k 40
    anytrain sample runs/sft --prompt "What is 12 + 5?" --top-p 0.9 --repetition-penalty 1.1
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
        "--top-p",
        type=float,
        default=1.0,
        help="sample only within the likeliest tokens whose probabilities sum to p, in (0, 1]; 1 = all "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--top-k", type=int, default=0, help="sample only among the k likeliest tokens; 0 = all (default: %(default)s)"
    )
    parser.add_argument(
        "--min-p",
        type=float,
        default=0.0,
        help="sample only the tokens at least p times as likely as the likeliest, in [0, 1]; 0 = all "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="divide the scores of the tokens already read or written by this (> 0; transformers' "
        "repetition_penalty); 1 = none (default: %(default)s)",
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
    *,
    top_p: float = 1.0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
) -> str:
    """The prompt followed by `tokens` sampled tokens, decoded, by the run's task. ConfigError on bad input."""
    from .tasks import task_of_run
    from .tasks.contract import sampler

    weights = weights_file(run_dir)
    settings = dict(tokens=tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                    repetition_penalty=repetition_penalty, seed=seed, device=device)  # fmt: skip
    bad = out_of_range(settings)
    if bad:
        raise ConfigError(bad)
    try:
        _, cfg, meta = read_weights_metadata(weights)
    except Exception as e:  # noqa: BLE001 - not a safetensors file written by anytrain
        raise ConfigError(
            f"run_dir: cannot read {weights}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from None
    if not prompt:
        raise ConfigError("--prompt must not be empty")
    task = sampler(task_of_run(cfg, meta), "run_dir")  # a task that cannot sample says so before the model loads
    return task.sample(load_model(weights), weights.parent, meta, prompt, settings)


def out_of_range(settings: dict) -> str | None:
    """The line that refuses the first setting out of its range, or None."""
    checks = (
        (settings["tokens"] < 0, "--tokens must not be negative"),
        (settings["temperature"] <= 0, "--temperature must be positive"),
        (not 0 < settings["top_p"] <= 1, "--top-p must be in (0, 1]"),
        (settings["top_k"] < 0, "--top-k must not be negative"),
        (not 0 <= settings["min_p"] <= 1, "--min-p must be in [0, 1]"),
        (settings["repetition_penalty"] <= 0, "--repetition-penalty must be positive"),
    )
    return next((line for wrong, line in checks if wrong), None)


def main(argv: list[str] | None = None) -> None:
    try:
        args = build_parser().parse_args(argv)
        a = args
        print(sample(a.run_dir, a.prompt, a.tokens, a.temperature, a.top_k, a.seed, a.device, top_p=a.top_p,
                     min_p=a.min_p, repetition_penalty=a.repetition_penalty))  # fmt: skip
    except ConfigError as err:
        print(f"anytrain sample: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
