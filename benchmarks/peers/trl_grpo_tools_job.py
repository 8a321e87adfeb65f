"""The tool-use job (grpo_tools_job.py) through TRL's GRPOTrainer(tools=[add]), written as TRL's docs show; its
defaults that differ from the job set to it (bf16 and gradient checkpointing off, LR constant). Loop time, the
rollout's time (_generate_and_score_completions: generate, the tool calls, the rewards) and each step's seconds as
trl_grpo_job.py times them; the reward and tool-call curves are TRL's own logged `reward` and
`tools/call_frequency` of each step.
`python trl_grpo_tools_job.py --data DIR --model FOLDER --kind full --seed N --json OUT --out DIR`"""

import importlib.util
import json

import datasets
import grpo_tools_job as job
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer
from trl_grpo_job import StepEnds, timed
from trl_run import Clock, parser, train_and_save

from anytrain.data.sums import add


def module(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def main() -> None:
    args = parser(("full",)).parse_args()
    train = datasets.load_dataset("json", data_files=str(args.data / "train.jsonl"), split="train")
    rewards = module(args.data / "rewards.py")
    config = GRPOConfig(
        output_dir=str(args.out), per_device_train_batch_size=job.PROMPTS * job.GENERATIONS,
        num_generations=job.GENERATIONS, steps_per_generation=1, gradient_accumulation_steps=1,
        max_completion_length=job.ALL_TOKENS, max_tool_calling_iterations=job.MAX_CALLS, temperature=1.0, top_p=1.0,
        top_k=0, num_iterations=1, beta=0.0, loss_type="dapo", scale_rewards="group", mask_truncated_completions=False,
        max_steps=job.STEPS, learning_rate=job.LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none", seed=args.seed,
        bf16=False, gradient_checkpointing=False, use_cpu=True, use_vllm=False, dataloader_num_workers=0,
        disable_tqdm=True, log_completions=False,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ends = StepEnds()
    trainer = GRPOTrainer(
        model=model, reward_funcs=[rewards.right, rewards.called], args=config, train_dataset=train,
        processing_class=tokenizer, tools=[add], callbacks=[Clock(), ends],
    )  # fmt: skip
    seconds = {"rollout": 0.0, "generate": 0.0}
    trainer._generate_and_score_completions = timed(seconds, "rollout", trainer._generate_and_score_completions)
    trainer.model.generate = timed(seconds, "generate", trainer.model.generate)
    train_and_save(trainer, tokenizer, args, False)
    result = json.loads(args.json.read_text())
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    steps = [b - a for a, b in zip(ends.marks, ends.marks[1:])]
    result.update(rewards=[e["reward"] for e in logged], calls=[e.get("tools/call_frequency") for e in logged],
                  rights=[e.get("rewards/right/mean") for e in logged], rollout_s=seconds["rollout"],
                  generate_s=seconds["generate"], step_seconds=steps)  # fmt: skip
    args.json.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
