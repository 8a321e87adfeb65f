"""Fingerprints of the final weights of eight reference runs, to prove a change left training untouched.

    python scripts/fingerprints.py              # run the eight jobs, print their fingerprints
    python scripts/fingerprints.py --check      # ... and compare with tests/fingerprints.json (exit 1 on a difference)
    python scripts/fingerprints.py --record     # ... and store them there for this environment
    python scripts/fingerprints.py --jobs sft dpo dpo_ipo --tree ../old   # some jobs only, another checkout's train.py

The jobs, each through `accelerate launch` of the tree's src/train.py (--tree: this checkout by default):
  digits       the default job (bundled digits, seed 42, every option at its default)
  shakespeare  the first 200 optimizer steps of examples/shakespeare_cpu.yaml (--max-steps 200)
  two_ranks    2 gloo ranks (accelerate_configs/multi_cpu.yaml), digits, 5 epochs
  resumed      digits, 6 epochs, SIGKILLed after its step-100 checkpoint, then --resume
  sft          --dataset instructions on the tests' random chat Llama, 40 steps of 8 chats, fp32
  dpo          --task dpo --dataset preferences on it, 20 steps of 8 pairs, fp32: --dpo-loss sigmoid, the reference
               cached (every split's reference log-probabilities before step 0: most of its time)
  dpo_ipo      the same with --dpo-loss ipo --packing --reference live (a frozen copy beside the model)
  grpo         --task grpo --dataset sum-questions --reward answer on it, 6 steps of 2 prompts x 4 completions, fp32,
               --kl-beta 0.04 (a frozen reference) and --grpo-iterations 2 (the old log-probabilities)
The four LLM jobs share one model: tests/hfmodels.py's tiny_llama(seed 0: 64 wide, 2 layers, ChatML), built offline
by a child process with this checkout's tests/ and src/ on its PYTHONPATH (no sys.path edit here: the rule of
tests/test_task_defects.py), the same bytes from run to run and for every --tree. Each evaluates once, at its last
step, on 1% of the rows (the greedy answers of 40 chats or 20 prompts).

A fingerprint is anytrain.outputs.weights_fingerprint (16 hex digits of a sha256) of the weights training
ended with (summary.json's last_weights_sha256: model.safetensors holds the best validation's weights
by default, the last step's with --final-weights last).
Bit-identical weights are only expected on the same torch build, CPU kernels and core count, so they
are stored per environment (anytrain.outputs.fingerprint_environment); the test suite pins the runs it
makes anyway the same way, in the same file (tests/conftest.py, check_fingerprint), and --record replaces
only the entries of the jobs it ran. About 2 minutes on 2 idle cores for the first four, 1 to 3 more for the LLM jobs;
--runs DIR keeps the run folders (metrics.jsonl, model.safetensors) to compare two trees' runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "tests" / "fingerprints.json"  # shared with the tests' pins (tests/conftest.py)
TIMEOUT = 600


def fingerprint(run_dir: Path) -> str:
    """The last step's weights (a tree older than --final-weights: its model.safetensors)."""
    from safetensors.torch import load_file

    from anytrain.outputs import weights_fingerprint

    summary = json.loads((run_dir / "summary.json").read_text())
    return summary.get("last_weights_sha256") or weights_fingerprint(load_file(str(run_dir / "model.safetensors")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(tree: Path, config: str, run_dir: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(tree / "accelerate_configs" / config),
        "--main_process_port",
        str(free_port()),
        str(tree / "src" / "train.py"),
        "--no-progress",
        "--no-plot",
        "--output-dir",
        str(run_dir),
        *args,
    ]


def run(cmd: list[str], tree: Path) -> None:
    out = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=TIMEOUT)
    if out.returncode != 0:
        sys.exit(f"fingerprints: {' '.join(cmd[-6:])} failed ({out.returncode}):\n{out.stderr[-3000:]}")


def killed_and_resumed(tree: Path, run_dir: Path) -> None:
    args = ["--epochs", "6", "--checkpoint-every-steps", "50"]
    victim = subprocess.Popen(
        command(tree, "cpu.yaml", run_dir, *args),
        cwd=tree,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + TIMEOUT
    while not (run_dir / "checkpoints" / "step-000100").is_dir():
        if victim.poll() is not None or time.monotonic() > deadline:
            sys.exit("fingerprints: the run to kill ended (or hung) before its step-100 checkpoint")
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=60)
    run(command(tree, "cpu.yaml", run_dir, *args, "--resume"), tree)


def tiny_llama(folder: Path) -> Path:
    """tests/hfmodels.py's tiny_llama(folder, seed=0), built by a child process (tests/ on its PYTHONPATH)."""
    path = os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src")])
    code = f"from pathlib import Path; from hfmodels import tiny_llama; tiny_llama(Path({str(folder)!r}), seed=0)"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True
    )
    if out.returncode != 0:
        sys.exit(f"fingerprints: building the tiny Llama failed:\n{out.stderr[-3000:]}")
    return folder


LLM = ["--val-fraction", "0.01", "--test-fraction", "0.01", "--batch-size", "8", "--log-every-steps", "1"]
SFT = ["--dataset", "instructions", "--max-steps", "40", *LLM]  # fp32: cpu.yaml's mixed_precision "no"
DPO = ["--task", "dpo", "--dataset", "preferences", "--max-steps", "20", *LLM]
GRPO = ["--task", "grpo", "--dataset", "sum-questions", "--reward", "answer", "--max-steps", "6", *LLM,
        "--batch-size", "2", "--num-generations", "4", "--max-new-tokens", "8", "--kl-beta", "0.04",
        "--grpo-iterations", "2"]  # fmt: skip


def digits(tree: Path, root: Path) -> None:
    run(command(tree, "cpu.yaml", root / "digits"), tree)


def shakespeare(tree: Path, root: Path) -> None:
    recipe = str(tree / "examples" / "shakespeare_cpu.yaml")
    run(command(tree, "cpu.yaml", root / "shakespeare", "--config", recipe, "--max-steps", "200"), tree)


def two_ranks(tree: Path, root: Path) -> None:
    run(command(tree, "multi_cpu.yaml", root / "two_ranks", "--epochs", "5"), tree)


def resumed(tree: Path, root: Path) -> None:
    killed_and_resumed(tree, root / "resumed")


def llm(name: str, *args: str):
    """A job training the tiny Llama (built in root/tiny by the first LLM job) into root/name."""

    def job(tree: Path, root: Path) -> None:
        model = root / "tiny"
        if not model.is_dir():
            tiny_llama(model)
        run(command(tree, "cpu.yaml", root / name, "--model", f"hf:{model}", *args), tree)

    return job


JOBS = {
    "digits": digits,
    "shakespeare": shakespeare,
    "two_ranks": two_ranks,
    "resumed": resumed,
    "sft": llm("sft", *SFT),
    "dpo": llm("dpo", *DPO, "--dpo-loss", "sigmoid"),
    "dpo_ipo": llm("dpo_ipo", *DPO, "--dpo-loss", "ipo", "--packing", "--reference", "live"),
    "grpo": llm("grpo", *GRPO),
}


def jobs(tree: Path, root: Path, names: list[str]) -> dict[str, str]:
    for name in names:
        JOBS[name](tree, root)
    return {name: fingerprint(root / name) for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout whose src/train.py runs (default: this one)")
    parser.add_argument(
        "--jobs",
        nargs="+",
        choices=list(JOBS),
        default=list(JOBS),
        metavar="JOB",
        help=f"run these only, of {', '.join(JOBS)} (default: all)",
    )
    parser.add_argument("--runs", type=Path, help="write the run folders here and keep them (default: a temporary one)")
    parser.add_argument(
        "--check", action="store_true", help="compare with tests/fingerprints.json; exit 1 on a difference"
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="store the fingerprints in tests/fingerprints.json for this environment (the other jobs' kept)",
    )
    args = parser.parse_args()
    names = [name for name in JOBS if name in args.jobs]  # each once, in the table's order
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    os.environ.update(env)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.runs.resolve() if args.runs else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        found = jobs(args.tree.resolve(), root, names)
    from anytrain.outputs import fingerprint_environment

    key = fingerprint_environment()
    print(json.dumps({key: found}, indent=1))
    stored = json.loads(STORE.read_text()) if STORE.exists() else {}
    if args.record:
        stored[key] = {**stored.get(key, {}), **found}  # the tests' pins and the jobs not run stay
        STORE.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    elif args.check:
        expected = stored.get(key, {})
        missing = [name for name in found if name not in expected]
        if missing:
            sys.exit(
                f"fingerprints: none stored for {', '.join(missing)} on this environment ({key}); "
                "run with --record on a known-good tree"
            )
        differing = [name for name in found if found[name] != expected[name]]
        if differing:
            sys.exit(f"fingerprints: changed: {', '.join(differing)}")
        print(f"fingerprints: unchanged: {', '.join(found)}")


if __name__ == "__main__":
    main()
