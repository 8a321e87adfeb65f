"""The limit the trainer is measured against: a plain PyTorch loop over preloaded tensors (docs/benchmarks.md).

    OMP_NUM_THREADS=2 python benchmarks/plain_loop.py --json out.json [--flush-denormal] [trainer options ...]

anytrain's own parser reads the trainer options, so both sides read the same flags; it logs the same step windows
as the trainer's metrics.jsonl. --flush-denormal: torch.set_flush_denormal(True) first, as the trainer does on CPU.
"""

import json
import math
import sys
import time

T0 = time.perf_counter()

import toolkit  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402


def main(argv: list[str]) -> None:
    out = argv[argv.index("--json") + 1]
    argv = [a for i, a in enumerate(argv) if a != "--json" and (i == 0 or argv[i - 1] != "--json")]
    if "--flush-denormal" in argv:
        torch.set_flush_denormal(True)
    cfg, x, y, model, lr_factor = toolkit.plain_job([a for a in argv if a not in ("--no-progress", "--flush-denormal")])
    # weight decay on matrices only, as the trainer does (anytrain.optim.param_groups)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr)
    steps_per_epoch = math.ceil(len(y) / cfg.batch_size)
    total_steps = min(cfg.max_steps or math.inf, cfg.epochs * steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total_steps))
    result = train(cfg, x, y, model, optimizer, scheduler, total_steps)
    result.update(steps_per_epoch=steps_per_epoch, threads=torch.get_num_threads())
    with open(out, "w") as f:
        json.dump(result, f)


def train(cfg, x, y, model, optimizer, scheduler, total_steps) -> dict:
    criterion = nn.CrossEntropyLoss()
    shuffle = torch.Generator().manual_seed(cfg.seed)
    windows = []  # (last step of the window, samples, seconds), like the trainer's metrics.jsonl
    running = torch.zeros(())
    n, bs, step, window_samples, first_step_at = len(y), cfg.batch_size, 0, 0, None
    loop_start = window_start = time.perf_counter()
    model.train()
    while step < total_steps:
        order = torch.randperm(n, generator=shuffle)
        for i in range(0, n, bs):
            index = order[i : i + bs]
            inputs, targets = x[index], y[index]
            outputs = model(inputs)
            loss = criterion(outputs, targets)
            loss.backward()
            if cfg.max_grad_norm:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
            running += loss.detach()
            step += 1
            window_samples += len(targets)
            if first_step_at is None:
                first_step_at, first_step_unix = time.perf_counter(), time.time()
            if step % cfg.log_every_steps == 0:
                mean_loss = running.item() / cfg.log_every_steps  # what a tutorial loop prints
                now = time.perf_counter()
                windows.append((step, window_samples, now - window_start))
                running.zero_()
                window_samples, window_start = 0, now
            if step >= total_steps:
                break
    return {
        "windows": windows,
        "steps": step,
        "train_seconds": time.perf_counter() - loop_start,
        "samples_per_s": sum(w[1] for w in windows) / sum(w[2] for w in windows) if windows else None,
        "import_to_first_step_s": first_step_at - T0,
        "first_step_unix": first_step_unix,
        "last_loss": mean_loss if windows else None,
    }


if __name__ == "__main__":
    main(sys.argv[1:])
