"""The GPU comparison's job (scripts/gpu_truth.py's peers and offers steps; no anytrain in it but the bundled
questions' generator): the random Llama-shaped models, built from a config (no download), and the data each job reads.

Models: transformers' LlamaForCausalLM at random weights (float32, SDPA attention), about 0.5 B parameters in
Qwen2.5-0.5B's shape (width 896, SwiGLU 4,864, 24 blocks, 14 heads with 2 key-value heads, vocabulary 151,936, tied
embeddings) and about 1 B in Llama-3.2-1B's (width 2,048, SwiGLU 8,192, 16 blocks, 32 heads with 8 key-value heads,
vocabulary 128,256, tied), with sft_job's 402-token byte-level BPE and ChatML's chat template (the vocabulary's other
rows are never targets: FLOPs and memory are the shape's), its generation config stopping at end-of-text and
end-of-turn (grpo_job's). Data, written per sequence length S from Tiny Shakespeare's tokens: SFT, prompt/completion
chats whose answers are passages of S/8 to S/2 tokens, packed into rows of S; DPO, pairs whose prompt is a passage of
about S - 48 tokens and whose answers are a speaker's name (chosen) or another's (rejected); GRPO, grpo_job's
questions and its reward (the share of the completion's characters that are the digit 1). Validation and test splits
hold 2 short rows each: the trainers' own evaluations stay out of the way.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SHAPES = {  # LlamaConfig sizes; "vocabulary": the embedding's rows
    "0.5 B": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "vocabulary": 151936},
    "1 B": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocabulary": 128256},
}  # fmt: skip
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocabulary": 1024}  # fmt: skip  # the CPU dry run's every size
POSITIONS = 4096
SPEAKERS = ["ROMEO", "JULIET", "HAMLET", "OPHELIA", "MACBETH", "PORTIA", "OTHELLO", "VIOLA"]
HELD_OUT = 2  # validation and test rows


def tokenizer(folder: Path):
    """sft_job's chat tokenizer (trained once into `folder`, with a small model beside it that nothing trains)."""
    try:
        from . import sft_job  # imported as peers.gpu_job (benchmarks/gpu_peers.py)
    except ImportError:
        import sft_job
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(sft_job.build_model(folder))


def parameters(shape: dict) -> tuple[int, int]:
    """(all parameters, the embedding's) of LlamaForCausalLM in this shape, tied, no biases."""
    h, i, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    block = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h  # q, o; k, v; gate, up, down; two norms
    embedding = shape["vocabulary"] * h
    return embedding + layers * block + h, embedding


def build_model(folder: Path, shape: dict, tokens: Path, device: str = "cpu") -> Path:
    """The random model of `shape` with the tokenizer of `tokens`, saved in `folder` (made on `device`: a 1 B model's
    random init takes seconds on a CPU); kept when already there."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    if (folder / "config.json").exists():
        return folder
    tok = tokenizer(tokens)
    sizes = {k: v for k, v in shape.items() if k != "vocabulary"}
    config = LlamaConfig(
        vocab_size=shape["vocabulary"], tie_word_embeddings=True, max_position_embeddings=POSITIONS,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **sizes,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id,
        eos_token_id=[tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")],
    )  # fmt: skip
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    del model
    if device != "cpu":
        torch.cuda.empty_cache()  # the workers get the card's memory, not this process's cache
    return folder


def passages(tok, seed: int):
    """An endless source of Tiny Shakespeare passages: passage(n) is a random window of about n tokens, as text."""
    from anytrain.data.bundled import SHAKESPEARE_PATH

    ids = tok(SHAKESPEARE_PATH.read_text(encoding="utf-8")[:300_000], add_special_tokens=False).input_ids
    rng = random.Random(seed)

    def passage(n: int) -> str:
        start = rng.randrange(len(ids) - n)
        return tok.decode(ids[start : start + n]).strip()

    return passage, rng


def write_lines(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def chat(role: str, text: str) -> list[dict]:
    return [{"role": role, "content": text}]


def write_sft(folder: Path, tok, seq: int, tokens: int) -> Path:
    """FOLDER/{train,validation,test}.jsonl: prompt/completion chats holding at least `tokens` answer tokens."""
    passage, rng = passages(tok, seq)
    rows, total = [], 0
    while total < tokens:
        n = rng.randint(seq // 8, seq // 2)
        rows.append(
            {"prompt": chat("user", f"Recite passage {len(rows)}."), "completion": chat("assistant", passage(n))}
        )
        total += n
    write_lines(folder / "train.jsonl", rows)
    for split in ("validation", "test"):
        short = [{"prompt": chat("user", f"Say {w}."), "completion": chat("assistant", w)} for w in SPEAKERS[:HELD_OUT]]
        write_lines(folder / f"{split}.jsonl", short)
    return folder


def write_dpo(folder: Path, tok, seq: int, pairs: int) -> Path:
    """FOLDER/{train,validation,test}.jsonl: prompt (a passage of about seq - 48 tokens and a question), chosen and
    rejected (two speakers' names)."""
    passage, rng = passages(tok, seq + 1)
    window = max(8, seq - 48)  # the template, question and answer: about 38 tokens

    def pair(text: str) -> dict:
        right, wrong = rng.sample(SPEAKERS, 2)
        return {"prompt": chat("user", f"{text}\nWho speaks next?"), "chosen": chat("assistant", f"{right}."),
                "rejected": chat("assistant", f"{wrong}.")}  # fmt: skip

    write_lines(folder / "train.jsonl", [pair(passage(window)) for _ in range(pairs)])
    for split in ("validation", "test"):
        write_lines(folder / f"{split}.jsonl", [pair(passage(8)) for _ in range(HELD_OUT)])
    return folder


def write_grpo(folder: Path) -> Path:
    """grpo_job's questions and reward file, its held-out splits cut to HELD_OUT prompts."""
    try:
        from . import grpo_job
    except ImportError:
        import grpo_job

    grpo_job.write_data(folder)
    for split in ("validation", "test"):
        path = folder / f"{split}.jsonl"
        path.write_text("\n".join(path.read_text().splitlines()[:HELD_OUT]) + "\n")
    return folder


def rewards(folder: Path) -> Path:
    return folder / "rewards.py"
