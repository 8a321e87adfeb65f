"""`anytrain plot RUN_DIR [RUN_DIR ...] [--output PNG]`: training curves of one or more run folders
as a PNG, read from their metrics.jsonl. Needs matplotlib (the `bench` extra), imported only when plotting."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

METRICS = "metrics.jsonl"


def read_metrics(run_dir: Path) -> list[dict]:
    """The JSON objects of `run_dir/metrics.jsonl`, in file order. Blank lines, lines that do not parse
    (the torn last line of a killed run) and lines that are not objects are skipped."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        raise ValueError(f"{run_dir}: no {METRICS} (is this a run folder?)")
    records = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _series(records: list[dict], kind: str, key: str, split: str | None = None) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, sorted by step. A step logged twice (a resumed run appends
    from its checkpoint's step) keeps its last value; records missing the key are left out."""
    by_step: dict[int, float] = {}
    for r in records:
        if r.get("kind") != kind or (split is not None and r.get("split") != split):
            continue
        step, value = r.get("step"), r.get(key)
        if isinstance(step, (int, float)) and isinstance(value, (int, float)) and not isinstance(value, bool):
            by_step[int(step)] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def _labels(run_dirs: list[Path]) -> list[str]:
    """Folder names; parent/name where two runs share a name; the whole path where even that clashes."""
    full = [p.resolve() for p in run_dirs]  # "." and "run" have names and parents once resolved
    names = [p.name for p in full]
    labels = [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in full]
    return [str(p) if labels.count(lab) > 1 else lab for p, lab in zip(full, labels)]


def _read_runs(run_dirs: list[Path]) -> list[list[dict]]:
    if not run_dirs:
        raise ValueError("no run folder given")
    runs = []
    for run_dir in run_dirs:
        records = [r for r in read_metrics(run_dir) if r.get("kind") in ("train", "eval")]
        if not any(isinstance(r.get("step"), (int, float)) for r in records):
            raise ValueError(f"{run_dir}: {METRICS} has no usable training or evaluation lines")
        runs.append(records)
    return runs


def _panels(runs: list[list[dict]]) -> list[tuple[str, str, str]]:
    """(metric key, title, y label) of each panel: loss, accuracy and/or perplexity, learning rate, throughput."""

    def has(kind: str, key: str) -> list[bool]:
        return [bool(_series(records, kind, key, "validation" if kind == "eval" else None)[0]) for records in runs]

    with_ppl, with_acc = has("eval", "perplexity"), has("eval", "accuracy")
    # tokens/s only when every run with throughput has it: samples/s and tokens/s do not share an axis
    with_samples, with_tokens = has("train", "samples_per_s"), has("train", "tokens_per_s")
    tokens = any(with_tokens) and all(t for s, t in zip(with_samples, with_tokens) if s or t)
    rate_key = "tokens_per_s" if tokens else "samples_per_s"
    panels = [("loss", "Loss", "loss")]
    if any(acc and not ppl for acc, ppl in zip(with_acc, with_ppl)) or not any(with_ppl):
        panels.append(("accuracy", "Validation accuracy", "accuracy"))
    if any(with_ppl):
        panels.append(("perplexity", "Validation perplexity", "perplexity"))
    panels.append(("lr", "Learning rate", "learning rate"))
    panels.append((rate_key, "Throughput", rate_key.replace("_per_s", "/s")))
    return panels


def _draw_panel(ax, panel: tuple[str, str, str], runs: list[list[dict]], colors: list[str], labels: list[str]) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    key, title, ylabel = panel
    validation: dict[str, Any] = {"linestyle": "--", "marker": "o", "markersize": 4}
    for records, color, label in zip(runs, colors, labels):
        if key == "loss":
            ax.plot(*_series(records, "train", "loss"), color=color, label=label)
            ax.plot(*_series(records, "eval", "loss", "validation"), color=color, **validation)
        elif key in ("accuracy", "perplexity"):
            ax.plot(*_series(records, "eval", key, "validation"), color=color, label=label, **validation)
        else:
            ax.plot(*_series(records, "train", key), color=color, label=label)
    if key == "lr":
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    if key == "loss":  # which line is which: colour is the run, style is train or validation
        styles = [Line2D([], [], color="gray", label="train")]
        if any(_series(records, "eval", "loss", "validation")[0] for records in runs):  # grpo evaluates no loss
            styles.append(Line2D([], [], color="gray", label="validation", **validation))
        ax.legend(handles=styles, loc="best", fontsize="small")
    if not ax.has_data():
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="gray")
    ax.set_title(title)
    ax.set_xlabel("optimizer step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)


def plot_runs(run_dirs: list[Path], output: Path) -> Path:
    """Write a PNG of the runs' curves against optimizer step and return its path: loss (train solid,
    validation dashed with markers where the task has an evaluation loss), validation accuracy and/or perplexity,
    learning rate, throughput."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    run_dirs = [Path(d) for d in run_dirs]
    runs = _read_runs(run_dirs)
    panels = _panels(runs)
    cols = 2 if len(panels) <= 4 else 3
    fig = Figure(figsize=(6 * cols, 9), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, cols, squeeze=False).ravel()
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    colors, labels = [f"C{i % 10}" for i in range(len(runs))], _labels(run_dirs)
    for ax, panel in zip(axes, panels):
        _draw_panel(ax, panel, runs, colors, labels)
    run_handles = [Line2D([], [], color=c, linewidth=2, label=lab) for c, lab in zip(colors, labels)]
    fig.legend(handles=run_handles, loc="outside lower center", ncols=min(len(runs), 4), frameon=False)
    shown = ", ".join(["loss"] + [ylabel for _, _, ylabel in panels[1:]])
    what = f"run {labels[0]}" if len(runs) == 1 else f"{len(runs)} runs"
    fig.suptitle(f"Training curves of {what} vs optimizer step: {shown}", fontweight="bold")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100)
    return output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="anytrain plot", description="Write a PNG of the training curves of one or more run folders."
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run folder holding metrics.jsonl")
    parser.add_argument(
        "--output",
        "-o",
        type=Path,
        default=None,
        help="PNG to write (default: RUN_DIR/curves.png for one run, ./curves.png for several)",
    )
    args = parser.parse_args(argv)
    output = args.output or (args.run_dirs[0] / "curves.png" if len(args.run_dirs) == 1 else Path("curves.png"))
    for run_dir in args.run_dirs:
        if not run_dir.is_dir():
            parser.exit(2, f"anytrain plot: error: {run_dir}: no such folder\n")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        parser.exit(
            2,
            "anytrain plot: error: matplotlib is not installed: pip install matplotlib (or the 'bench' extra: pip "
            "install 'anytrain[bench]')\n",
        )
    try:
        written = plot_runs(args.run_dirs, output)
    except (ValueError, OSError) as err:
        parser.exit(2, f"anytrain plot: error: {err}\n")
    print(written)


if __name__ == "__main__":
    main(sys.argv[1:])
