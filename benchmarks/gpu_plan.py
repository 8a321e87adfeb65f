"""What scripts/gpu_truth.py's peers and offers steps run, each job sized from the FLOPs and memory it needs, and the
estimate printed before anything runs (arithmetic only: nothing here touches a GPU).

The peers: anytrain (`--task sft`, `dpo`, `grpo`) beside TRL's SFTTrainer, DPOTrainer and GRPOTrainer, on the same
model, data and batch, in bf16 with SDPA: SFT full and LoRA (rank 16, packed), DPO with a cached reference, a short
GRPO (anytrain with and without --share-prompts), at sequence 1,024 and 2,048 on models of 0.5 B and 1 B parameters
(peers/gpu_job.py). --quick runs 0.5 B at 1,024 and 1 B at 2,048 and GRPO on 0.5 B; the whole run all four cells
and GRPO on both. The offers, each against anytrain's default on the 0.5 B SFT job at 1,024: the fused loss's chunk
sized for a GPU, fused AdamW off, Liger's kernels (when installed), torch.compile (accelerate_configs/gpu_compile.yaml:
the whole run only, its compilation alone would take a third of --quick's 5 minutes), and transformers' static cache
with and without its compiled decode on the GRPO rollout's generate.

Sizes: every SFT and DPO step reads TOKENS_PER_STEP tokens (rows x sequence; a DPO pair is two sequences), halved
until the job's memory fits MEMORY_USE of the card (weights, gradients and AdamW's two moments in float32, autocast's
bf16 copy of the weights, the activations a block saves (memory_gib), the fused loss's chunk of logits, and for TRL's
packing the batch's one flattened row and its mask); a job that would not fit at one row is refused. Steps: `warmup`
untimed, then enough timed ones for MEASURE_S seconds at the assumed MFU (3 to 10; GRPO's 2). Time: each step's FLOPs
(6 N + 12 L d T a token, N the weights but the embedding, the tied output layer counted; LoRA's backward without the
weights' gradients: 4 N) over the card's peak at ASSUMED_MFU, plus each run's and each process's start (the constants
below, guesses for an H100 machine with 16 cores: the first GPU run replaces them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from peers.gpu_job import SHAPES, TINY, parameters

CARD = {"name": "H100", "memory_gib": 78.0, "peak_tflops": 989.0}  # bf16 dense; an H200's peak is the same
ASSUMED_MFU = 0.375
MEMORY_USE = 0.9  # of the card's memory a job may plan on (the allocator's own slack)
TOKENS_PER_STEP = 16384
MEASURE_S = 1.0
LORA_R = 16
GRPO = {"prompts": 8, "generations": 8, "prompt_tokens": 49}  # a step: 8 x 8 completions; grpo_job's prompts' mean
CHUNKS = {True: [2**27], False: [2**27, 2**28]}  # the fused loss's GPU chunks tried (quick, whole); CPU 2**24
# Seconds, guessed for an H100 machine: a run's own start in a warm worker (config, data, the model loaded at
# LOAD_GBPS), a worker's start (python, torch, transformers, CUDA), a model built on the GPU and saved, the first
# compiled step of the 0.5 B model (inductor, forward and backward), the static cache's decode compiled, and one
# decode step a block (the rollout's generate is launch-bound at these sizes).
RUN_START = {"anytrain": 3.0, "trl": 4.0, "generate": 2.0}
LOAD_GBPS, WORKER_START, BUILD_S, COMPILE_S, DECODE_COMPILE_S = 2.0, 10.0, 4.0, 90.0, 45.0
DECODE_S_PER_BLOCK = 0.0009
OTHER_STEPS = {  # the script's other steps: (quick, whole) seconds, from the last H200 run's walls
    "env": (3, 3), "pytest": (60, 60), "precisions": (60, 60), "fsdp": (15, 25), "compile": (100, 100),
    "mfu": (30, 30), "lmhead": (25, 25), "llm": (60, 60), "grpo": (40, 40), "gpt": (30, 30),
}  # fmt: skip


class PlanError(ValueError):
    """A job that does not fit the card's memory, even at one row a step."""


@dataclass(frozen=True)
class Job:
    """One run: `trainer` anytrain, trl or generate; `task` sft, dpo or grpo; `variant` full, lora, share, no-share
    or an offer's name; `process` the worker it runs in (anytrain, compile, trl); `patch` what the anytrain worker
    changes for it (offers)."""

    trainer: str
    task: str
    variant: str
    size: str
    seq: int
    process: str
    rows: int = 1
    steps: int = 2
    warmup: int = 1
    patch: dict = field(default_factory=dict)
    new_tokens: int = 0
    memory_gib: float = 0.0
    seconds: float = 0.0
    run_seq: int = 0  # the dry run's toy sizes (0: the GPU run's, seq and new_tokens)
    run_new_tokens: int = 0

    @property
    def id(self) -> str:
        return f"{self.size.replace(' ', '')}-{self.seq}-{self.task}-{self.variant}-{self.trainer}"

    @property
    def length(self) -> int:
        """The sequence the run reads (seq, which names the job, or the dry run's)."""
        return self.run_seq or self.seq

    @property
    def generated(self) -> int:
        return self.run_new_tokens or self.new_tokens


def shape_of(size: str, dry: bool) -> dict:
    return TINY if dry else SHAPES[size]


def flops_per_token(shape: dict, context: int) -> int:
    """6 N + 12 L d T (anytrain/flops.py's count for a transformers model; the tied output layer is a product)."""
    from anytrain.flops import transformer_flops

    total, _ = parameters(shape)  # less the embedding, plus the tied output layer: the same table, counted once
    return transformer_flops(total, shape["num_hidden_layers"], shape["hidden_size"], context)


def context_of(job: Job) -> int:
    """The sequence the FLOPs count attends over: the job's; a GRPO row is its prompt and completion."""
    return GRPO["prompt_tokens"] + job.new_tokens if job.task == "grpo" else job.seq


def tokens_per_step(job: Job) -> int:
    if job.task == "grpo":
        return GRPO["prompts"] * GRPO["generations"] * context_of(job)
    return job.rows * job.seq * (2 if job.task == "dpo" else 1)


def lora_parameters(shape: dict) -> int:
    h, i, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    return layers * LORA_R * (2 * (h + h) + 2 * (h + kv) + 2 * (h + i) + (i + h))  # q, o; k, v; gate, up; down


def memory_gib(job: Job, shape: dict) -> float:
    """The job's planned peak: weights and their state, autocast's bf16 copy, activations, the loss's logits."""
    total, _ = parameters(shape)
    h, i, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    lora = job.variant == "lora"
    state = (4 + 2) * total + 16 * lora_parameters(shape) if lora else (16 + 2) * total
    tokens = tokens_per_step(job)
    # saved for the backward, a block a token: the two RMSNorms' float32 input, normalised and cast (10 h each), each
    # projection's own bf16 copy of its input (q, k, v: 6 h; gate, up: 4 h), SDPA's q, k, v and output, o_proj's
    # input (6 h + 4 kv), the MLP's gate, up, SiLU and product (8 i); a tenth more for what else lives meanwhile
    activations = tokens * layers * (36 * h + 4 * kv + 8 * i) * 1.1
    chunk = job.patch.get("chunk_elements", 2**24)
    logits = 3 * 4 * max(256, chunk // shape["vocabulary"]) * shape["vocabulary"]
    mask = 3 * tokens**2 if job.trainer == "trl" and job.task == "sft" else 0  # TRL packs the batch into one row
    cache = 2 * 2 * layers * kv * tokens if job.task == "grpo" else 0  # generate's key-value cache, bf16
    return (state + activations + logits + mask + cache) / 2**30


def step_seconds(job: Job, shape: dict, card: dict) -> float:
    """A step at the assumed MFU: its FLOPs (TRL's packed SFT attends over its one flattened row), and for GRPO the
    rollout's decode steps."""
    attended = job.rows * job.seq if job.trainer == "trl" and job.task == "sft" else context_of(job)
    flops = tokens_per_step(job) * flops_per_token(shape, attended)
    if job.variant == "lora":
        flops = flops * 2 / 3
    seconds = flops / (card["peak_tflops"] * 1e12 * ASSUMED_MFU)
    if job.task == "grpo":
        seconds += job.new_tokens * shape["num_hidden_layers"] * DECODE_S_PER_BLOCK
    return seconds


def run_seconds(job: Job, shape: dict, card: dict) -> float:
    """The job's whole run: its start and model load, its steps, DPO's reference pass, a compiled first step."""
    load = 4 * parameters(shape)[0] / (LOAD_GBPS * 1e9)
    step = step_seconds(job, shape, card)
    seconds = RUN_START.get(job.trainer, 6.0) + load + job.steps * step
    if job.task == "dpo":
        seconds += job.steps * step / 3  # the cached reference: one forward pass over the steps' pairs
    if job.process == "compile":
        seconds += COMPILE_S * shape["num_hidden_layers"] / 24
    if job.trainer == "generate":  # decode steps only, and the compiled decode's compilation
        calls = job.steps * job.new_tokens * shape["num_hidden_layers"] * DECODE_S_PER_BLOCK
        seconds = RUN_START["generate"] + load + calls + DECODE_COMPILE_S * (job.variant == "compiled")
    return seconds


def sized(job: Job, shape: dict, card: dict, measure_s: float) -> Job:
    """The job with its rows (halved until it fits), steps and estimates; PlanError where one row does not fit."""
    budget = card["memory_gib"] * MEMORY_USE
    per_row = job.seq * (2 if job.task == "dpo" else 1)
    job = replace(job, rows=max(1, TOKENS_PER_STEP // per_row)) if job.task != "grpo" else job
    while memory_gib(job, shape) > budget and job.rows > 1:
        job = replace(job, rows=job.rows // 2)
    memory = memory_gib(job, shape)
    if memory > budget:
        raise PlanError(f"{job.id}: {memory:.1f} GiB planned at one row, above {budget:.0f} GiB of {card['name']}")
    timed = min(10, max(2 if job.task == "grpo" else 3, math.ceil(measure_s / step_seconds(job, shape, card))))
    job = replace(job, steps=job.warmup + timed)
    return replace(job, memory_gib=memory, seconds=run_seconds(job, shape, card))


def toy(job: Job) -> Job:
    """The job at the CPU dry run's sizes (TINY's model, sequence 64, 8 new tokens, two steps, one timed), its name
    and the GPU run's estimates kept."""
    new_tokens = 8 if job.new_tokens else 0
    length = GRPO["prompt_tokens"] + new_tokens if job.task == "grpo" else 64
    rows = job.rows if job.task == "grpo" else 2
    return replace(job, rows=rows, steps=2, warmup=1, run_seq=length, run_new_tokens=new_tokens)


CELLS = {True: [("0.5 B", 1024), ("1 B", 2048)], False: [(s, q) for s in SHAPES for q in (1024, 2048)]}
GRPO_SIZES = {True: ["0.5 B"], False: list(SHAPES)}
NEW_TOKENS = {True: 64, False: 96}  # GRPO's completions (quick, whole)
OFFER_JOB = ("0.5 B", 1024)  # the job the offers change: anytrain's SFT, full fine-tuning


def peer_jobs(quick: bool) -> list[Job]:
    """The peers: each cell's SFT full, SFT LoRA and DPO through both trainers, then GRPO (anytrain with and without
    shared prompts, TRL)."""
    jobs = []
    for size, seq in CELLS[quick]:
        for task, variant in (("sft", "full"), ("sft", "lora"), ("dpo", "full")):
            for trainer in ("anytrain", "trl"):
                jobs.append(Job(trainer, task, variant, size, seq, trainer, warmup=2))
    new_tokens = NEW_TOKENS[quick]
    for size in GRPO_SIZES[quick]:
        for trainer, variant in (("anytrain", "share"), ("anytrain", "no-share"), ("trl", "full")):
            seq = GRPO["prompt_tokens"] + new_tokens
            rows = GRPO["prompts"] * GRPO["generations"]  # completions
            jobs.append(Job(trainer, "grpo", variant, size, seq, trainer, rows, warmup=1, new_tokens=new_tokens))
    return jobs


def offer_jobs(quick: bool) -> list[Job]:
    """The offers, each one anytrain run of the 0.5 B SFT job at 1,024 with one thing changed (its baseline is that
    peers job): the chunks, fused AdamW off, Liger last (it patches transformers' Llama for the rest of the process),
    torch.compile in its own process; and the rollout's generate, dynamic cache, static, static and compiled."""
    size, seq = OFFER_JOB
    base = Job("anytrain", "sft", "full", size, seq, "anytrain", warmup=2)
    jobs = [replace(base, variant=f"chunk-2^{int(math.log2(c))}", patch={"chunk_elements": c}) for c in CHUNKS[quick]]
    jobs.append(replace(base, variant="adamw-unfused", patch={"fused_adamw": False}))
    jobs.append(replace(base, variant="liger", patch={"liger": True}))
    jobs += [] if quick else [replace(base, variant="compiled", process="compile", warmup=3)]
    new_tokens = NEW_TOKENS[quick]
    for variant in ("dynamic", "static", "compiled"):  # a compiled decode's first two calls compile and record
        jobs.append(Job("generate", "grpo", variant, size, GRPO["prompt_tokens"] + new_tokens, "trl",
                        GRPO["prompts"] * GRPO["generations"], warmup=2 if variant == "compiled" else 1,
                        new_tokens=new_tokens))  # fmt: skip
    return jobs


def plan(quick: bool, dry: bool, card: dict | None = None) -> list[Job]:
    """Every job of the peers and offers steps, sized for the card (PlanError: one that does not fit it); on the dry
    run at toy sizes."""
    card = card or CARD
    jobs = [sized(job, SHAPES[job.size], card, MEASURE_S) for job in peer_jobs(quick) + offer_jobs(quick)]
    return [toy(job) for job in jobs] if dry else jobs


def setup_seconds(jobs: list[Job]) -> float:
    """The workers' starts and the models built."""
    sizes = {job.size for job in jobs}
    build = sum(BUILD_S + 4 * parameters(SHAPES[s])[0] / 1e9 for s in sizes)
    return WORKER_START * len({job.process for job in jobs}) + build


def estimate(jobs: list[Job], steps: list[str], quick: bool, dry: bool, card: dict | None = None) -> tuple[float, str]:
    """(seconds, the printed plan): each job's rows, steps, FLOPs a step, memory and seconds, then the steps' sums."""
    card = card or CARD
    lines = [f"gpu_truth: the plan on an {card['name']} ({card['peak_tflops']:.0f} TFLOP/s bf16 dense, "
             f"{card['memory_gib']:.0f} GiB; at {100 * ASSUMED_MFU:.1f} % MFU):",
             f"  {'job':34s} {'rows x seq':>12s} {'steps':>6s} {'TFLOP/step':>10s} {'s/step':>7s} {'GiB':>6s} "
             f"{'est. s':>7s}"]  # fmt: skip
    lines = lines if jobs else lines[:1]
    for job in jobs:
        shape = SHAPES[job.size]
        flops = tokens_per_step(job) * flops_per_token(shape, context_of(job)) / 1e12
        size, timed = f"{job.rows} x {job.seq:,}", f"{job.warmup}+{job.steps - job.warmup}"
        figures = f"{flops:10.1f} {step_seconds(job, shape, card):7.2f} {job.memory_gib:6.1f} {job.seconds:7.1f}"
        lines.append(f"  {job.id:34s} {size:>12s} {timed:>6s} {figures}")
    jobs_s, setup = sum(job.seconds for job in jobs), setup_seconds(jobs)
    others = {name: OTHER_STEPS[name][0 if quick else 1] for name in steps if name in OTHER_STEPS}
    total = jobs_s + setup * bool(jobs) + sum(others.values())
    said = ", ".join(f"{name} {seconds} s" for name, seconds in others.items())
    lines.append(f"  peers and offers: {len(jobs)} jobs {jobs_s:.0f} s, workers' starts and models {setup:.0f} s; "
                 f"other steps: {said or 'none'}")  # fmt: skip
    lines.append(
        f"  estimate: {total:.0f} s ({total / 60:.1f} min){' (the dry run runs these jobs at toy sizes)' * dry}"
    )
    return total, "\n".join(lines)
