"""anytrain's --task grpo --tools side by side with TRL's GRPOTrainer(tools=...) (issue 47): the tool-use job of
peers/grpo_tools_job.py through both, in interleaved rounds (each round its own seed, the same for both). Per
trainer: loop time per optimizer step (the start of training to the end of its last step, no evaluation), the share
spent on rollouts (generate, the tools, the rewards), the process's peak resident memory, and per step each trainer's
own logged mean reward, share of completions whose reply is right, and tool calls per completion.
`python benchmarks/grpo_tools_vs_trl.py --rounds 2` (trl installed: `make install-peers`)."""

import statistics
from pathlib import Path

import toolkit
from peers import grpo_tools_job as job
from toolkit import BENCH, PY, ROOT, TRAIN, Runner, launch_cmd, md_head

VARIANTS = [("anytrain", "anytrain"), ("trl", "trl")]
TIMEOUT = 1200


def anytrain_run(runner: Runner, seed: int, data: Path, model: Path) -> dict:
    d = runner.fresh("tools-anytrain")
    args = ["--model", f"hf:{model}", "--dataset", str(data), "--output-dir", str(d), "--no-progress", "--no-plot"]
    rec = runner.run("tools/anytrain", launch_cmd("cpu.yaml", TRAIN, *args, *job.anytrain_options(seed, data)),
                     timeout=TIMEOUT)  # fmt: skip
    if "error" not in rec:
        train, _, s = toolkit.read_run(d)
        seconds = [job.PROMPTS * job.GENERATIONS / line["samples_per_s"] for line in train]  # one line a step
        rec.update(loop_s=s["first_step_s"] + s["train_seconds"], steps=s["optimizer_steps"], step_seconds=seconds)
        rec.update(peak_memory_bytes=s["peak_memory_bytes"], rewards=[line["reward"] for line in train])
        rec.update(rights=[line["reward_right"] for line in train], calls=[line["tool_calls"] for line in train])
        rec["rollout_s"] = sum(line["generating"] * w for line, w in zip(train, seconds))
    return rec


def trl_run(runner: Runner, seed: int, data: Path, model: Path) -> dict:
    d = runner.fresh("tools-trl")
    cmd = [PY, str(BENCH / "peers" / "trl_grpo_tools_job.py"), "--data", str(data), "--model", str(model), "--kind",
           "full", "--seed", str(seed), "--json", str(d / "result.json"), "--out", str(d / "run")]  # fmt: skip
    rec = runner.run("tools/trl", cmd, timeout=TIMEOUT)
    if "error" not in rec:
        rec.update(toolkit.json.loads((d / "result.json").read_text()))
    return rec


def variant(trainer: str, data: Path, model: Path):
    def run(runner: Runner) -> dict:
        seed = 42 + sum(1 for r in runner.records if r["name"] == f"tools/{trainer}")
        toolkit.settle()
        rec = (trl_run if trainer == "trl" else anytrain_run)(runner, seed, data, model)
        if "error" not in rec:
            rec.update(seed=seed, step_s=rec["loop_s"] / rec["steps"], rollout=rec["rollout_s"] / rec["loop_s"])
        return rec

    return run


def summarise(records: list[dict]) -> dict:
    rows = {}
    for name, _ in VARIANTS:
        ok = [r for r in records if r.get("variant") == name and "error" not in r]
        if not ok:
            rows[name] = None
            continue
        rows[name] = {
            "step_s": min(r["step_s"] for r in ok),
            "step_s_median": statistics.median(r["step_s"] for r in ok),
            "rollout": statistics.median(r["rollout"] for r in ok),
            "peak_mib": statistics.median(r["peak_memory_bytes"] for r in ok) / 2**20,
            **{key: curve(ok, key) for key in ("rewards", "rights", "calls")},
            "runs": len(ok),
        }
    return rows


def curve(records: list[dict], key: str) -> list[float]:
    """Each step's mean over the runs of a logged figure."""
    return [statistics.mean(x for x in step if x is not None) for step in zip(*(r[key] for r in records))]


def table(rows: dict) -> str:
    out = md_head("trainer", "time per step (best run)", "median run", "rollout share", "peak RSS (median)",
                  "tool calls per completion, steps 1 / 5 / 10", "right, steps 1 / 5 / 10", "mean reward")  # fmt: skip
    for name, row in rows.items():
        if row is None:
            out.append(f"| {name} | failed | | | | | | |")
            continue
        at = lambda curve: " / ".join(f"{curve[k]:.2f}" for k in (0, 4, 9) if k < len(curve))  # noqa: E731
        out.append(f"| {name} | {row['step_s']:.2f} s | {row['step_s_median']:.2f} s | {100 * row['rollout']:.0f} % | "
                   f"{row['peak_mib']:,.0f} MiB | {at(row['calls'])} | {at(row['rights'])} | "
                   f"{statistics.mean(row['rewards']):.3f} |")  # fmt: skip
    a, t = rows.get("anytrain"), rows.get("trl")
    if a and t:
        out.append(f"\nanytrain / TRL time per step {a['step_s'] / t['step_s']:.3f} (best runs), "
                   f"{a['step_s_median'] / t['step_s_median']:.3f} (median runs); peak RSS "
                   f"{a['peak_mib'] / t['peak_mib']:.3f}")  # fmt: skip
    return "\n".join(out)


def main(argv=None) -> dict | None:
    args = toolkit.parser(__doc__, out="bench_out/grpo_tools", rounds=2).parse_args(argv)
    if toolkit.trl_missing("the tool-use job"):
        return None
    out = toolkit.out_dir(args.out)
    data = job.write_data(out / "data")
    model = job.build_model(out / "model", ROOT)
    runner = Runner(out)
    variants = [(name, variant(trainer, data, model)) for name, trainer in VARIANTS]
    return toolkit.peer_rounds(runner, variants, args.rounds, "grpo_tools", job, summarise, table)


if __name__ == "__main__":
    main()
