"""The job through PyTorch Lightning, written as its docs show: a LightningModule, DataLoaders over
TensorDatasets, `Trainer.fit` (its defaults: a checkpoint at every epoch end, the TensorBoard or CSV
logger), then `Trainer.test`. `python lightning_job.py --data DIR --json OUT --out DIR`"""

import time

import job  # first: it notes the process's start

# isort: split

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = nn.functional.cross_entropy(self.net(inputs), targets)
        self.log("train_loss", loss)
        return loss

    def _evaluate(self, batch, split):
        inputs, targets = batch
        logits = self.net(inputs)
        self.log(f"{split}_loss", nn.functional.cross_entropy(logits, targets))
        self.log(f"{split}_accuracy", (logits.argmax(1) == targets).float().mean())

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")

    def configure_optimizers(self):
        return job.optimizer(self.net)


def main() -> None:
    args = job.arguments(out_help="Lightning's default_root_dir (checkpoints, logs)")
    torch.set_flush_denormal(True)
    (x, y), (vx, vy), (tx, ty) = (job.read_split(args.data, s) for s in ("train", "validation", "test"))
    L.seed_everything(job.SEED, verbose=False)
    model = Classifier(job.build_model(x))
    train = DataLoader(TensorDataset(x, y), batch_size=job.BATCH, shuffle=True)
    val = DataLoader(TensorDataset(vx, vy), batch_size=job.BATCH)
    quiet = dict(num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False)
    recipe = dict(max_epochs=job.EPOCHS, gradient_clip_val=job.MAX_GRAD_NORM, log_every_n_steps=job.LOG_EVERY)
    trainer = L.Trainer(accelerator="cpu", devices=1, default_root_dir=args.out, **recipe, **quiet)
    loop_start = time.perf_counter()
    trainer.fit(model, train, val)
    loop_s = time.perf_counter() - loop_start
    val_acc = trainer.callback_metrics["val_accuracy"].item()
    test = trainer.test(model, DataLoader(TensorDataset(tx, ty), batch_size=job.BATCH), verbose=False)[0]
    job.write_result(args.json, loop_start, loop_s, trainer.global_step, val_acc, test["test_accuracy"])


if __name__ == "__main__":
    main()
