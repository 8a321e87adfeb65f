"""The GRPO rollout's generate on its own (gpu_worker.py runs it): transformers' `generate` on the job's model as both
trainers' rollouts call it (float32 weights under bf16 autocast on a GPU, sampling at temperature 1, the group's
prompts left-padded, `prompts` x `generations` completions of exactly `new_tokens` tokens: min_new_tokens keeps every
variant's work the same), with the dynamic key-value cache (the default, what anytrain's rollout uses), the static
cache with compilation off (`disable_compile`), or the static cache with transformers' compiled decode step (its own
auto-compile on a GPU; on the CPU dry run the same path with the eager backend). anytrain has no option for the cache,
so it is measured here. Figures: the median seconds of the timed calls after the warm-up ones (a compiled decode's
first calls compile and record), the generated tokens a second, the first call's seconds."""

from __future__ import annotations

import contextlib
import json
import statistics
import time
from pathlib import Path


def prompts(job: dict, tokenizer) -> dict:
    """The first `prompts` questions, each repeated `generations` times, rendered and left-padded."""
    lines = (Path(job["data"]) / "train.jsonl").read_text().splitlines()[: job["prompts"]]
    texts = [tokenizer.apply_chat_template(json.loads(x)["prompt"], add_generation_prompt=True, tokenize=False)
             for x in lines]  # fmt: skip
    tokenizer.padding_side = "left"
    rows = [t for t in texts for _ in range(job["generations"])]
    return tokenizer(rows, return_tensors="pt", padding=True, add_special_tokens=False)


def settings(job: dict, cuda: bool) -> dict:
    from transformers import CompileConfig

    fixed = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=job["new_tokens"],
                 min_new_tokens=job["new_tokens"])  # fmt: skip
    if job["variant"] == "dynamic":
        return fixed
    if job["variant"] == "static":
        return {**fixed, "cache_implementation": "static", "disable_compile": True}
    config = CompileConfig() if cuda else CompileConfig(backend="eager")
    config._compile_all_devices = not cuda or None  # the dry run's CPU takes the same path
    return {**fixed, "cache_implementation": "static", "compile_config": config}


def run(job: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    model = AutoModelForCausalLM.from_pretrained(job["model"]).to(device).eval()
    inputs = {k: v.to(device) for k, v in prompts(job, tokenizer).items()}
    kwargs = settings(job, cuda)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    seconds = []
    for _ in range(job["warmup"] + job["steps"]):
        start = time.perf_counter()
        with torch.no_grad(), autocast:
            out = model.generate(**inputs, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    generated = (out.shape[1] - inputs["input_ids"].shape[1]) * out.shape[0]
    timed = seconds[job["warmup"] :]
    rates = [generated / s for s in timed]
    return {"tokens_per_s": statistics.median(rates), "step_tokens_per_s": rates, "call_seconds": seconds,
            "generated_tokens": generated, "first_call_s": seconds[0], "steps": len(seconds)}  # fmt: skip
