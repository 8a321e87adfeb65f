"""The preference job (dpo_job.py) through TRL's DPOTrainer (--kind dpo) or RewardTrainer (--kind reward), written
as TRL's docs show: the dataset from its jsonl, DPOConfig / RewardConfig, a peft LoraConfig for LoRA; TRL's defaults
that differ from the job are set to the job (bf16 off, gradient checkpointing off, constant LR). DPO's reference is
TRL's default: a second copy of the model held in memory and run on every batch (full fine-tuning), the model with
its adapter off (LoRA), or with --precompute the reference log-probabilities computed before training
(precompute_ref_log_probs). Loop time is the start of training to the end of its last optimizer step (a
TrainerCallback); peak memory the process's own maximum resident set (trl_run.py); the model is
saved (LoRA: merged) for the shared scoring.
`python trl_dpo_job.py --data DIR --model FOLDER --kind dpo|reward [--lora] [--precompute] --seed N --json OUT
--out DIR`
"""

import datasets
import dpo_job
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl_run import Clock, lora_config, parser, train_and_save


def main() -> None:
    p = parser(("dpo", "reward"))
    p.add_argument("--lora", action="store_true")
    p.add_argument("--precompute", action="store_true", help="dpo: precompute_ref_log_probs")
    args = p.parse_args()
    train = datasets.load_dataset("json", data_files=str(args.data / "train" / "train.jsonl"), split="train")
    lr = dpo_job.LR["reward" if args.kind == "reward" else "lora" if args.lora else "full"]
    common = dict(
        output_dir=str(args.out), per_device_train_batch_size=dpo_job.BATCH, max_steps=dpo_job.STEPS,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        logging_steps=dpo_job.LOG_EVERY, save_strategy="no", eval_strategy="no", report_to="none",
        max_length=dpo_job.MAX_LENGTH, seed=args.seed, bf16=False, gradient_checkpointing=False, use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    peft_config = lora_config(dpo_job.LORA_R, dpo_job.LORA_ALPHA) if args.lora else None
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if args.kind == "dpo":
        from trl import DPOConfig, DPOTrainer

        config = DPOConfig(**common, beta=dpo_job.BETA, loss_type=["sigmoid"], precompute_ref_log_probs=args.precompute)
        model = AutoModelForCausalLM.from_pretrained(args.model)
        trainer = DPOTrainer(
            model=model, args=config, train_dataset=train, processing_class=tokenizer, peft_config=peft_config,
            callbacks=[Clock()],
        )  # fmt: skip
    else:
        from trl import RewardConfig, RewardTrainer

        config = RewardConfig(**common)
        trainer = RewardTrainer(
            model=str(args.model), args=config, train_dataset=train, processing_class=tokenizer,
            peft_config=peft_config, callbacks=[Clock()],
        )  # fmt: skip
    train_and_save(trainer, tokenizer, args, args.lora)


if __name__ == "__main__":
    main()
