"""Share of step time spent waiting for data, through the project's own data path.

For each dataset and each DataLoader setting (num_workers, pin_memory, persistent_workers), an
instrumented loop builds the loader with `anytrain.data.make_loader`, passes it (and the model and
optimizer) through `accelerator.prepare` exactly as the trainer does, and times a full training
step; the time spent in `iter()`/`next()` of the loader is the time waiting for data (a new epoch's
`iter()` is where workers start, so it counts). Settings are interleaved over rounds.

    OMP_NUM_THREADS=2 python benchmarks/data_wait.py --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch
from torch import nn

from anytrain.config import parse_config
from anytrain.data import load_splits, make_loader
from anytrain.optim import build_optimizer
from anytrain.scenario import make_accelerator
from anytrain.usermodel import make_model

IMAGES = Path("bench_out") / "images" / "digits32_rgb"  # written on first use (tests/imagedata.py)

DATASETS = {
    # name: (trainer options, timed steps per setting and round)
    "digits (bundled), MLP 64-256-256-10, batch 64": (["--dataset", "digits"], 60),
    "synthetic 100k x 784, MLP 784-1024-1024-10, batch 256": (
        ["--dataset", "synthetic", "--synthetic-samples", "100000", "--synthetic-features", "784",
         "--hidden-sizes", "1024", "1024", "--dropout", "0", "--batch-size", "256"], 30),
    # decoding PNGs, cropping and flipping them is the case where loader workers pay off
    "digits as 32x32 RGB PNGs (imagefolder), ResNet 16-32, crop+flip, batch 64": (
        ["--dataset", str(IMAGES), "--model", "resnet", "--channels", "16", "32", "--blocks-per-stage", "1"], 30),
}
# (num_workers, pin_memory, persistent_workers); the first is the trainer's default.
SETTINGS = [(0, False, False), (0, True, False), (1, False, False), (1, False, True), (2, False, False), (2, True, False), (2, False, True)]


def label(setting) -> str:
    workers, pin, persistent = setting
    return f"workers={workers}" + (", pin_memory" if pin else "") + (", persistent" if persistent else "")


def timed_steps(accelerator, model, optimizer, loader, steps: int, cfg) -> tuple[float, float, int, float, float]:
    """(seconds waiting for data, seconds in all, samples, main-thread CPU seconds in the loader, in all,
    seconds waiting for the first batch)
    over `steps` training steps, epochs wrapping. The CPU-time pair does not see waiting for workers,
    but with workers=0 all data work is on the main thread, and CPU time ignores other load on the machine."""
    criterion = nn.CrossEntropyLoss()
    waiting = samples = waiting_cpu = 0
    done = 0
    first_wait = None  # the first batch of the run: worker start-up, paid once per run with persistent workers
    start, start_cpu = time.perf_counter(), time.thread_time()
    it = None
    while done < steps:
        t, c = time.perf_counter(), time.thread_time()
        if it is None:
            it = iter(loader)
        try:
            inputs, targets = next(it)
        except StopIteration:
            waiting += time.perf_counter() - t
            waiting_cpu += time.thread_time() - c
            it = None
            continue
        waiting += time.perf_counter() - t
        waiting_cpu += time.thread_time() - c
        first_wait = waiting if first_wait is None else first_wait
        loss = criterion(model(inputs), targets)
        accelerator.backward(loss)
        if cfg.max_grad_norm:
            accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        samples += len(targets)
        done += 1
    del it  # stop the workers of an unfinished epoch before the clock stops
    return waiting, time.perf_counter() - start, samples, waiting_cpu, time.thread_time() - start_cpu, first_wait


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", default="", help="run only the datasets whose name contains this text")
    args = p.parse_args(argv)
    if not IMAGES.exists():
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from imagedata import write_imagefolder

        write_imagefolder(IMAGES, size=32, mode="RGB")
    warnings.filterwarnings("ignore", message=".*pin_memory.*")  # no accelerator: pinning is a no-op, said once in the docs
    accelerator = None
    results = []
    for name, (options, steps) in DATASETS.items():
        if args.only not in name:
            continue
        cfg = parse_config(options)
        if accelerator is None:
            accelerator = make_accelerator(cfg)
        data = load_splits(cfg)
        torch.manual_seed(cfg.seed)
        model = make_model(cfg, data.shape())
        optimizer = build_optimizer(cfg, model)
        model, optimizer = accelerator.prepare(model, optimizer)
        model.train()
        rows = {s: [] for s in SETTINGS}
        for r in range(args.rounds):
            order = SETTINGS[r % len(SETTINGS):] + SETTINGS[: r % len(SETTINGS)]  # rotate so no setting always goes first
            for setting in order:
                workers, pin, persistent = setting
                c = dataclasses.replace(cfg, num_workers=workers, pin_memory=pin, persistent_workers=persistent)
                loader = accelerator.prepare(make_loader(data.train, c, shuffle=True))
                rows[setting].append(timed_steps(accelerator, model, optimizer, loader, steps, cfg))
                accelerator._dataloaders.clear()  # prepared loaders are only remembered for checkpointing
                del loader
        for setting, runs in rows.items():
            shares = [w / t for w, t, *_ in runs]
            rates = [n / t for _, t, n, *_ in runs]
            results.append({
                "dataset": name, "setting": label(setting), "num_workers": setting[0], "pin_memory": setting[1],
                "persistent_workers": setting[2], "default": setting == SETTINGS[0], "steps": steps,
                "wait_share": statistics.median(shares), "wait_share_runs": shares,
                "wait_share_cpu": statistics.median(wc / tc for *_, wc, tc, _ in runs),
                "wait_share_after_first_batch": statistics.median((w - f) / (t - f) for w, t, *_, f in runs),
                "samples_per_s": max(rates), "samples_per_s_runs": rates,
                "step_ms": 1000 * statistics.median(t / steps for _, t, *_ in runs),
                "wait_ms_per_step": 1000 * statistics.median(w / steps for w, *_ in runs),
            })
            print(f"{name:55s} {label(setting):32s} wait {100 * results[-1]['wait_share']:5.1f}% (after the first batch {100 * results[-1]['wait_share_after_first_batch']:5.1f}%) "
                  f"{results[-1]['samples_per_s']:9.0f} samples/s", flush=True)
    import os

    Path(args.json).write_text(json.dumps({"rows": results, "threads": torch.get_num_threads(), "cuda": torch.cuda.is_available(),
                                           "load1_end": os.getloadavg()[0]}, indent=1))


if __name__ == "__main__":
    main()
