"""How well a run used its hardware: the model's training FLOPs per token or per sample, the FLOP rate the run
achieved, and its model FLOPs utilisation (MFU), the rate over the devices' peak (summary.json and the last line).

Training FLOPs (the forward and backward matrix products; the PaLM paper's appendix B, as nanoGPT and torchtitan
count them):
    a transformer (the registry's GPT, a transformers model)  per token: 6 x its parameters without the embeddings
        (2 FLOPs per weight forward, 4 backward) + 12 x layers x width x context (attention's scores and their
        weighting of the values, forward and backward), the context the run's block or --max-length
    any other model (an MLP, a CNN, your own)  per sample: 3 x a counted forward pass of one sample
        (torch.utils.flop_counter on the data's example inputs; the backward costs twice the forward)
LoRA and frozen weights are counted as trained (the convention: MFU is the model's FLOPs, not the optimizer's).

Peak: a GPU's dense peak from a table by its name and the run's precision (fp32 without TF32, or bf16/fp16 tensor
cores); a CPU's measured with square matrix products in the run's precision: of the largest size up to 1,024 whose
product takes ~25 ms on the run's threads (sizes tried on one thread), the fastest of 5 or more (0.1 s of them)
timed on those threads after a warm-up, as a product slowed by whatever else runs must not lower it (and never
below one thread's rate); or --peak-tflops. MFU = achieved / (peak x processes).
A CPU's peak is kept per machine, so that later runs read the same peak and their MFUs compare: in cpu_peak.json
under $ANYTRAIN_CACHE_DIR (else $XDG_CACHE_HOME/anytrain, else ~/.cache/anytrain), by the CPU's name, the
precision, the thread count and torch's version (delete the file to measure anew); and once per process besides.
A corrupt or unwritable file is measured anew, never an error; a peak measured while other processes kept busy the
cores the run needs (or on several threads no faster than one) serves that run only. peak_from says which products,
when and where the peak is kept, or why it is not.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import math
import os
import platform
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch
from torch import nn

# Dense (no sparsity) peak TFLOP/s by device name fragment, most specific first: (fp32 without TF32, bf16/fp16
# tensor cores). Vendor data sheets.
GPU_PEAKS = {
    "H200": (67.0, 989.0), "H100 SXM": (67.0, 989.0), "H100 80GB HBM3": (67.0, 989.0), "H100 NVL": (60.0, 835.0),
    "H100 PCIe": (51.0, 756.0), "H100": (67.0, 989.0), "A100": (19.5, 312.0), "L40S": (91.6, 362.0),
    "L4": (30.3, 121.0), "A10G": (31.2, 70.0), "A10": (31.2, 125.0), "V100": (15.7, 125.0), "T4": (8.1, 65.0),
    "RTX 4090": (82.6, 165.0), "RTX 3090": (35.6, 71.0),
}  # fmt: skip


def gpu_peak(name: str) -> tuple[float, float] | None:
    """(fp32, bf16) dense peak TFLOP/s of the GPU called `name`, None when it is not in the table."""
    return next((peak for key, peak in GPU_PEAKS.items() if key.lower() in name.lower()), None)


def transformer_flops(parameters: int, layers: int, width: int, context: int) -> int:
    """Training FLOPs per token of a transformer: 6 N + 12 L d T (N without the embeddings)."""
    return 6 * parameters + 12 * layers * width * context


def embedding_parameters(model: nn.Module) -> int:
    """The parameters of the embedding tables (a lookup costs no matrix product), each table counted once."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if isinstance(module, nn.Embedding) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            total += module.weight.numel()
    return total


def per_token(model: nn.Module, context: int) -> tuple[int, str] | None:
    """(FLOPs per token, how) for a transformer: the registry's GPT (its own count) or a transformers model (its
    config's layers and width); None for any other model."""
    own = getattr(model, "flops_per_token", None)
    if callable(own):
        return int(cast(Any, own)()), "6N + 12 L d T (gpt.py)"
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    width = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    if not layers or not width:
        return None
    parameters = sum(p.numel() for p in model.parameters()) - embedding_parameters(model)
    if getattr(model, "get_output_embeddings", None) and (head := cast(Any, model).get_output_embeddings()) is not None:
        if id(head.weight) in {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}:
            parameters += head.weight.numel()  # a tied output layer is a matrix product all the same
    return transformer_flops(parameters, int(layers), int(width), context), "6N + 12 L d T (the model's config)"


def per_sample(model: nn.Module, inputs) -> tuple[int, str]:
    """(FLOPs per sample, how): 3 x one sample's forward pass, counted (eval mode, no gradients)."""
    from torch.utils.flop_counter import FlopCounterMode

    was_training = model.training
    model.eval()
    counter = FlopCounterMode(display=False)
    try:
        with torch.no_grad(), counter:
            model(**inputs) if isinstance(inputs, dict) else model(inputs)
    finally:
        model.train(was_training)
    rows = len(next(iter(inputs.values()))) if isinstance(inputs, dict) else len(inputs)
    return 3 * counter.get_total_flops() // rows, "3 x a counted forward pass"


# A CPU's peak is the fastest of at least this many timed products, over at least this many seconds (after the
# products that chose their size): ~0.13 s in fp32 on an idle 2-core AVX2 machine.
REPEATS, SECONDS = 5, 0.1


def product_seconds(a: torch.Tensor) -> float:
    """The seconds one product a @ a takes (what the fakes of tests/test_flops.py replace)."""
    start = time.perf_counter()
    torch.mm(a, a)
    return time.perf_counter() - start


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to `count` meanwhile."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def product_size(dtype: torch.dtype, threads: int, largest: int) -> tuple[int, float]:
    """(size, seconds): the largest square product up to `largest` in `dtype` whose one product on `threads` threads
    would take ~25 ms at most, judged on one thread (this process's current threads), and the fastest of two at that
    size. On one thread, as a product that several threads share would wait on another process's work: a 128 one
    took 16 ms on two threads beside one busy core (0.07 ms alone), and the size stopped there."""
    size, a = 128, torch.full((128, 128), 0.5, dtype=dtype)
    took = min(product_seconds(a), product_seconds(a))  # the first product warms up
    while size < largest and took * 8 / threads <= 0.025:  # the next size does 8 times the work
        size, a = size * 2, torch.full((size * 2, size * 2), 0.5, dtype=dtype)
        took = min(product_seconds(a), product_seconds(a))
    return size, took


class Measured(NamedTuple):
    """A CPU's peak as measured: FLOP/s, the products' size and count, and whether several threads beat one (on one
    thread: True; False: they waited on other work, or the machine's threads share a core)."""

    flops: float
    size: int
    products: int
    scaled: bool


def measure_peak(dtype: torch.dtype, threads: int, seconds: float = SECONDS, largest: int = 1024) -> Measured:
    """The peak on `threads` threads: the fastest of REPEATS or more square matrix products in `dtype` (as many as
    take `seconds`), after one that warms several threads up, of the size product_size chooses (a CPU without
    native bf16, AVX2, takes 3 s for one 1,024 product in bf16, and is no faster at that size: 0.7 against 1.9
    GFLOP/s at 256). The fastest, as another process's work only ever slows a product down; and never below the
    one thread's rate, which any number of threads can match."""
    with torch_threads(1):
        size, alone = product_size(dtype, threads, largest)
    a = torch.full((size, size), 0.5, dtype=dtype)
    with torch_threads(threads):
        if threads > 1:
            product_seconds(a)  # warms the threads up (one thread's are warm: it chose the size)
        times = [product_seconds(a)]
        while len(times) < REPEATS or sum(times) < seconds and len(times) < 1000:
            times.append(product_seconds(a))
    return Measured(2 * size**3 / min(*times, alone), size, len(times), threads == 1 or min(times) < alone)


def machine_busy() -> float | None:
    """The CPU seconds this whole machine has been busy (Linux's /proc/stat, a VM's stolen time included), None
    where unknown."""
    try:
        ticks = [int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def measured_beside(dtype: torch.dtype, threads: int) -> tuple[Measured, float | None]:
    """measure_peak's peak, and how many cores other processes kept busy meanwhile, on average
    (None: unknown)."""
    wall, machine, own = time.perf_counter(), machine_busy(), time.process_time()
    measured = measure_peak(dtype, threads)
    wall, after = time.perf_counter() - wall, machine_busy()
    if machine is None or after is None:
        return measured, None
    return measured, max(0.0, after - machine - (time.process_time() - own)) / wall


def disturbed(others: float | None, threads: int, cores: int | None = None) -> bool:
    """Whether other processes kept busy more of the machine's cores than the run's threads leave free, with half a
    core's slack (None: unknown, taken as quiet)."""
    return others is not None and others > max(0, (cores or os.cpu_count() or 1) - threads) + 0.5


class CpuPeak(NamedTuple):
    """A CPU's measured peak: FLOP/s, the products' size and count, and where it is kept ("cached DAY in FILE", or
    "not cached: why")."""

    flops: float
    size: int
    products: int
    where: str


def cache_file() -> Path:
    """cpu_peak.json in $ANYTRAIN_CACHE_DIR, else in $XDG_CACHE_HOME/anytrain, else in ~/.cache/anytrain."""
    folder = os.environ.get("ANYTRAIN_CACHE_DIR")
    if not folder:
        folder = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "anytrain")
    return Path(folder).expanduser() / "cpu_peak.json"


def cpu_name() -> str:
    """The CPU's model name with its family, model and stepping (Linux's /proc/cpuinfo: a cloud's "AMD EPYC" names
    several generations), else what platform says."""
    try:
        fields = dict(
            (key.strip(), value.strip())
            for key, _, value in (line.partition(":") for line in Path("/proc/cpuinfo").read_text().splitlines())
            if value
        )
    except (OSError, ValueError):
        fields = {}
    name = fields.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    numbers = [f"{key} {fields[key]}" for key in ("cpu family", "model", "stepping") if key in fields]
    return f"{name} ({', '.join(numbers)})" if numbers else name


def read_kept(path: Path, key: str) -> tuple[dict, dict | None]:
    """The file's entries ({} where it is missing or corrupt) and the one under `key` (None: none usable)."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, None
    if not isinstance(entries, dict):
        return {}, None
    entry = entries.get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("day"), str):
        return entries, None
    try:
        usable = 0 < float(entry["flops"]) < math.inf and int(entry["size"]) > 0 and int(entry["products"]) > 0
    except (TypeError, KeyError, ValueError):
        usable = False
    return entries, entry if usable else None


def write_kept(path: Path, entries: dict) -> str:
    """Writes the entries atomically (a temporary file beside it, then renamed): "" once written, else why not."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".cpu_peak.", suffix=".json")
    except OSError as error:
        return f"cannot write {shown(path)} ({error.strerror or error})"
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(entries, out, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        return f"cannot write {shown(path)} ({error.strerror or error})"
    return ""


def shown(path: Path) -> str:
    """The path with the home folder as ~."""
    home = str(Path.home())
    return "~" + str(path)[len(home) :] if str(path).startswith(home + os.sep) else str(path)


def measured_and_kept(dtype: torch.dtype, threads: int, path: Path, key: str, entries: dict) -> CpuPeak:
    """The peak measured (measure_peak), and kept in the file under `key` beside its other entries unless other
    processes' work disturbed it (busy cores, or several threads no faster than one: such a peak is theirs to
    lower, and the next run measures again)."""
    measured, others = measured_beside(dtype, threads)
    why_not = "" if measured.scaled else f"{threads} threads were no faster than one (other work meanwhile?)"
    if disturbed(others, threads):
        why_not = f"other processes kept {others:.1f} cores busy meanwhile"
    day = datetime.date.today().isoformat()
    if not why_not:
        entry = {"flops": measured.flops, "size": measured.size, "products": measured.products, "day": day}
        why_not = write_kept(path, {**entries, key: entry})
    where = f"not cached: {why_not}" if why_not else f"cached {day} in {shown(path)}"
    return CpuPeak(measured.flops, measured.size, measured.products, where)


@functools.cache
def cpu_peak(dtype: torch.dtype, threads: int) -> CpuPeak:
    """This CPU's peak in `dtype` on `threads` threads: the one kept in cpu_peak.json for this CPU, precision, thread
    count and torch version, else measured and kept there (measured_and_kept); once per process."""
    path, key = cache_file(), f"{cpu_name()} | {dtype} | {threads} thread(s) | torch {torch.__version__}"
    entries, entry = read_kept(path, key)
    if entry is None:
        return measured_and_kept(dtype, threads, path, key, entries)
    where = f"cached {entry['day']} in {shown(path)}"
    return CpuPeak(float(entry["flops"]), int(entry["size"]), int(entry["products"]), where)


def peak_flops(device: torch.device, precision: str, given_tflops: float) -> tuple[float | None, str]:
    """One device's peak FLOP/s for the run's precision, and where it comes from (None: unknown)."""
    if given_tflops > 0:
        return given_tflops * 1e12, "--peak-tflops"
    half = precision in ("bf16", "fp16")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peaks = gpu_peak(name)
        if peaks is None:
            return None, f"{name} is not in the table of GPU peaks: give --peak-tflops"
        return peaks[1 if half else 0] * 1e12, f"{name}, dense {'bf16/fp16' if half else 'fp32'} (data sheet)"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    threads = torch.get_num_threads()
    peak = cpu_peak(dtype, threads)
    products = f"{peak.size}x{peak.size} {str(dtype).removeprefix('torch.')} products on {threads} thread(s)"
    return peak.flops, f"measured: best of {peak.products} {products}, {peak.where}"


def utilisation(model: nn.Module, shape, context: float, rates: dict, processes: int, device, precision: str,
                given_tflops: float) -> dict:  # fmt: skip
    """summary.json's figures: FLOPs per token (a transformer whose run counts tokens) or per sample, the FLOP rate
    achieved over the whole run (every process's), the peak and the MFU."""
    token = per_token(model, max(1, round(context))) if rates.get("tokens_per_s") else None
    if token is not None:
        (flops, how), unit, rate = token, "token", rates["tokens_per_s"]
    else:
        inputs = shape.example_inputs(1)
        on_device = {k: v.to(device) for k, v in inputs.items()} if isinstance(inputs, dict) else inputs.to(device)
        (flops, how), unit, rate = per_sample(model, on_device), "sample", rates.get("samples_per_s")
    achieved = flops * rate if rate else None
    peak, source = peak_flops(device, precision, given_tflops)
    mfu = achieved / (peak * processes) if achieved and peak else None
    return {
        f"flops_per_{unit}": flops, "flops_counted_as": how, "achieved_tflops": achieved and achieved / 1e12,
        "peak_tflops": peak and peak / 1e12, "peak_from": source, "mfu": mfu,
    }  # fmt: skip


def said(figures: dict) -> str:
    """The last line's words: ", MFU 12.3 % (0.41 of 3.3 TFLOP/s)", or nothing where unknown."""
    if figures.get("mfu") is None:
        return ""
    total = figures["achieved_tflops"] / figures["mfu"]  # every process's peak
    return f", MFU {100 * figures['mfu']:.1f} % ({figures['achieved_tflops']:.3g} of {total:.3g} TFLOP/s)"
