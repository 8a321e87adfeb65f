"""The online-RL job (grpo_job.py) through TRL's GRPOTrainer, written as TRL's docs show: the dataset from its jsonl,
the reward function imported from the job's file, GRPOConfig, a peft LoraConfig for LoRA; TRL's defaults that differ
from the job are set to it (bf16 and gradient checkpointing off, LR constant; loss type, scaling, epsilon, beta,
sampling set explicitly even where they are TRL's defaults). per_device_train_batch_size counts completions (4
prompts x 8), steps_per_generation 1: one generation per optimizer step, as anytrain's rollout. Loop time is the
start of training to the end of its last optimizer step (a TrainerCallback); the time generating is what the
trainer's _generate_and_score_completions takes (the prompts rendered, generate, the completions decoded and scored,
the advantages: what anytrain's `generating` times), and of it the model's generate alone; peak memory the process's
own maximum resident set (trl_run.py); the reward curve is TRL's own logged `reward` of each step; each step's own
seconds from a second TrainerCallback (StepEnds).
`python trl_grpo_job.py --data DIR --model FOLDER --kind full|lora --seed N --json OUT --out DIR`"""

import importlib.util
import json

import datasets
import grpo_job
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer
from trl_run import Clock, StepEnds, lora_config, parser, timed, train_and_save


def reward_function(data):
    spec = importlib.util.spec_from_file_location("rewards", grpo_job.rewards_file(data))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ones


def main() -> None:
    p = parser(("full", "lora"))
    args = p.parse_args()
    train = datasets.load_dataset("json", data_files=str(args.data / "train.jsonl"), split="train")
    config = GRPOConfig(
        output_dir=str(args.out), per_device_train_batch_size=grpo_job.PROMPTS * grpo_job.GENERATIONS,
        num_generations=grpo_job.GENERATIONS, steps_per_generation=1, gradient_accumulation_steps=1,
        max_completion_length=grpo_job.MAX_NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=0, num_iterations=1,
        beta=0.0, loss_type="dapo", scale_rewards="group", epsilon=grpo_job.EPSILON, mask_truncated_completions=False,
        max_steps=grpo_job.STEPS, learning_rate=grpo_job.LR[args.kind], lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, logging_steps=1, save_strategy="no", eval_strategy="no",
        report_to="none", seed=args.seed, bf16=False, gradient_checkpointing=False, use_cpu=True, use_vllm=False,
        dataloader_num_workers=0, disable_tqdm=True, log_completions=False,
    )  # fmt: skip
    peft_config = lora_config(grpo_job.LORA_R, grpo_job.LORA_ALPHA) if args.kind == "lora" else None
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ends = StepEnds()
    trainer = GRPOTrainer(
        model=model, reward_funcs=[reward_function(args.data)], args=config, train_dataset=train,
        processing_class=tokenizer, peft_config=peft_config, callbacks=[Clock(), ends],
    )  # fmt: skip
    seconds = {"rollout": 0.0, "generate": 0.0}
    rollout = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = timed(seconds, "rollout", rollout)
    trainer.model.generate = timed(seconds, "generate", trainer.model.generate)
    train_and_save(trainer, tokenizer, args, args.kind == "lora")
    result = json.loads(args.json.read_text())
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    steps = [b - a for a, b in zip(ends.marks, ends.marks[1:])]
    result.update(rewards=rewards, rollout_s=seconds["rollout"], generate_s=seconds["generate"], step_seconds=steps)
    args.json.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
