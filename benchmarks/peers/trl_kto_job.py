"""The unpaired preference job (kto_job.py) through TRL 1.16's KTOTrainer, written as TRL's docs show: the dataset from
its jsonl, KTOConfig, a peft LoraConfig for LoRA; TRL's defaults that differ from the job are set to the job (bf16 off,
gradient checkpointing off, constant LR, the job's LR rather than KTOConfig's 1e-6); its sequential sampling (which
its KL pairs need) is left as it is. The reference is TRL's default: a second copy of the model held in memory and
run on every batch (full fine-tuning), the model with its adapter off (LoRA), or with --precompute the reference
log-probabilities computed before training (precompute_ref_log_probs). Loop time, peak memory and the saved model as
the other TRL jobs (trl_run.py).
`python trl_kto_job.py --data DIR --model FOLDER --kind kto [--lora] [--precompute] --seed N --json OUT --out DIR`
"""

import datasets
import kto_job
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl_run import Clock, lora_config, parser, train_and_save


def main() -> None:
    p = parser(("kto",))
    p.add_argument("--lora", action="store_true")
    p.add_argument("--precompute", action="store_true", help="precompute_ref_log_probs")
    args = p.parse_args()
    train = datasets.load_dataset("json", data_files=str(args.data / "train" / "train.jsonl"), split="train")
    from trl import KTOConfig, KTOTrainer

    config = KTOConfig(
        output_dir=str(args.out), per_device_train_batch_size=kto_job.BATCH, max_steps=kto_job.STEPS,
        learning_rate=kto_job.LR["lora" if args.lora else "full"], lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, logging_steps=kto_job.LOG_EVERY, save_strategy="no", eval_strategy="no",
        report_to="none", max_length=kto_job.MAX_LENGTH, seed=args.seed, bf16=False, gradient_checkpointing=False,
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, beta=kto_job.BETA, loss_type="kto",
        desirable_weight=1.0, undesirable_weight=1.0, precompute_ref_log_probs=args.precompute,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    peft_config = lora_config(kto_job.LORA_R, kto_job.LORA_ALPHA) if args.lora else None
    trainer = KTOTrainer(
        model=model, args=config, train_dataset=train, processing_class=tokenizer, peft_config=peft_config,
        callbacks=[Clock()],
    )  # fmt: skip
    train_and_save(trainer, tokenizer, args, args.lora)


if __name__ == "__main__":
    main()
