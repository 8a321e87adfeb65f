"""Fine-tuning a causal language model (issue 28): peak memory with and without --gradient-checkpointing, and
real (non-pad) tokens per second with and without --packing.

A GPT-2-shaped model with random weights (6 blocks, 256 wide, 512 positions) and a byte-level BPE tokenizer
trained on the bundled Tiny Shakespeare are built offline. Each variant is a separate `src/train.py` process,
the variants interleaved over the rounds.
- memory: Tiny Shakespeare cut into pieces of about 600 tokens, truncated at 512; batch 8, 6 optimizer steps.
  Printed: the peak memory summary.json reports (process max RSS on the CPU, CUDA peak allocated on a GPU).
- packing: the bundled speeches (shakespeare-speakers' texts, most far shorter than a row) at --max-length
  256, batch 8, 40 optimizer steps; padded one a row, or packed. Printed: real tokens per second (summary's
  tokens_per_s counts the texts' tokens, never padding), the step time and the loss.

    python benchmarks/llm.py [--rounds 2] [--out runs/bench_llm]
"""

import json
import statistics
from pathlib import Path

import toolkit

MEMORY = ["--dataset", "{texts}", "--text-column", "text", "--max-length", "512", "--max-steps", "6"]
SPEECHES = ["--dataset", "shakespeare-speakers", "--max-length", "256", "--max-steps", "40"]
VARIANTS = {
    "kept activations": MEMORY,
    "gradient checkpointing": [*MEMORY, "--gradient-checkpointing"],
    "speeches padded": SPEECHES,
    "speeches packed": [*SPEECHES, "--packing"],
}


def tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=2048, special_tokens=["<eos>"], initial_alphabet=alphabet)
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<eos>", eos_token="<eos>")


def build(folder: Path) -> Path:
    """The model folder and the texts (jsonl), once."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from anytrain.data.bundled import SHAKESPEARE_PATH

    text = SHAKESPEARE_PATH.read_text()
    pieces = [text[k : k + 2000] for k in range(0, len(text) - 2000, 2000)]  # about 600 tokens each
    tok = tokenizer(pieces)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    config = GPT2Config(vocab_size=len(tok), n_positions=512, n_embd=256, n_layer=6, n_head=4, **ids)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")
    with (folder / "texts.jsonl").open("w") as f:
        for piece in pieces[:400]:
            f.write(json.dumps({"text": piece}) + "\n")
    return folder


def run(folder: Path, name: str, r: int) -> dict:
    run_dir = folder / f"{name.replace(' ', '_')}_{r}"
    options = [
        *("--model", f"hf:{folder / 'model'}", "--task", "lm", "--batch-size", "8", "--log-every-steps", "1"),
        *("--no-plot", "--no-progress", "--output-dir", str(run_dir), "--overwrite"),
        *(option.format(texts=folder / "texts.jsonl") for option in VARIANTS[name]),
    ]
    with (folder / f"{run_dir.name}.log").open("w") as log:
        rec, _ = toolkit.run_process(toolkit.launch_cmd("cpu.yaml", toolkit.TRAIN, *options), log)
    if "error" in rec:
        return {"error": rec["error"]}
    summary = json.loads((run_dir / "summary.json").read_text())
    train = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if m["kind"] == "train"]
    return {
        "peak_memory_bytes": summary["peak_memory_bytes"],
        "peak_memory_kind": summary["peak_memory_kind"],
        "step_s": summary["train_seconds"] / summary["optimizer_steps"],
        "tokens_per_s": summary["tokens_per_s"],
        "loss": train[-1]["loss"],
    }


def main() -> None:
    args = toolkit.parser(__doc__, rounds=2, out="runs/bench_llm").parse_args()
    folder = build(toolkit.out_dir(args.out))
    results = toolkit.interleave(list(VARIANTS), args.rounds, lambda name, r: run(folder, name, r))
    print(f"{'variant':24} {'peak memory':>14} {'step':>8} {'real tokens/s':>14} {'last loss':>10}")
    for name, rounds in results.items():
        ok = [x for x in rounds if "error" not in x]
        if not ok:
            print(f"{name:24} failed: {rounds[0]['error']}")
            continue
        peak = max(x["peak_memory_bytes"] for x in ok) / 2**20
        step = statistics.median(x["step_s"] for x in ok)
        rate = statistics.median(x["tokens_per_s"] for x in ok)
        print(f"{name:24} {peak:>10,.0f} MiB {step:>7.3f}s {rate:>14,.0f} {ok[0]['loss']:>10.4f}")
    padded, packed = (
        statistics.median(x["tokens_per_s"] for x in results[k]) for k in ("speeches padded", "speeches packed")
    )
    print(f"packing: {packed / padded:.2f}x the padded run's real tokens per second")
    toolkit.write_json(folder / "results.json", results)


if __name__ == "__main__":
    main()
