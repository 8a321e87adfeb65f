"""Four defects, each pinned by a test that failed before its fix.

1. sft's generated answers (`shown`) and stop ids (`stops`) were class-level lists, shared by every
   SupervisedFineTuning in the process: a second run printed the first run's answers.
2. Docstrings and comments named files that do not exist (data/wordtags.py, textmodels.py,
   tests/test_tagging.py): every path-like mention in src/anytrain must name a file that is there.
3. benchmarks/sft_vs_trl.py put benchmarks/peers on sys.path by hand; the scripts import `peers` as the
   package it is (benchmarks/ is on the path of `python benchmarks/X.py`).
4. `anytrain predict` on a transformers causal-LM run (--task lm --model hf:...) read the texts, loaded the
   model, then said it had no predictions: it now scores each text (loss, perplexity, tokens), the loss
   the model's own (transformers' `labels=` loss), whatever the batch pads the text to."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from conftest import ROOT

from anytrain import TrainConfig

SRC = ROOT / "src" / "anytrain"


# --------------------------------------------------------------------------- 1. sft's lists are a run's own


def test_sft_generations_and_stops_are_each_tasks_own():
    from anytrain.tasks.causal_lm.answers import Answers
    from anytrain.tasks.hf_sft import SupervisedFineTuning

    first, second = SupervisedFineTuning(TrainConfig()), SupervisedFineTuning(TrainConfig())
    first.stops.append(7)
    assert second.stops == [] and second.answers is None and "stops" not in vars(SupervisedFineTuning)
    answers, later = Answers(None, [7]), Answers(None, [7])  # each run's answering: its shown lines its own
    answers.shown.append("  ...'hi' -> 'hello' (expected 'hello')")
    answers.stops.append(8)
    assert later.shown == [] and later.stops == [7] and "shown" not in vars(Answers)


# --------------------------------------------------------------------------- 2. files named in src exist

PLACEHOLDERS = {"file.py"}  # `--model file.py:factory`, `--loss file.py:fn`: the user's file, not ours
REPO_DIRS = ("tests", "benchmarks", "scripts", "examples", "docs", "src")


def stale_mentions(text: str) -> list[str]:
    """The file names a module's text mentions that name no file: data/X.py and tasks/X.py under
    src/anytrain (and config/X.py), anytrain/... under src, tests/..., benchmarks/... (and the other top folders)
    under the repository, and a bare X.py a file of src (train.py), src/anytrain, its data/, tasks/ (and the causal-LM
    base, tasks/causal_lm/) or config/."""
    missing = []
    for found in re.findall(r"\b(?:data|tasks|config)/[a-z_]+\.py\b", text):
        if not (SRC / found).is_file():
            missing.append(found)
    for found in re.findall(r"\banytrain/[\w/]+\.py\b", text):
        if not (SRC.parent / found).is_file():
            missing.append(found)
    for found in re.findall(rf"(?<![\w/.])(?:{'|'.join(REPO_DIRS)})/[\w/.-]*\w\.\w+\b", text):
        if not (ROOT / found).exists():
            missing.append(found)
    for found in re.findall(r"(?<![\w/.])[a-z_]\w*\.py\b", text):
        if found not in PLACEHOLDERS and not any(
            (d / found).is_file()
            for d in (SRC.parent, SRC, SRC / "data", SRC / "tasks", SRC / "tasks" / "causal_lm", SRC / "config")
        ):
            missing.append(found)
    return missing


def test_every_file_a_module_names_exists():
    stale = {
        str(path.relative_to(ROOT)): found
        for path in sorted(SRC.rglob("*.py"))
        if (found := stale_mentions(path.read_text(encoding="utf-8")))
    }
    assert not stale, stale


def test_the_file_check_sees_what_it_looks_for():
    assert stale_mentions("as seqeval does (data/wordtags.py); the encoder (textmodels.py), tests/test_tagging.py") == [
        "data/wordtags.py",
        "tests/test_tagging.py",
        "textmodels.py",
    ]
    assert (
        stale_mentions("tasks/hf_tag/tagging.py, tasks/hf_lm.py, head.py, tests/test_hf_tag.py, path/to/file.py:f")
        == []
    )


AMBIGUOUS = {  # module names that comments also use for other things: config sections, variables, files, libraries
    "anytrain",  # its names are imported on first use (anytrain.train)
    "config",  # config.json
    "data",  # cfg.data.label_column
    "head",  # a transformers task's hf.Head (head.name), and tasks/causal_lm/head.py
    "loss",  # a loss tensor's attributes (loss.dtype), and tasks/grpo/loss.py
    "optim",  # cfg.optim.lr
    "shape",  # shape.pad_id, a DataShape's
    "task",  # a task object's attributes (task.name), and tasks/multilabel/task.py
    "tokenizer",  # a tokenizer's own attributes
    "transformers",  # the library, and tasks/transformers.py
}


FILE_SUFFIXES = {"py", "json", "jsonl", "yaml", "safetensors"}  # completions.jsonl names a file, not a module's name


def stale_names(root: Path, package: str) -> list[str]:
    """`module.name` in the comments and strings of the package's modules (usermodel.forward_for), where the
    module is one of the package's and `name` is neither in it nor a submodule of it."""
    import importlib
    import importlib.util
    import io
    import tokenize

    modules = {}
    for path in root.rglob("*.py"):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        modules.setdefault(parts[-1], ".".join(parts))
    mention = re.compile(r"(?<![\w./])([a-z_]\w*)\.([A-Za-z_]\w*)\b(?![./\w(])")
    stale = []
    for path in sorted(root.rglob("*.py")):
        for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
            if token.type not in (tokenize.COMMENT, tokenize.STRING):
                continue
            for module, name in mention.findall(token.string):
                if module not in modules or module in AMBIGUOUS or name in FILE_SUFFIXES:
                    continue
                found = importlib.import_module(modules[module])
                if not hasattr(found, name) and importlib.util.find_spec(f"{modules[module]}.{name}") is None:
                    stale.append(f"{path.relative_to(root)}:{token.start[0]}: {module}.{name}")
    return stale


def test_every_module_name_a_comment_names_exists():
    assert not stale_names(SRC, "anytrain")


# --------------------------------------------------------------------------- 3. no sys.path edits

ON_PURPOSE = {  # where putting a folder on sys.path is the point
    "src/anytrain/usermodel.py",  # `--model path/to/nets.py:build` imports the user's file and its neighbours
    "scripts/gpu_checks.py",  # scripts and examples run from a checkout without installing anytrain
    "scripts/task_table.py",
    "scripts/gpu_truth.py",
    "examples/model_parallel_digits.py",
    "examples/sft_then_dpo.py",  # the --tiny studies build the tests' models (tests/hfmodels.py)
    "examples/sft_then_grpo.py",
    "examples/tool_use.py",
    "examples/distill_sums.py",
}


def test_nothing_puts_folders_on_sys_path_by_hand():
    edits = re.compile(r"\bsys\.path(?:\.(?:insert|append|extend)\(|\[[^\]]*\]\s*=|\s*\+=)")
    found = sorted(
        str(path.relative_to(ROOT))
        for folder in ("src", "benchmarks", "scripts", "examples")
        for path in (ROOT / folder).rglob("*.py")
        if edits.search(path.read_text(encoding="utf-8"))
    )
    assert set(found) <= ON_PURPOSE, sorted(set(found) - ON_PURPOSE)


@pytest.mark.launch
def test_the_sft_benchmark_imports_its_job_as_part_of_peers():
    import subprocess
    import sys

    code = "import sft_vs_trl; print(sft_vs_trl.sft_job.__name__, sft_vs_trl.sft_job.WIDE_STEPS)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT / "benchmarks", capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "peers.sft_job"


# --------------------------------------------------------------------------- 4. predict scores a causal LM's texts

SCORED = [
    "the river and the stone",
    "a forest of pine and cedar by the creek, with moss and fern on the cliff over the valley of the brook",
    "engine",
]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    pytest.importorskip("transformers")
    from hfchecks import in_process
    from hfmodels import tiny_gpt2
    from textdata import texts, write_jsonl

    root = tmp_path_factory.mktemp("lm_predict")
    data = write_jsonl(root / "texts.jsonl", [{"text": row["text"]} for row in texts(96, seed=5)])
    flags = ("--task", "lm", "--max-length", "64", "--batch-size", "8", "--max-steps", "3", "--lr", "2e-3")
    in_process(root / "run", "--model", f"hf:{tiny_gpt2(root / 'gpt2')}", "--dataset", str(data), *flags)
    return root


def test_predict_scores_each_text_of_a_causal_lm_run_with_the_models_own_loss(lm_run, one_thread):
    import torch
    from textdata import write_jsonl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anytrain.predict import predict

    file = write_jsonl(lm_run / "score.jsonl", [{"text": text} for text in SCORED])
    rows = predict(str(lm_run / "run"), str(file))
    tokenizer = AutoTokenizer.from_pretrained(lm_run / "run" / "hf")
    model = AutoModelForCausalLM.from_pretrained(lm_run / "run" / "hf").eval()
    assert [row["row"] for row in rows] == [0, 1, 2]
    for row, text in zip(rows, SCORED):
        assert set(row) >= {"loss", "perplexity", "tokens"}
        ids = tokenizer(text, return_tensors="pt").input_ids
        assert row["tokens"] == ids.shape[1] - 1 > 0
        assert row["perplexity"] == pytest.approx(math.exp(row["loss"]), rel=1e-12)
        with torch.no_grad():
            own = model(ids, labels=ids).loss.item()
        assert row["loss"] == pytest.approx(own, abs=1e-5), text


def test_a_texts_score_does_not_depend_on_the_padding_of_its_batch(lm_run, one_thread):
    from textdata import write_jsonl

    from anytrain.predict import predict

    short, long = SCORED[0], SCORED[1]
    together = predict(str(lm_run / "run"), str(write_jsonl(lm_run / "pair.jsonl", [{"text": short}, {"text": long}])))
    alone = predict(str(lm_run / "run"), str(write_jsonl(lm_run / "alone.jsonl", [{"text": short}])))
    one_by_one = predict(str(lm_run / "run"), str(lm_run / "pair.jsonl"), batch_size=1)
    assert together[0]["tokens"] == alone[0]["tokens"] < together[1]["tokens"]
    assert together[0]["loss"] == pytest.approx(alone[0]["loss"], abs=1e-5)
    assert together[1]["loss"] == pytest.approx(one_by_one[1]["loss"], abs=1e-5)


def test_predict_on_a_causal_lm_run_writes_one_json_row_per_text(lm_run, capsys):
    import json

    from textdata import write_jsonl

    from anytrain.predict import main

    file = write_jsonl(lm_run / "cli.jsonl", [{"text": text} for text in SCORED])
    main([str(lm_run / "run"), "--dataset", str(file), "--output", str(lm_run / "scores.jsonl")])
    lines = [json.loads(line) for line in (lm_run / "scores.jsonl").read_text().splitlines()]
    assert [sorted(line) for line in lines] == [["loss", "perplexity", "row", "tokens"]] * 3
    assert "3 predictions written to" in capsys.readouterr().err
