"""Share of step time spent waiting for data, through the project's own data path (docs/benchmarks.md, "Data path"):
per dataset and DataLoader setting, anytrain.data.make_loader's loader through `accelerator.prepare`, full training
steps, the time in the loader's iter()/next() timed; settings interleaved over rounds."""

import os
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import toolkit
import torch
from torch import nn

IMAGES = Path("bench_out") / "images" / "digits32_rgb"  # written on first use (write_digit_images)

SYNTHETIC = "--dataset synthetic --synthetic-samples 100000 --synthetic-features 784 --hidden-sizes 1024 1024"
RESNET = ["--dataset", str(IMAGES), *"--model resnet --channels 16 32 --blocks-per-stage 1".split()]
DATASETS = {  # name: (trainer options, timed steps per setting and round)
    "digits (bundled), MLP 64-256-256-10, batch 64": (["--dataset", "digits"], 60),
    "synthetic 100k x 784, MLP 784-1024-1024-10, batch 256": (f"{SYNTHETIC} --dropout 0 --batch-size 256".split(), 30),
    # decoding PNGs, cropping and flipping them is the case where loader workers pay off
    "digits as 32x32 RGB PNGs (imagefolder), ResNet 16-32, crop+flip, batch 64": (RESNET, 30),
}
# (num_workers, pin_memory, persistent_workers); the first is the trainer's default.
SETTINGS = [(0, False, False), (0, True, False), (1, False, False), (1, False, True)]
SETTINGS += [(2, False, False), (2, True, False), (2, False, True)]


def write_digit_images(folder: Path, size: int = 32, seed: int = 0) -> None:
    """folder/<label>/<i>.png: the bundled digits (0..16) scaled to 0..255, resized to size x size, each
    given a random RGB tint (the images the tests draw, tests/imagedata.py)."""
    import pyarrow.parquet as pq
    from PIL import Image

    table = pq.read_table(toolkit.ROOT / "src" / "anytrain" / "data" / "digits.parquet")
    pixels = table["pixels"].combine_chunks().flatten().to_numpy().reshape(len(table), 8, 8)
    rng = np.random.default_rng(seed)
    for i, (digit, label) in enumerate(zip(pixels, table["label"].to_pylist())):
        gray = (digit.astype(np.float64) * (255 / 16)).round().astype(np.uint8)
        image = np.asarray(Image.fromarray(gray, "L").resize((size, size), Image.Resampling.BILINEAR))
        path = folder / str(label) / f"{i:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray((image[..., None] * rng.uniform(0.3, 1.0, size=3)).round().astype(np.uint8), "RGB").save(path)


def label(setting) -> str:
    workers, pin, persistent = setting
    return f"workers={workers}" + (", pin_memory" if pin else "") + (", persistent" if persistent else "")


def timed_steps(accelerator, model, optimizer, loader, steps: int, max_grad_norm) -> tuple:
    """(seconds waiting for data, seconds in all, samples, main-thread CPU seconds in the loader, in all,
    seconds waiting for the first batch) over `steps` training steps, epochs wrapping. The CPU-time pair
    does not see waiting for workers, but with workers=0 all data work is on the main thread, and CPU
    time ignores other load on the machine."""
    criterion = nn.CrossEntropyLoss()
    waiting = samples = waiting_cpu = done = 0
    first_wait = None  # the first batch of the run: worker start-up, paid once per run with persistent workers
    start, start_cpu, it = time.perf_counter(), time.thread_time(), None
    while done < steps:
        t, c = time.perf_counter(), time.thread_time()
        if it is None:
            it = iter(loader)
        batch = next(it, None)
        waiting += time.perf_counter() - t
        waiting_cpu += time.thread_time() - c
        if batch is None:
            it = None
            continue
        inputs, targets = batch
        first_wait = waiting if first_wait is None else first_wait
        loss = criterion(model(inputs), targets)
        accelerator.backward(loss)
        if max_grad_norm:
            accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        samples += len(targets)
        done += 1
    del it  # stop the workers of an unfinished epoch before the clock stops
    return waiting, time.perf_counter() - start, samples, waiting_cpu, time.thread_time() - start_cpu, first_wait


def row(name: str, setting, steps: int, runs: list[tuple]) -> dict:
    shares = [w / t for w, t, *_ in runs]
    rates = [n / t for _, t, n, *_ in runs]
    return {
        "dataset": name, "setting": label(setting), "num_workers": setting[0], "pin_memory": setting[1],
        "persistent_workers": setting[2], "default": setting == SETTINGS[0], "steps": steps,
        "wait_share": statistics.median(shares), "wait_share_runs": shares,
        "wait_share_cpu": statistics.median(wc / tc for *_, wc, tc, _ in runs),
        "wait_share_after_first_batch": statistics.median((w - f) / (t - f) for w, t, *_, f in runs),
        "samples_per_s": max(rates), "samples_per_s_runs": rates,
        "step_ms": 1000 * statistics.median(t / steps for _, t, *_ in runs),
        "wait_ms_per_step": 1000 * statistics.median(w / steps for w, *_ in runs),
    }  # fmt: skip


def dataset_rows(name: str, options: list[str], steps: int, rounds: int, accelerator) -> tuple[list[dict], object]:
    accelerator, model, optimizer, cfg, loader_of = toolkit.prepared_job(options, accelerator)
    model.train()

    def timed(setting, r: int) -> tuple:
        loader = accelerator.prepare(loader_of(*setting))
        figures = timed_steps(accelerator, model, optimizer, loader, steps, cfg.max_grad_norm)
        accelerator._dataloaders.clear()  # prepared loaders are only remembered for checkpointing
        return figures

    rows = [row(name, setting, steps, r) for setting, r in toolkit.interleave(SETTINGS, rounds, timed).items()]
    for x in rows:
        share, after = 100 * x["wait_share"], 100 * x["wait_share_after_first_batch"]
        wait = f"wait {share:5.1f}% (after the first batch {after:5.1f}%)"
        print(f"{name:55s} {x['setting']:32s} {wait} {x['samples_per_s']:9.0f} samples/s", flush=True)
    return rows, accelerator


def main(argv=None) -> None:
    p = toolkit.parser(__doc__, json="bench_out/data_wait.json", rounds=2)
    p.add_argument("--only", default="", help="run only the datasets whose name contains this text")
    args = p.parse_args(argv)
    if not IMAGES.exists():
        write_digit_images(IMAGES)
    warnings.filterwarnings("ignore", message=".*pin_memory.*")  # no accelerator: pinning is a no-op, said in the docs
    accelerator, results = None, []
    for name, (options, steps) in DATASETS.items():
        if args.only in name:
            rows, accelerator = dataset_rows(name, options, steps, args.rounds, accelerator)
            results += rows
    info = {"threads": torch.get_num_threads(), "cuda": torch.cuda.is_available(), "load1_end": os.getloadavg()[0]}
    toolkit.write_json(args.json, {"rows": results, **info})


if __name__ == "__main__":
    main()
