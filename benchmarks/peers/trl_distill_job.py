"""The on-policy distillation job (distill_job.py) through TRL 1.16's DistillationTrainer, written as TRL's docs show:
the dataset from its jsonl, the teacher by its folder, DistillationConfig, a peft LoraConfig for LoRA; TRL's defaults
that differ from the job are set to it (bf16 and gradient checkpointing off, the job's LR rather than 1e-6, constant
LR; beta, temperature, top-p, top-k 0 set explicitly even where they are TRL's defaults). per_device_train_batch_size
8 prompts and gradient_accumulation_steps 1: one generation batch per optimizer step, answered by the student's own
transformers generate (TRL's sampling: torch's generator, seeded per process), as anytrain answers its step's
prompts once. Loop time, peak memory and the saved student as the other TRL jobs (trl_run.py); the time generating is
what the trainer's _generate_and_score_completions takes (the prompts rendered, generate, the completions padded:
what anytrain's `generating` times, less its figures), and of it the student's generate alone; the loss, entropy
and completion length curves are TRL's own logged ones.

What cannot be equal: the samples (anytrain's keyed Gumbel-max noise against torch's generator: the same distribution,
other draws, so a seed gives each trainer its own completions), the order of the prompts (TRL's RepeatSampler
against anytrain's seeded step slots), and on a CPU TRL projects every position of the padded completions through
both output layers (its compaction to the counted tokens is for Triton devices) where anytrain projects the counted
tokens only.
`python trl_distill_job.py --data DIR --model STUDENT --teacher TEACHER --kind full|lora --beta B --seed N --json OUT
--out DIR`"""

import json

import datasets
import distill_job
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DistillationConfig, DistillationTrainer
from trl_run import Clock, StepEnds, lora_config, parser, timed, train_and_save


def config(args) -> DistillationConfig:
    """The job as TRL's DistillationConfig."""
    return DistillationConfig(
        output_dir=str(args.out), per_device_train_batch_size=distill_job.PROMPTS, gradient_accumulation_steps=1,
        max_completion_length=distill_job.MAX_NEW_TOKENS, temperature=distill_job.TEMPERATURE, top_p=1.0, top_k=0,
        beta=args.beta, max_steps=args.steps, learning_rate=distill_job.LR[args.kind], lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, logging_steps=1, save_strategy="no", eval_strategy="no",
        report_to="none", seed=args.seed, bf16=False, gradient_checkpointing=False, use_cpu=True, use_vllm=False,
        dataloader_num_workers=0, disable_tqdm=True, log_completions=False,
    )  # fmt: skip


def main() -> None:
    p = parser(("full", "lora"))
    p.add_argument("--teacher", required=True)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=distill_job.STEPS)
    args = p.parse_args()
    train = datasets.load_dataset("json", data_files=str(args.data / "train.jsonl"), split="train")
    peft_config = lora_config(distill_job.LORA_R, distill_job.LORA_ALPHA) if args.kind == "lora" else None
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ends = StepEnds()
    trainer = DistillationTrainer(
        model=model, teacher_model=args.teacher, args=config(args), train_dataset=train, processing_class=tokenizer,
        peft_config=peft_config, callbacks=[Clock(), ends],
    )  # fmt: skip
    seconds = {"rollout": 0.0, "generate": 0.0}
    trainer._generate_and_score_completions = timed(seconds, "rollout", trainer._generate_and_score_completions)
    trainer.model.generate = timed(seconds, "generate", trainer.model.generate)
    train_and_save(trainer, tokenizer, args, args.kind == "lora")
    result = json.loads(args.json.read_text())
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    steps = [b - a for a, b in zip(ends.marks, ends.marks[1:])]
    result.update(losses=[entry["loss"] for entry in logged], entropies=[entry.get("entropy") for entry in logged])
    result["lengths"] = [entry["completions/mean_length"] for entry in logged]  # each step's mean completion
    result.update(rollout_s=seconds["rollout"], generate_s=seconds["generate"], step_seconds=steps)
    args.json.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
