"""The chat job (sft_job.py) through TRL's SFTTrainer, written as TRL's docs show: the dataset from its
jsonl, SFTConfig, a peft LoraConfig for the LoRA variant; TRL's defaults that differ from the job are set
to the job (bf16 off, gradient checkpointing off). Loop time is the start of training to the end of its last
optimizer step (a TrainerCallback); peak memory the process's own maximum resident set (trl_run.py); the model
is saved (LoRA: merged) for the shared scoring.
`python trl_sft_job.py --data DIR --model FOLDER --kind full|lora --seed N [--max-steps N] --json OUT --out DIR`"""

import datasets
import sft_job
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer
from trl_run import Clock, lora_config, parser, train_and_save


def main() -> None:
    p = parser(("full", "lora"))
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
    peft_config = lora_config(sft_job.LORA_R, sft_job.LORA_ALPHA) if args.kind == "lora" else None
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=train, processing_class=tokenizer, peft_config=peft_config,
        callbacks=[Clock()],
    )  # fmt: skip
    train_and_save(trainer, tokenizer, args, args.kind == "lora")


if __name__ == "__main__":
    main()
