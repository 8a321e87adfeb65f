"""Peak memory of fine-tuning a causal language model with and without --gradient-checkpointing (issue 28).

A GPT-2-shaped model with random weights (6 blocks, 256 wide, 512 positions) and a byte-level BPE tokenizer
trained on the bundled Tiny Shakespeare are built offline; the texts are Tiny Shakespeare cut into pieces of
about 512 tokens. Each variant is a separate `src/train.py` process (batch 8 x 512 tokens, 6 optimizer steps),
the variants interleaved over the rounds. Printed: the peak memory the run reports in summary.json (process
max RSS on the CPU, CUDA peak allocated on a GPU), the mean optimizer step time and the final training loss.

    python benchmarks/llm_memory.py [--rounds 2] [--out runs/bench_llm_memory]
"""

import json
import statistics
from pathlib import Path

import toolkit

VARIANTS = {"kept activations": [], "gradient checkpointing": ["--gradient-checkpointing"]}
STEPS = 6


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
        *("--model", f"hf:{folder / 'model'}", "--dataset", str(folder / "texts.jsonl"), "--text-column", "text"),
        *("--task", "lm", "--max-length", "512", "--batch-size", "8", "--max-steps", str(STEPS)),
        *("--log-every-steps", "1", "--no-plot", "--no-progress", "--output-dir", str(run_dir), "--overwrite"),
        *VARIANTS[name],
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
        "step_s": summary["train_seconds"] / STEPS,
        "loss": train[-1]["loss"],
        "checkpointing": summary["gradient_checkpointing"],
    }


def main() -> None:
    args = toolkit.parser(__doc__, rounds=2, out="runs/bench_llm_memory").parse_args()
    folder = build(toolkit.out_dir(args.out))
    results = toolkit.interleave(list(VARIANTS), args.rounds, lambda name, r: run(folder, name, r))
    print(f"{'variant':24} {'peak memory':>14} {'step':>8} {'last loss':>10}")
    for name, rounds in results.items():
        ok = [x for x in rounds if "error" not in x]
        if not ok:
            print(f"{name:24} failed: {rounds[0]['error']}")
            continue
        peak = max(x["peak_memory_bytes"] for x in ok) / 2**20
        step = statistics.median(x["step_s"] for x in ok)
        print(f"{name:24} {peak:>10,.0f} MiB {step:>7.2f}s {ok[0]['loss']:>10.4f}  ({ok[0]['peak_memory_kind']})")
    toolkit.write_json(folder / "results.json", results)


if __name__ == "__main__":
    main()
