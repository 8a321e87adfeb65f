"""Peak memory against dataset size: a table 10x larger must not need 10x the memory (docs/benchmarks.md,
"Memory against dataset size"). One epoch of `anytrain train` per parquet table of N and 10N rows, in-memory and
Arrow paths, the process's RssAnon and RssFile sampled every 50 ms from outside.
"""

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import toolkit

FEATURES = 256
CONVERT = "import sys, datasets; datasets.load_dataset('parquet', data_files=sys.argv[1])"  # parquet -> Arrow, once


def write_table(path: Path, rows: int, seed: int = 0) -> None:
    """Rows of 256 float32 features around one of 10 class centres, written in 100k-row groups."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(10, FEATURES)).astype(np.float32)
    writer = None
    for start in range(0, rows, 100_000):
        n = min(100_000, rows - start)
        labels = rng.integers(0, 10, size=n)
        x = centres[labels] + 2.0 * rng.normal(size=(n, FEATURES)).astype(np.float32)
        column = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), FEATURES).cast(pa.list_(pa.float32()))
        table = pa.table({"x": column, "label": labels})
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    writer.close()


def rss(pid: int) -> tuple[int, int]:
    """(RssAnon, RssFile) of a process in bytes; (0, 0) once it is gone."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except (FileNotFoundError, ProcessLookupError):
        return 0, 0
    if "RssAnon" not in fields:  # exited, not yet reaped
        return 0, 0
    return tuple(int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile"))


def peak_of(command: list[str]) -> dict:
    """Run a Python command line, sampling its memory: its peak RssAnon and RssFile (MB) and wall seconds."""
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    proc = subprocess.Popen([toolkit.PY, *command], env=toolkit.run_env(), **pipes)
    peak_anon = peak_file = 0
    started = time.perf_counter()
    while proc.poll() is None:
        anon, file = rss(proc.pid)
        peak_anon, peak_file = max(peak_anon, anon), max(peak_file, file)
        time.sleep(0.05)
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}: {err[-2000:]}")
    seconds = time.perf_counter() - started
    return {"peak_rss_anon_mb": peak_anon / 2**20, "peak_rss_file_mb": peak_file / 2**20, "wall_s": seconds}


def measured_run(table: Path, out: Path, extra: list[str]) -> dict:
    """One epoch of `anytrain train` (its CLI, in a fresh process) on the table, its peak memory sampled."""
    options = "--hidden-sizes 64 --batch-size 1024 --epochs 1 --no-progress --no-plot --overwrite".split()
    cli = "import sys; from anytrain.cli import main; main(sys.argv[1:])"
    figures = peak_of(["-c", cli, "train", "--dataset", str(table), *options, "--output-dir", str(out), *extra])
    s = json.loads((out / "summary.json").read_text())
    figures.update(data_path=s["data_path"], test_accuracy=s["test_accuracy"], samples_per_s=s["samples_per_s"])
    return {**figures, "peak_rss_reported_mb": s["peak_memory_bytes"] / 2**20}


def main(argv=None) -> None:
    p = toolkit.parser(__doc__, json="bench_out/data_memory.json")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--work", default="bench_out/data_memory", help="folder for the tables and run folders")
    args = p.parse_args(argv)
    work = toolkit.out_dir(args.work)
    sizes = {"1x": args.rows, "10x": 10 * args.rows}
    for name, rows in sizes.items():
        path = work / f"table_{name}.parquet"
        if not path.exists():
            write_table(path, rows)
        c = peak_of(["-c", CONVERT, str(path)])  # measured on its own: later runs reuse datasets' Arrow cache
        what = f"parquet -> Arrow cache (datasets, once): peak RssAnon {c['peak_rss_anon_mb']:7.0f} MB"
        print(f"{name:4s} {rows:>9,} rows: {what}, {c['wall_s']:5.1f} s", flush=True)
    arrow, results = ["--max-in-memory-mb", "0"], []
    runs = [("1x", "in-memory", []), ("1x", "arrow", arrow), ("10x", "arrow", arrow)]
    for size, kind, extra in [*runs, ("10x", "in-memory", ["--max-in-memory-mb", "100000"])]:
        row = {"size": size, "rows": sizes[size], "features_mb": sizes[size] * FEATURES * 4 / 2**20, "path": kind}
        row.update(measured_run(work / f"table_{size}.parquet", work / f"run_{size}_{kind}", extra))
        results.append(row)
        peaks = f"peak RssAnon {row['peak_rss_anon_mb']:7.0f} MB, peak RssFile {row['peak_rss_file_mb']:7.0f} MB"
        what = f"{sizes[size]:>9,} rows ({row['features_mb']:7.0f} MB of features), {kind:9s}: {peaks}"
        print(f"{size:4s} {what}, {row['samples_per_s']:9.0f} samples/s, wall {row['wall_s']:5.1f} s", flush=True)
    toolkit.write_json(args.json, {"rows": results, "cpu_count": os.cpu_count()})


if __name__ == "__main__":
    main()
