"""The chat job (sft_job.py) through TRL's SFTTrainer, written as TRL's docs show: the dataset from its
jsonl, SFTConfig, a peft LoraConfig for the LoRA variant; TRL's defaults that differ from the job are set
to the job (bf16 off, gradient checkpointing off). Loop time is the start of training to the end of its last
optimizer step (a TrainerCallback); peak memory the process's own maximum resident set
(anytrain.outputs.process_peak_rss); the model is saved
(LoRA: merged) for the shared scoring.
`python trl_sft_job.py --data DIR --model FOLDER --kind full|lora --seed N [--max-steps N] --json OUT --out DIR`"""

import argparse
import json
import time
from pathlib import Path

import datasets
import sft_job
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import SFTConfig, SFTTrainer

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
    p.add_argument("--kind", choices=("full", "lora"), required=True)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max-steps", type=int, default=-1)
    args = p.parse_args()
    train = datasets.load_dataset("json", data_files=str(args.data / "train.jsonl"), split="train")
    config = SFTConfig(
        output_dir=str(args.out), per_device_train_batch_size=sft_job.BATCH, num_train_epochs=sft_job.EPOCHS,
        learning_rate=sft_job.LR[args.kind], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, logging_steps=sft_job.LOG_EVERY, save_strategy="no", eval_strategy="no", report_to="none",
        max_length=sft_job.MAX_LENGTH, packing=False, completion_only_loss=True, seed=args.seed,
        bf16=False, gradient_checkpointing=False, dataloader_num_workers=0, disable_tqdm=True, max_steps=args.max_steps,
    )  # fmt: skip
    peft_config = None
    if args.kind == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=sft_job.LORA_R, lora_alpha=sft_job.LORA_ALPHA, lora_dropout=0.0, target_modules="all-linear"
        )
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=train, processing_class=tokenizer, peft_config=peft_config,
        callbacks=[Clock()],
    )  # fmt: skip
    trainer.train()
    peak = process_peak_rss()
    trainable = sum(q.numel() for q in trainer.model.parameters() if q.requires_grad)
    final = trainer.model.merge_and_unload() if args.kind == "lora" else trainer.model
    final.save_pretrained(args.out / "final")
    tokenizer.save_pretrained(args.out / "final")
    result = {"loop_s": Clock.ended - Clock.begun, "steps": Clock.steps, "peak_memory_bytes": peak}
    args.json.write_text(json.dumps({**result, "trainable_parameters": trainable, "model": str(args.out / "final")}))


if __name__ == "__main__":
    main()
