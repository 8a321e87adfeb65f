"""The rollout's fixed cost at small scale: anytrain's --task grpo beside TRL 1.16's GRPOTrainer on a job where the
model costs little and each generated token's own cost shows (docs/benchmarks.md, online RL). The job:
peers/grpo_job.py's (its prompts, reward file, loss, optimizer and flags) with 2 prompts x G = 8 completions of at
most 12 tokens a step, 300 steps, from the benchmarks' chat Llama at the tests' tiny size (64 wide, 2 blocks, 4 heads
with 2 key-value heads, SwiGLU MLP of 128; the 402-token byte-level BPE with ChatML), 2 threads; `--prompts sums`:
the bundled sum questions instead, prompts of about 32 tokens where grpo_job's have 51 (less for reading a group's
prompt once to save). Interleaved rounds, each run waiting for a quiet machine; per variant the loop's seconds per
step (the start of training to the end of its last step) and the share generating. `--tree DIR` adds anytrain from
another checkout (its src/ and src/train.py: before and after a change). `--profile`: where anytrain's step goes
(cProfile of a run of --steps in this process, by cumulative and own time) and the keyed sampler's noise per token,
one position at a time in int64 (as generate made it before) against a block of positions in int32 (the same bits).

`python benchmarks/grpo_rollout_cost.py --rounds 3` (about 1 min a round on an idle 2-core machine);
`python benchmarks/grpo_rollout_cost.py --profile --steps 100`"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import toolkit
from peers import grpo_job
from toolkit import ROOT, Runner

PROMPTS, NEW, STEPS, THREADS = 2, 12, 300, 2
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
TIMEOUT = 900


def sized(steps: int) -> None:
    """grpo_job's sizes set to this job's (its anytrain options and TRL's job read them)."""
    grpo_job.PROMPTS, grpo_job.MAX_NEW_TOKENS, grpo_job.STEPS = PROMPTS, NEW, steps


def write_sums(folder: Path) -> Path:
    """--prompts sums: grpo_job's splits and reward file, the prompts the bundled sum questions ("What is 71033 +
    573780?" as a user turn: about 32 tokens, where grpo_job's questions have 51), each with its answer."""
    from anytrain.data.sums import rows

    grpo_job.write_data(folder)  # the reward file, and splits overwritten below
    chats, start = rows(sum(grpo_job.ROWS.values()), seed=11), 0
    for split, count in grpo_job.ROWS.items():
        part = chats[start : start + count]
        lines = [json.dumps({"prompt": c["messages"][:1], "answer": c["answer"]}) for c in part]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
        start += count
    return folder


def build_model(folder: Path) -> Path:
    """The benchmarks' chat Llama (peers/sft_job.py) at TINY's size; its generation config stops at end-of-text and
    ChatML's end-of-turn, as grpo_job's."""
    from peers import sft_job
    from transformers import AutoTokenizer, GenerationConfig

    if (folder / "config.json").exists():
        return folder
    sft_job.build_model(folder, positions=grpo_job.POSITIONS, shape=TINY)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = GenerationConfig.from_pretrained(folder)
    config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    config.save_pretrained(folder)
    return folder


def anytrain_run(runner: Runner, tree: Path, name: str, seed: int, job: dict, steps: int, threads: int) -> dict:
    """src/train.py of `tree` (its own src/ first on the path) on the job: its record with step_s and generating."""
    sized(steps)
    d = runner.fresh(name.replace(" ", "-"))
    options = grpo_job.anytrain_options("full", seed, grpo_job.rewards_file(job["data"]))
    args = ["--model", f"hf:{job['model']}", "--dataset", str(job["data"]), "--output-dir", str(d), "--no-progress"]
    cmd = toolkit.launch_cmd("cpu.yaml", tree / "src" / "train.py", *args, "--no-plot", *options)
    env = toolkit.run_env(threads, PYTHONPATH=str(tree / "src"))
    rec = runner.run(name, cmd, env=env, timeout=TIMEOUT)
    if "error" not in rec:
        train, _, s = toolkit.read_run(d)
        windows = [(line["step"] - before) * PROMPTS * grpo_job.GENERATIONS / line["samples_per_s"]
                   for line, before in zip(train, [0] + [line["step"] for line in train])]  # fmt: skip
        loop = s["first_step_s"] + s["train_seconds"]
        generating = sum(line["generating"] * w for line, w in zip(train, windows)) / sum(windows)
        rec.update(step_s=loop / s["optimizer_steps"], generating=generating)
    return rec


def trl_run(runner: Runner, name: str, seed: int, job: dict, steps: int, threads: int) -> dict:
    """TRL's job (peers/trl_grpo_job.py at this job's sizes, in a child process): its record with step_s."""
    d = runner.fresh(name.replace(" ", "-"))
    cmd = [toolkit.PY, str(Path(__file__)), "--trl-child", "--steps", str(steps), "--seed", str(seed)]
    cmd += ["--data", str(job["data"]), "--model", str(job["model"]), "--json", str(d / "result.json")]
    path = os.pathsep.join([str(ROOT / "src"), str(toolkit.BENCH / "peers")])  # peers' modules as trl_grpo_job has them
    env = toolkit.run_env(threads, PYTHONPATH=path)
    rec = runner.run(name, [*cmd, "--out-child", str(d / "run")], env=env, timeout=TIMEOUT)
    if "error" not in rec:
        result = json.loads((d / "result.json").read_text())
        rec.update(step_s=result["loop_s"] / result["steps"], generating=result["rollout_s"] / result["loop_s"])
    return rec


def trl_child(args: argparse.Namespace) -> None:
    """Run peers/trl_grpo_job.py's main at this job's sizes (it reads grpo_job's; peers/ is on the child's path)."""
    import grpo_job as peer_job  # the module trl_grpo_job imports, not peers.grpo_job

    peer_job.PROMPTS, peer_job.MAX_NEW_TOKENS, peer_job.STEPS = PROMPTS, NEW, args.steps
    import trl_grpo_job

    sys.argv = ["trl_grpo_job.py", "--kind", "full", "--seed", str(args.seed), "--data", args.data, "--model",
                args.model, "--json", args.json, "--out", args.out_child]  # fmt: skip
    trl_grpo_job.main()


def compare(args: argparse.Namespace, job: dict, out: Path) -> None:
    """The interleaved rounds, their table and <out>/rollout_cost.json."""
    runner = Runner(out)
    trees = [("anytrain", ROOT)]
    if args.tree:
        trees.append((f"anytrain {Path(args.tree).name}", Path(args.tree).resolve()))
    variants = [(name, lambda r, n=name, t=tree: anytrain_run(r, t, n, seed(r, n), job, args.steps, args.threads))
                for name, tree in trees]  # fmt: skip
    variants.append(("trl", lambda r: trl_run(r, "trl", seed(r, "trl"), job, args.steps, args.threads)))
    quiet = [(name, quietly(fn)) for name, fn in variants]
    records = runner.rounds(quiet, args.rounds, label="rollout cost round")
    toolkit.write_json(out / "rollout_cost.json", records)
    print(table(records, [name for name, _ in variants], args.quiet), flush=True)


def seed(runner: Runner, name: str) -> int:
    """42 + the runs the variant has made: every variant the same seed in a round."""
    return 42 + sum(1 for r in runner.records if r["name"] == name)


def quietly(fn):
    def run(runner: Runner) -> dict:
        waited = toolkit.settle()
        return {**fn(runner), "waited_for_quiet_s": waited}

    return run


QUIET = 0.3  # a run while the machine's other processes kept more cores busy than this is left out of the figures


def table(records: list[dict], names: list[str], quiet: float = QUIET) -> str:
    """Per variant: seconds per step (best, median run), the share generating, others' load, over its runs on a
    quiet machine (others below `quiet` cores: 2 threads on 2 cores stall on any other process, so such a run is left
    out, and counted); then the ratios of the rounds where both ran quietly (anytrain / TRL, run by run)."""
    head = ("variant", "time per step (best run)", "median run", "generating", "quiet runs", "others' load (median)")
    out, rows = toolkit.md_head(*head), {}
    for name in names:
        ran = [r for r in records if r.get("variant") == name and "error" not in r]
        ok = [r for r in ran if (r["other_load"] or 0) < quiet]
        rows[name] = {r["round"]: r["step_s"] for r in ok}
        if ok:
            steps = list(rows[name].values())
            cells = [f"{1e3 * min(steps):.1f} ms", f"{1e3 * statistics.median(steps):.1f} ms",
                     f"{100 * statistics.median(r['generating'] for r in ok):.0f} %", f"{len(ok)} of {len(ran)}",
                     f"{statistics.median(r['other_load'] or 0 for r in ok):.2f}"]  # fmt: skip
            out.append(f"| {name} | {' | '.join(cells)} |")
    for name in [n for n in names if n != "trl" and rows.get(n) and rows.get("trl")]:
        both = sorted(set(rows[name]) & set(rows["trl"]))
        ratios = ", ".join(f"{rows[name][r] / rows['trl'][r]:.3f}" for r in both)
        ours, theirs = list(rows[name].values()), list(rows["trl"].values())
        median = statistics.median(ours) / statistics.median(theirs)
        out.append(f"\n{name} / trl, rounds where both ran quietly: {ratios or 'none'}; best runs "
                   f"{min(ours) / min(theirs):.3f}, median runs {median:.3f}")  # fmt: skip
    return "\n".join(out)


def profile(args: argparse.Namespace, job: dict, out: Path) -> None:
    """anytrain's job in this process under cProfile (the training loop's steps only), then the noise per token."""
    import cProfile
    import pstats

    import torch

    from anytrain.tasks.grpo.task import GroupRelative

    torch.set_num_threads(args.threads)
    sized(args.steps)
    options = grpo_job.anytrain_options("full", 42, grpo_job.rewards_file(job["data"]))
    run = ["--model", f"hf:{job['model']}", "--dataset", str(job["data"]), "--output-dir", str(out / "profiled")]
    train = toolkit.trainer_job([*run, "--overwrite", "--no-progress", "--no-plot", *options])
    profiler, step, calls = cProfile.Profile(), GroupRelative.train_step, []

    def profiled(self, ctx, slot):  # whole steps (rollout, loss, backward, optimizer, the loop's own work): from
        calls.append(1)  # the first training step's start (the start-up check's is call 1) to the last one's
        if len(calls) in (2, args.steps + 1):
            (profiler.enable if len(calls) == 2 else profiler.disable)()
        return step(self, ctx, slot)

    GroupRelative.train_step = profiled
    train()
    profiler.dump_stats(out / "profile.prof")  # pstats' file: python -m pstats <out>/profile.prof
    stats = pstats.Stats(profiler)
    print(f"cProfile of {args.steps - 1} whole training steps, {args.threads} thread(s)")
    stats.sort_stats("cumulative").print_stats(30)
    stats.sort_stats("tottime").print_stats(15)
    noise_per_token(args.threads)


def noise_per_token(threads: int) -> None:
    """The keyed noise of one generate call of this job (16 rows, 12 positions, the 402-token vocabulary; and one
    position at Qwen's 151,936): one position at a time in int64 (generate's way before) against one block of
    positions in int32 (sampler.noise), the same bits."""
    import torch

    from anytrain.tasks.causal_lm.sampler import MASK32, SALT, mix32, noise

    torch.set_num_threads(threads)

    def int64(keys, position, vocabulary):
        tokens = torch.arange(vocabulary, dtype=torch.int64)
        x = mix32(mix32(mix32(keys[:, None] ^ (position & MASK32)) ^ tokens[None, :]) ^ SALT)
        return (-torch.log(-torch.log((x.double() + 0.5) / 2.0**32))).float()

    keys = torch.randint(0, 2**32, (PROMPTS * grpo_job.GENERATIONS,), dtype=torch.int64)
    for vocabulary, positions in ((402, NEW), (151_936, 1)):
        old = [int64(keys, p, vocabulary) for p in range(positions)]
        assert torch.equal(torch.stack(old, 1), noise(keys, range(positions), vocabulary))
        before = best_of(lambda: [int64(keys, p, vocabulary) for p in range(positions)])
        after = best_of(lambda: noise(keys, range(positions), vocabulary))
        print(f"noise of {len(keys)} rows x {positions} position(s) x {vocabulary:,} tokens: per position, "
              f"int64 {1e6 * before / positions:.0f} us; a block in int32 {1e6 * after / positions:.0f} us a "
              "position")  # fmt: skip


def best_of(fn, repeats: int = 20) -> float:
    """The fastest of `repeats` timed calls (seconds), after one untimed."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> None:
    p = toolkit.parser(__doc__, out="bench_out/rollout_cost", rounds=3)
    p.add_argument("--steps", type=int, default=STEPS, help="optimizer steps a run")
    p.add_argument("--threads", type=int, default=THREADS, help="torch threads (OMP_NUM_THREADS)")
    p.add_argument("--tree", help="another checkout whose anytrain runs too (its src/train.py and src/)")
    p.add_argument("--profile", action="store_true", help="profile anytrain's steps in this process instead")
    p.add_argument("--prompts", choices=("questions", "sums"), default="questions", help="grpo_job's, or sum questions")
    p.add_argument("--quiet", type=float, default=QUIET, help="runs while others kept more cores busy are left out")
    for flag in ("--trl-child", "--data", "--model", "--seed", "--json", "--out-child"):  # the TRL child's
        p.add_argument(flag, help=argparse.SUPPRESS, **({"action": "store_true"} if flag == "--trl-child" else {}))
    args = p.parse_args(argv)
    if args.trl_child:
        return trl_child(args)
    out = toolkit.out_dir(args.out)
    data = (write_sums if args.prompts == "sums" else grpo_job.write_data)(out / f"data-{args.prompts}")
    job = {"data": data, "model": build_model(out / "model")}
    if args.profile:
        return profile(args, job, out)
    if not toolkit.trl_missing("the rollout's fixed cost"):
        compare(args, job, out)
    return None


if __name__ == "__main__":
    main()
