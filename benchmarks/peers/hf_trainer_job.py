"""The job through the Hugging Face Trainer, written as its docs show: the data through
`datasets.load_dataset` in torch format, a module that returns the loss when given labels,
TrainingArguments with an evaluation and a checkpoint at every epoch end, then `evaluate` on test.
`python hf_trainer_job.py --data DIR --json OUT --out DIR`"""

import time

import job  # first: it notes the process's start

# isort: split

import datasets
import numpy as np
import torch
from torch import nn
from transformers import Trainer, TrainingArguments


class Classifier(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, features, labels=None):
        logits = self.net(features)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def accuracy(prediction) -> dict:
    return {"accuracy": float((np.argmax(prediction.predictions, 1) == prediction.label_ids).mean())}


def main() -> None:
    args = job.arguments(out_help="the Trainer's output_dir (checkpoints)")
    torch.set_flush_denormal(True)
    datasets.disable_progress_bars()
    files = {s: str(args.data / f"{s}.parquet") for s in job.ROWS}
    data = datasets.load_dataset("parquet", data_files=files).rename_column("label", "labels").with_format("torch")
    features = data["train"][:]["features"]  # the whole column as one tensor
    model = Classifier(job.build_model(features))
    batch = dict(per_device_train_batch_size=job.BATCH, per_device_eval_batch_size=job.BATCH, dataloader_num_workers=0)
    recipe = dict(num_train_epochs=job.EPOCHS, learning_rate=job.LR, lr_scheduler_type="constant", warmup_steps=0)
    recipe.update(weight_decay=job.WEIGHT_DECAY, max_grad_norm=job.MAX_GRAD_NORM, optim="adamw_torch_fused")
    every_epoch = dict(eval_strategy="epoch", save_strategy="epoch", save_total_limit=2)
    logs = dict(logging_steps=job.LOG_EVERY, report_to="none", disable_tqdm=True)
    training_args = TrainingArguments(
        output_dir=args.out, use_cpu=True, seed=job.SEED, **batch, **recipe, **every_epoch, **logs
    )
    data_args = dict(train_dataset=data["train"], eval_dataset=data["validation"], compute_metrics=accuracy)
    trainer = Trainer(model=model, args=training_args, **data_args)
    loop_start = time.perf_counter()
    trainer.train()
    loop_s = time.perf_counter() - loop_start
    val_acc = [r["eval_accuracy"] for r in trainer.state.log_history if "eval_accuracy" in r][-1]
    test = trainer.evaluate(data["test"], metric_key_prefix="test")
    steps, test_acc = trainer.state.global_step, test["test_accuracy"]
    job.write_result(args.json, loop_start, loop_s, steps, val_acc, test_acc)


if __name__ == "__main__":
    main()
