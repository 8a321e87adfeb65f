"""The job as a hand-written PyTorch loop: preloaded tensors, one fancy-index per batch, no checkpoints
(nothing to resume from: the limit a trainer is measured against). `python plain.py --data DIR --json OUT`"""

import time

import job  # first: it notes the process's start

# isort: split

import torch
from torch import nn


def evaluate(model, x, y):
    model.eval()
    loss, hits = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(y), job.BATCH):
            logits = model(x[i : i + job.BATCH])
            loss += nn.functional.cross_entropy(logits, y[i : i + job.BATCH], reduction="sum").item()
            hits += (logits.argmax(1) == y[i : i + job.BATCH]).sum().item()
    model.train()
    return loss / len(y), hits / len(y)


def main() -> None:
    args = job.arguments()
    torch.set_flush_denormal(True)  # as anytrain does on CPU: same arithmetic
    (x, y), (vx, vy), (tx, ty) = (job.read_split(args.data, s) for s in ("train", "validation", "test"))
    model = job.build_model(x)
    optimizer = job.optimizer(model)
    criterion = nn.CrossEntropyLoss()
    shuffle = torch.Generator().manual_seed(job.SEED)
    step, running, losses = 0, torch.zeros(()), []
    loop_start = time.perf_counter()
    model.train()
    for epoch in range(job.EPOCHS):
        order = torch.randperm(len(y), generator=shuffle)
        for i in range(0, len(y), job.BATCH):
            index = order[i : i + job.BATCH]
            outputs = model(x[index])
            loss = criterion(outputs, y[index])
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), job.MAX_GRAD_NORM)
            optimizer.step()
            running += loss.detach()
            step += 1
            if step % job.LOG_EVERY == 0:
                losses.append(running.item() / job.LOG_EVERY)
                running.zero_()
        val_loss, val_acc = evaluate(model, vx, vy)
        print(f"epoch {epoch}: val_loss {val_loss:.4f}, val_accuracy {val_acc:.4f}", flush=True)
    loop_s = time.perf_counter() - loop_start
    _, test_acc = evaluate(model, tx, ty)
    job.write_result(args.json, loop_start, loop_s, step, val_acc, test_acc, last_loss=losses[-1])


if __name__ == "__main__":
    main()
