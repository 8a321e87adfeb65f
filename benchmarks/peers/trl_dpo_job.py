"""The preference job (dpo_job.py) through TRL's DPOTrainer (--kind dpo) or RewardTrainer (--kind reward), written
as TRL's docs show: the dataset from its jsonl, DPOConfig / RewardConfig, a peft LoraConfig for LoRA; TRL's defaults
that differ from the job are set to the job (bf16 off, gradient checkpointing off, constant LR). DPO's reference is
TRL's default: a second copy of the model held in memory and run on every batch (full fine-tuning), the model with
its adapter off (LoRA), or with --precompute the reference log-probabilities computed before training
(precompute_ref_log_probs). Loop time is the start of training to the end of its last optimizer step (a
TrainerCallback); peak memory the process's own maximum resident set (anytrain.outputs.process_peak_rss); the model is
saved (LoRA: merged) for the shared scoring.
`python trl_dpo_job.py --data DIR --model FOLDER --kind dpo|reward [--lora] [--precompute] --seed N --json OUT
--out DIR`
"""

import argparse
import json
import time
from pathlib import Path

import datasets
import dpo_job
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from anytrain.outputs import process_peak_rss


class Clock(TrainerCallback):
    """When training begins and when each optimizer step ends (perf_counter)."""

    begun = ended = None
    steps = 0

    def on_train_begin(self, args, state, control, **kwargs):
        Clock.begun = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        Clock.ended, Clock.steps = time.perf_counter(), Clock.steps + 1


def main() -> None:
    p = argparse.ArgumentParser()
    for flag in ("--data", "--model", "--json", "--out"):
        p.add_argument(flag, required=True, type=Path)
    p.add_argument("--kind", choices=("dpo", "reward"), required=True)
    p.add_argument("--lora", action="store_true")
    p.add_argument("--precompute", action="store_true", help="dpo: precompute_ref_log_probs")
    p.add_argument("--seed", type=int, default=42)
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
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=dpo_job.LORA_R, lora_alpha=dpo_job.LORA_ALPHA, lora_dropout=0.0, target_modules="all-linear"
        )
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
    trainer.train()
    peak = process_peak_rss()
    trainable = sum(q.numel() for q in trainer.model.parameters() if q.requires_grad)
    final = trainer.model.merge_and_unload() if args.lora else trainer.model
    final.save_pretrained(args.out / "final")
    tokenizer.save_pretrained(args.out / "final")
    result = {"loop_s": Clock.ended - Clock.begun, "steps": Clock.steps, "peak_memory_bytes": peak}
    args.json.write_text(json.dumps({**result, "trainable_parameters": trainable, "model": str(args.out / "final")}))


if __name__ == "__main__":
    main()
