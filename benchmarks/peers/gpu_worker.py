"""One worker process of scripts/gpu_truth.py's peers and offers steps: the jobs of its --jobs file in turn, each one's
figures written to --out/<id>.json as it ends (benchmarks/gpu_peers.py reads them).

A job is anytrain's (gpu_anytrain.py: the loop src/train.py runs, under this process's `accelerate launch` config),
TRL's (gpu_trl.py) or the rollout's generate (gpu_generate.py). Several jobs share the process, as their starts would
otherwise take most of a GPU session: before each one the memory of the last is freed and CUDA's peak counter reset,
and its peak is what it allocated above what was left. A job that raises is recorded failed and the next one runs; one
that kills the process (a CUDA fault) is recorded failed by the next worker started on the same file, which skips it
and every job already done. A job whose estimate no longer fits before --deadline (a Unix time) is skipped, said so.
`python gpu_worker.py --jobs FILE --out DIR --deadline T` (anytrain's jobs under `accelerate launch`)."""

from __future__ import annotations

import argparse
import gc
import json
import time
import traceback
from pathlib import Path


def device_facts() -> dict:
    """The device the jobs run on, its peak for the MFU (anytrain/flops.py's: a GPU's data sheet, a CPU measured)
    and the versions."""
    import accelerate
    import torch
    import transformers

    from anytrain.flops import peak_flops

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    peak, source = peak_flops(device, "bf16" if cuda else "fp32", 0.0)
    versions = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
    }
    try:
        import trl

        versions["trl"] = trl.__version__
    except ImportError:
        pass
    name = torch.cuda.get_device_name(0) if cuda else "CPU"
    return {"device": name, "cuda": cuda, "peak_tflops": (peak or 0.0) / 1e12, "peak_from": source, **versions}


def fresh_memory() -> int:
    """Free what earlier jobs left, reset CUDA's peak: the bytes still allocated (0 without CUDA)."""
    import torch

    gc.collect()
    if not torch.cuda.is_available():
        return 0
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def peak_memory(left: int) -> int:
    """This job's peak: CUDA's peak allocated above what was left before it; on a CPU the process's peak RSS."""
    import torch

    from anytrain.outputs import process_peak_rss

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() - left
    return process_peak_rss()


def run_job(job: dict) -> dict:
    """The job's figures (its module's), with its memory peak."""
    if job["trainer"] == "anytrain":
        import gpu_anytrain as runner
    elif job["trainer"] == "trl":
        import gpu_trl as runner
    else:
        import gpu_generate as runner
    left = fresh_memory()
    figures = runner.run(job)
    figures.setdefault("peak_memory_bytes", peak_memory(left))
    return {**figures, "left_bytes": left}


def one(job: dict, out: Path, deadline: float, facts: dict) -> None:
    """Run a job unless done, started before (the process died in it) or out of time; its result file either way."""
    done, started = out / f"{job['id']}.json", out / f"{job['id']}.started"
    if done.exists():
        return
    result = {"id": job["id"], **facts}
    if started.exists():
        result.update(status="failed", error="the worker process died during this job (see its log)")
    elif time.time() + job["seconds"] > deadline:
        result.update(status="skipped", error=f"no time left (estimate {job['seconds']:.0f} s)")
    else:
        started.touch()
        start = time.perf_counter()
        try:
            result.update({"status": "ran", **run_job(job)})  # a job may say it skipped
        except Exception as e:  # noqa: BLE001 - recorded; the next job runs
            traceback.print_exc()
            result.update(status="failed", error=f"{type(e).__name__}: {e}"[-1500:])
        result["wall_s"] = time.perf_counter() - start
    done.write_text(json.dumps(result, indent=1, default=str))
    print(f"gpu_worker: {job['id']}: {result['status']} {result.get('error', '')}", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=Path, required=True, help="a JSON list of jobs (benchmarks/gpu_peers.py writes it)")
    p.add_argument("--out", type=Path, required=True, help="a folder for each job's <id>.json")
    p.add_argument("--deadline", type=float, default=float("inf"), help="Unix time: later jobs are skipped")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    facts = device_facts()
    for job in json.loads(args.jobs.read_text()):
        one(job, args.out, args.deadline, facts)


if __name__ == "__main__":
    main()
