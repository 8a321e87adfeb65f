"""The text job (text_job.py) through the Hugging Face Trainer, written as its fine-tuning docs show: the
model and tokenizer from the folder, `datasets.map` to tokenise, DataCollatorWithPadding, TrainingArguments
with an evaluation and a checkpoint at every epoch end, then `evaluate` on test. Start-up is this script's
first import to the end of the first optimizer step (a TrainerCallback).
`python hf_trainer_text_job.py --data DIR --model FOLDER --json OUT --out DIR`"""

import time

import job  # first: it notes the process's start

# isort: split

import argparse

import datasets
import numpy as np
import text_job as tj
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class FirstStep(TrainerCallback):
    """When the first optimizer step ends (perf_counter)."""

    at = None

    def on_step_end(self, args, state, control, **kwargs):
        if FirstStep.at is None:
            FirstStep.at = time.perf_counter()


def accuracy(prediction) -> dict:
    return {"accuracy": float((np.argmax(prediction.predictions, 1) == prediction.label_ids).mean())}


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("--data", "--model", "--json", "--out"):
        p.add_argument(name, required=True)
    args = p.parse_args()
    torch.set_flush_denormal(True)
    datasets.disable_progress_bars()
    files = {s: f"{args.data}/{s}.parquet" for s in ("train", "validation", "test")}
    raw = datasets.load_dataset("parquet", data_files=files)
    names = sorted(set(raw["train"][tj.LABEL]))
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    def tokenise(batch):
        encoded = tokenizer(batch[tj.TEXT], truncation=True, max_length=tj.MAX_LENGTH)
        return {**encoded, "labels": [names.index(s) for s in batch[tj.LABEL]]}

    data = raw.map(tokenise, batched=True, remove_columns=raw["train"].column_names)
    labels = dict(num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: k for k, n in enumerate(names)})
    model = AutoModelForSequenceClassification.from_pretrained(args.model, **labels, ignore_mismatched_sizes=True)
    batch = dict(per_device_train_batch_size=tj.BATCH, per_device_eval_batch_size=tj.BATCH, dataloader_num_workers=0)
    recipe = dict(num_train_epochs=tj.EPOCHS, learning_rate=tj.LR, lr_scheduler_type="constant", warmup_steps=0)
    recipe.update(weight_decay=tj.WEIGHT_DECAY, max_grad_norm=tj.MAX_GRAD_NORM, optim="adamw_torch_fused")
    every_epoch = dict(eval_strategy="epoch", save_strategy="epoch", save_total_limit=2)
    logs = dict(logging_steps=tj.LOG_EVERY, report_to="none", disable_tqdm=True)
    training_args = TrainingArguments(
        output_dir=args.out, use_cpu=True, seed=tj.SEED, **batch, **recipe, **every_epoch, **logs
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data["validation"],
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=accuracy,
        callbacks=[FirstStep()],
    )
    loop_start = time.perf_counter()
    trainer.train()
    loop_s = time.perf_counter() - loop_start
    val_acc = [r["eval_accuracy"] for r in trainer.state.log_history if "eval_accuracy" in r][-1]
    test = trainer.evaluate(data["test"], metric_key_prefix="test")
    startup = FirstStep.at - job.T0
    job.write_result(
        args.json,
        loop_start,
        loop_s,
        trainer.state.global_step,
        val_acc,
        test["test_accuracy"],
        start_to_first_step_s=startup,
    )


if __name__ == "__main__":
    main()
