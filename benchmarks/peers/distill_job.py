"""The on-policy distillation job that anytrain (`--task distill`) and TRL's DistillationTrainer both run (no anytrain
in it but the bundled sums' generator and sft_job's model).

The student: the random Llama-style model of grpo_job.py (sft_job's: width 256, 4 blocks, 4 heads with 2 key-value
heads, SwiGLU MLP of 512, rotary positions; the 402-token byte-level BPE with ChatML's chat template; generation stops
at end-of-text and at ChatML's end-of-turn), 2.57 M parameters. The teacher: a wider, deeper Llama with the same
tokenizer and vocabulary (width 384, 6 blocks, 6 heads with 2 key-value heads, SwiGLU MLP of 1,024), 9.7 M
parameters, trained here for TEACHER_STEPS steps on chats of the bundled sums (the question, then its answer and
ChatML's end-of-turn) so that its next-token distribution has the shape of a trained model's: the chat's form,
digits, the end of the turn. 400 training prompts of the bundled sum questions (`--dataset sum-questions`: "What is
48213 + 90876?" as a user turn, TRL's conversational prompt form), 16 optimizer steps of 8 prompts, each answered
once by the student (one generation per step) with at most 32 new tokens sampled at temperature 1 and top-p 1, the
loss the generalized JSD over the whole vocabulary at temperature 1 (beta 1, the reverse KL: TRL's default; and
beta 0.5), the sum over the step's completion tokens over their count, AdamW (weight decay 0), constant LR without
warm-up, gradient norm clipped to 1.0, fp32, no gradient checkpointing, the models' own generate (no vLLM); full
fine-tuning at LR 1e-3 and LoRA (rank 8, alpha 16, every linear projection of the blocks) at LR 1e-2. Each trainer's
saved student is scored by the same code (scores) on 64 held-out prompts: the reverse KL(student || teacher) per
token of the student's own completions (sampled at temperature 1 from a fixed seed: the on-policy objective at beta
1), and on the teacher's completions (sampled once from a fixed seed: the same tokens for every student) the forward
KL(teacher || student) per token and the share of their tokens where the student's most likely next token is the
teacher's. (anytrain, which validates and tests at the end of a run, is given 16 + 16 held-out prompts; TRL
evaluates nothing.)
"""  # the second paragraph is the job's description

import json
from pathlib import Path

ROWS = {"train": 400, "validation": 16, "test": 16, "heldout": 64}  # heldout: the scoring's prompts
PROMPTS, MAX_NEW_TOKENS, STEPS, TEMPERATURE = 8, 32, 16, 1.0
LR = {"full": 1e-3, "lora": 1e-2}
LORA_R, LORA_ALPHA = 8, 16
TEACHER_SHAPE = {"hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 6}
TEACHER_STEPS, TEACHER_BATCH, TEACHER_LR, TEACHER_CHATS = 100, 16, 3e-3, 1600
SEED = 11


def anytrain_options(kind: str, beta: float, seed: int, teacher: Path, steps: int = STEPS) -> list[str]:
    """The job as anytrain options (src/train.py): kind full or lora, beta the divergence."""
    options = ["--task", "distill", "--teacher", f"hf:{teacher}", "--beta", str(beta), "--temperature", "1"]
    options += ["--top-p", "1", "--max-new-tokens", str(MAX_NEW_TOKENS), "--batch-size", str(PROMPTS)]
    options += ["--max-steps", str(steps), "--lr", str(LR[kind]), "--weight-decay", "0", "--schedule", "constant"]
    options += ["--warmup-steps", "0", "--max-grad-norm", "1.0", "--log-every-steps", "1", "--eval-every-steps", "0"]
    options += ["--seed", str(seed), "--final-weights", "last"]  # TRL's model: the last step's
    return options + (["--lora-r", str(LORA_R), "--lora-alpha", str(LORA_ALPHA)] if kind == "lora" else [])


def write_data(folder: Path, seed: int = SEED) -> Path:
    """DIR/{train,validation,test,heldout}.jsonl: prompt (the question as a user turn) and answer (the sum's text)."""
    from anytrain.data.sums import rows

    folder.mkdir(parents=True, exist_ok=True)
    chats, start = rows(sum(ROWS.values()), seed=seed), 0
    for split, count in ROWS.items():
        part = chats[start : start + count]
        lines = [json.dumps({"prompt": c["messages"][:1], "answer": c["answer"]}) for c in part]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
        start += count
    return folder


def build_models(folder: Path) -> tuple[Path, Path]:
    """(student, teacher) folders under `folder`, made once: grpo_job's model, and the teacher trained beside it."""
    try:
        from . import grpo_job  # imported as peers.distill_job (benchmarks/distill_vs_trl.py)
    except ImportError:
        import grpo_job

    student = grpo_job.build_model(folder / "student")
    teacher = folder / "teacher"
    if not (teacher / "config.json").exists():
        train_teacher(student, teacher)
    return student, teacher


def teacher_chats(tokenizer) -> list[str]:
    """TEACHER_CHATS chats of the bundled sums (another seed's than the prompts): the question, then the answer."""
    from anytrain.data.sums import rows

    return [tokenizer.apply_chat_template([c["messages"][0], {"role": "assistant", "content": c["answer"]}],
                                          tokenize=False) for c in rows(TEACHER_CHATS, seed=SEED + 1)]  # fmt: skip


def train_teacher(student: Path, folder: Path) -> None:
    """The teacher: the student's tokenizer, generation config and config at TEACHER_SHAPE, trained (seeded) on
    teacher_chats with the next-token loss on every token, then saved with the student's tokenizer."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(student)
    config = AutoConfig.from_pretrained(student)
    for key, value in TEACHER_SHAPE.items():
        setattr(config, key, value)
    config.head_dim = config.hidden_size // config.num_attention_heads
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    batch = tokenizer(teacher_chats(tokenizer), padding=True, add_special_tokens=False, return_tensors="pt")
    labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=TEACHER_LR, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    ids, mask = batch.input_ids, batch.attention_mask
    for _ in range(TEACHER_STEPS):
        pick = torch.randint(0, len(labels), (TEACHER_BATCH,), generator=g)
        model(input_ids=ids[pick], attention_mask=mask[pick], labels=labels[pick]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    GenerationConfig.from_pretrained(student).save_pretrained(folder)


def sampled(model, tokenizer, prompts: list, stops: list[int], seed: int):
    """(prompt and completion ids, their attention mask, the completion's tokens up to and with the first of `stops`,
    the prompts' width): the prompts answered by sampling at TEMPERATURE (torch's generator seeded), left-padded."""
    import torch

    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, padding=True, add_special_tokens=False, return_tensors="pt")
    torch.manual_seed(seed)
    with torch.no_grad():
        ids = model.generate(**batch, do_sample=True, temperature=TEMPERATURE, top_p=1.0, top_k=0,
                             max_new_tokens=MAX_NEW_TOKENS, eos_token_id=stops,
                             pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    width = batch.input_ids.shape[1]
    stopped = torch.isin(ids[:, width:], torch.tensor(stops)).int()
    learned = (stopped.cumsum(1) - stopped) == 0  # up to and with the first stop token
    mask = torch.cat([batch.attention_mask, learned.long()], 1)
    return ids, mask, learned, width


def per_token(student, teacher, ids, mask, learned, width) -> dict:
    """At the completion tokens: the mean reverse and forward KL at TEMPERATURE, and the share where the student's
    most likely next token is the teacher's."""
    import torch

    with torch.no_grad():
        logits = [m(input_ids=ids, attention_mask=mask).logits[:, width - 1 : -1].float() for m in (student, teacher)]
    log_s, log_t = ((x / TEMPERATURE).log_softmax(-1)[learned] for x in logits)
    reverse = (log_s.exp() * (log_s - log_t)).sum(-1)
    forward = (log_t.exp() * (log_t - log_s)).sum(-1)
    same = (log_s.argmax(-1) == log_t.argmax(-1)).double()
    return {"reverse_kl": reverse.mean().item(), "forward_kl": forward.mean().item(), "agreement": same.mean().item()}


def scores(student_folder: Path, teacher_folder: Path, data: Path) -> dict:
    """The held-out scores of a saved student (module docstring), the same code for every trainer's model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(teacher_folder)
    student = AutoModelForCausalLM.from_pretrained(student_folder).eval()
    teacher = AutoModelForCausalLM.from_pretrained(teacher_folder).eval()
    prompts = [json.loads(line)["prompt"] for line in (data / "heldout.jsonl").read_text().splitlines()]
    stops = teacher.generation_config.eos_token_id  # end-of-text and end-of-turn, whatever a trainer saved
    own = per_token(student, teacher, *sampled(student, tokenizer, prompts, stops, seed=0))
    theirs = per_token(student, teacher, *sampled(teacher, tokenizer, prompts, stops, seed=0))
    return {"reverse_kl": own["reverse_kl"], "forward_kl": theirs["forward_kl"], "agreement": theirs["agreement"]}
