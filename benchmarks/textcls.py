"""Text classification: accuracy and speed of the registry's text models and tokenizers on a small real set.

    python benchmarks/textcls.py                                  # bag and encoder, bpe and char, 10 epochs
    python benchmarks/textcls.py --models bag --tokenizers bpe char byte --epochs 20
    python benchmarks/textcls.py --models bag --tokenizers char --epochs 12 --extra ngrams=5 n_embd=64 \
        hidden_sizes= dropout=0 weight_decay=0 lr=1e-2 schedule=constant max_length=1024   # examples/speakers_cpu.yaml

The set: the bundled `shakespeare-speakers` (who speaks, 8 speakers, a fixed split of 908 / 125 / 255
speeches; src/anytrain/data/speakers.py). Each configuration trains in this process (anytrain.train,
1 process, CPU threads as torch chooses) with every option at its default unless given by --extra.

Figures per run: validation and test accuracy at the end; samples/s (anytrain's steady figure, the
first step and evaluations left out); tokens/s, anytrain's own figure (samples/s x the training texts'
mean count of real tokens: the padding the batches add is computed but not counted); parameters. They
go to <out>/textcls.json and a Markdown table on stdout. Timings on a shared machine vary with its load
(the 1-minute load average is printed with each run).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def value(text: str):
    if text == "":
        return []  # an empty list option, e.g. hidden_sizes=
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def run(data: str, out: Path, model: str, tokenizer: str, epochs: int, extra: dict) -> dict:
    from accelerate.state import AcceleratorState

    import anytrain

    AcceleratorState._reset_state(True)
    options = dict(model=model, tokenizer=tokenizer, epochs=epochs)
    options.update(progress=False, plot=False, overwrite=True, **extra)
    summary = anytrain.train(options, dataset=data, output_dir=str(out / "runs" / f"{model}-{tokenizer}"))
    return {
        "model": model,
        "tokenizer": tokenizer,
        "vocab_size": summary["vocab_size"],
        "val_accuracy": summary["val_accuracy"],
        "test_accuracy": summary["test_accuracy"],
        "samples_per_s": summary["samples_per_s"],
        "tokens_per_s": summary["tokens_per_s"],
        "mean_tokens_per_text": summary["mean_tokens_per_text"],
        "parameters": summary["parameters"],
        "train_seconds": summary["train_seconds"],
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench_out/textcls")
    parser.add_argument("--models", nargs="+", default=["bag", "encoder"])
    parser.add_argument("--tokenizers", nargs="+", default=["bpe", "char"])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--extra", nargs="*", default=[], metavar="OPTION=VALUE", help="more options, e.g. lr=1e-3")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = "shakespeare-speakers"
    extra = {k: value(v) for k, v in (item.split("=", 1) for item in args.extra)}
    results = []
    for model in args.models:
        for tokenizer in args.tokenizers:
            results.append(run(data, out, model, tokenizer, args.epochs, extra))
            (out / "textcls.json").write_text(json.dumps(results, indent=1) + "\n")
            print(json.dumps(results[-1]), flush=True)
    print("| model | tokenizer | vocabulary | val acc | test acc | samples/s | tokens/s | parameters |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['model']} | {r['tokenizer']} | {r['vocab_size']} | {r['val_accuracy']:.3f} | "
            f"{r['test_accuracy']:.3f} | {r['samples_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | {r['parameters']:,} |"
        )


if __name__ == "__main__":
    main()
