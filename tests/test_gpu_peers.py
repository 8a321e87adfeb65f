"""scripts/gpu_truth.py's peers step (benchmarks/gpu_plan.py, gpu_peers.py, peers/gpu_*.py), checked on the CPU: the
plans fit an H100's memory and their estimates the 5 and 9 minutes asked, a job too big is refused, the FLOP count is
anytrain's own for the model, the rows read `0.5 B`, `2,048` and a percentage, the docs block goes between its
markers, a worker records a job that killed its process and skips one out of time; and the dry run (launches) takes
every job of the whole run through anytrain and TRL at toy sizes, the fsdp and lmhead steps with it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from conftest import ROOT

sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "benchmarks")]  # as gpu_truth.py puts them
import gpu_peers  # noqa: E402
import gpu_plan  # noqa: E402
import gpu_truth  # noqa: E402
from peers import gpu_job, gpu_worker  # noqa: E402

SEQUENCE = re.compile(r"^\d{1,3}(,\d{3})*$")
PERCENT = re.compile(r"^\d+\.\d %$")


def kinds(jobs) -> set:
    return {(j.size, j.seq, j.task, j.variant, j.trainer) for j in jobs if not j.patch and j.process != "compile"}


def test_the_plans_fit_an_h100_and_their_estimates_the_minutes_asked():
    for quick, minutes in ((True, 5), (False, 9)):
        jobs = gpu_plan.plan(quick, dry=False)
        total, text = gpu_plan.estimate(jobs, gpu_truth.DEFAULT_STEPS, quick, dry=False)
        assert total <= minutes * 60, text
        assert f"estimate: {total:.0f} s" in text and all(j.id in text for j in jobs)
        assert max(j.memory_gib for j in jobs) <= 78 * gpu_plan.MEMORY_USE
        assert all(j.steps - j.warmup >= (2 if j.task == "grpo" else 3) for j in jobs)
    whole = gpu_plan.plan(False, dry=False)
    for size in ("0.5 B", "1 B"):  # both sizes at both sequences: each job through both trainers
        for seq in (1024, 2048):
            cell = {k[2:] for k in kinds(whole) if k[:2] == (size, seq)}
            assert cell == {(t, v, w) for t, v in (("sft", "full"), ("sft", "lora"), ("dpo", "full"))
                            for w in ("anytrain", "trl")}  # fmt: skip
        grpo = {
            (j.variant, j.trainer) for j in whole if j.size == size and j.task == "grpo" and j.trainer != "generate"
        }
        assert grpo == {("share", "anytrain"), ("no-share", "anytrain"), ("full", "trl")}
    offers = {j.variant for j in whole if j.patch or j.process == "compile" or j.trainer == "generate"}
    assert offers == {"chunk-2^27", "chunk-2^28", "adamw-unfused", "liger", "compiled", "dynamic", "static"}
    quick = gpu_plan.plan(True, dry=False)
    assert {(j.size, j.seq) for j in quick if j.task != "grpo"} == {("0.5 B", 1024), ("1 B", 2048)}
    assert not any(j.process == "compile" for j in quick)  # torch.compile: the whole run only
    assert {"fsdp", "lmhead", "peers"} <= set(gpu_truth.DEFAULT_STEPS)


def test_rows_halve_until_a_job_fits_and_one_that_cannot_is_refused(monkeypatch, capsys):
    small = {**gpu_plan.CARD, "name": "small card", "memory_gib": 50.0}
    rows = {j.id: j.rows for j in gpu_plan.plan(False, dry=False, card=small)}
    assert rows["1B-1024-sft-full-anytrain"] < 16 and rows["0.5B-1024-sft-full-anytrain"] == 16
    assert max(j.memory_gib for j in gpu_plan.plan(False, dry=False, card=small)) <= 50 * gpu_plan.MEMORY_USE
    monkeypatch.setitem(gpu_plan.CARD, "memory_gib", 20.0)  # a 1 B model's weights and AdamW alone take 23 GiB
    with pytest.raises(gpu_plan.PlanError, match="^1B-1024-sft-full-anytrain: .* above 18 GiB of H100"):
        gpu_plan.plan(False, dry=False)
    assert gpu_truth.main(["--estimate"]) == 2
    assert "gpu_truth: refused: 1B-" in capsys.readouterr().out


def test_the_flop_count_is_anytrains_for_the_model_itself():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from anytrain.flops import per_token

    for shape in (gpu_job.TINY, gpu_job.SHAPES["0.5 B"], gpu_job.SHAPES["1 B"]):
        sizes = {k: v for k, v in shape.items() if k != "vocabulary"}
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig(vocab_size=shape["vocabulary"], tie_word_embeddings=True, **sizes))
        assert gpu_job.parameters(shape)[0] == sum(p.numel() for p in model.parameters())
        assert gpu_plan.flops_per_token(shape, 2048) == per_token(model, 2048)[0]
    assert round(gpu_job.parameters(gpu_job.SHAPES["0.5 B"])[0] / 1e6) == 494  # Qwen2.5-0.5B's
    assert round(gpu_job.parameters(gpu_job.SHAPES["1 B"])[0] / 1e6) == 1236  # Llama-3.2-1B's


def report() -> dict:
    """A report as a GPU run writes it: a job of each trainer, an offer and its default."""

    def row(id_, trainer, job, rate, mfu, status="ran"):
        return {"id": id_, "card": "NVIDIA H100 80GB HBM3", "size": "1 B", "sequence": "2,048", "job": job,
                "trainer": trainer, "rows": 8, "steps": 5, "tokens_per_s": rate, "mfu": mfu, "peak_memory_gib": 51.25,
                "loss_first": 11.93, "loss_last": 9.5, "status": status, "note": ""}  # fmt: skip

    peers = [row("0.5B-1024-sft-full-anytrain", "anytrain", "SFT full, packed", 48000.0, 0.3512),
             row("1B-2048-sft-full-trl", "trl", "SFT full, packed", 40000.0, 0.2927)]  # fmt: skip
    offers = [row("0.5B-1024-sft-adamw-unfused-anytrain", "anytrain", "adamw-unfused", 45000.0, 0.33)]
    facts = {"device": "NVIDIA H100 80GB HBM3", "peak_tflops": 989.0, "peak_from": "data sheet", "torch": "2.11.0",
             "transformers": "5.24.0", "accelerate": "1.15.0", "trl": "1.16.0"}  # fmt: skip
    facts["anytrain"] = "0.1.0 (abc1234)"
    return {**facts, "date": "2026-12-01", "quick": True, "dry_run": False, "peers": peers, "offers": offers}


def test_the_rows_read_as_the_docs_write_sizes_sequences_and_percentages():
    assert (gpu_peers.seq_label(2048), gpu_peers.seq_label(1024), gpu_peers.pct(0.3512)) == ("2,048", "1,024", "35.1 %")
    text = gpu_peers.render(report())
    assert "**NVIDIA H100 80GB HBM3**" in text and "TRL 1.16.0" in text and "transformers 5.24.0" in text
    line = next(x for x in text.splitlines() if "| TRL 1.16.0 |" in x)
    assert line.startswith("| H100 80GB HBM3 | 1 B | 2,048 | SFT full, packed | TRL 1.16.0 | 8 rows | 40,000 |")
    assert "| 29.3 % | 51.2 GiB | 9.5 after 5 (first 11.93) |" in line
    assert "| AdamW without its fused kernel | 45,000 | 0.94x | 33.0 % |" in text  # against the default, 48,000


def test_the_docs_block_goes_between_its_markers_and_nothing_else_changes(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## GPU\n\nMeasured by hand.\n\n## The default job\n\nText.\n")
    said = gpu_peers.write_docs("| rows |\n|---|\n| one |", doc)
    begin, end = gpu_peers.MARKERS
    first = doc.read_text()
    assert "added at the end of the GPU section" in said
    assert first == f"# Benchmarks\n\n## GPU\n\nMeasured by hand.\n\n{begin}\n| rows |\n|---|\n| one |\n{end}\n\n" + (
        "## The default job\n\nText.\n"
    )
    assert "rewritten" in gpu_peers.write_docs("| rows |\n|---|\n| two |", doc)
    assert doc.read_text() == first.replace("| one |", "| two |")


def test_docs_from_a_saved_report_rewrites_only_the_block(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("## GPU\n\nBy hand.\n")
    saved = tmp_path / "peers.json"
    saved.write_text(json.dumps(report()))
    monkeypatch.setattr(gpu_truth, "DOCS", doc)
    assert gpu_truth.main(["--docs-from", str(saved)]) == 0  # no GPU, nothing run
    text = doc.read_text()
    assert text.startswith("## GPU\n\nBy hand.\n\n" + gpu_peers.MARKERS[0]) and text.rstrip().endswith(
        gpu_peers.MARKERS[1]
    )
    assert (
        "| H100 80GB HBM3 | 1 B | 2,048 |" in text and "added at the end of the GPU section" in capsys.readouterr().out
    )


def test_a_worker_records_a_job_that_killed_it_and_skips_one_out_of_time(tmp_path):
    jobs = [{"id": "died", "trainer": "anytrain", "seconds": 5.0}, {"id": "late", "trainer": "trl", "seconds": 99.0}]
    (tmp_path / "died.started").touch()  # a worker started it and never wrote its result
    for job in jobs:
        gpu_worker.one(job, tmp_path, time.time() + 60, {"device": "CPU"})
    died, late = (json.loads((tmp_path / f"{j['id']}.json").read_text()) for j in jobs)
    assert died["status"] == "failed" and "died during this job" in died["error"]
    assert late["status"] == "skipped" and "no time left (estimate 99 s)" in late["error"]
    gpu_worker.one(jobs[1], tmp_path, time.time() + 600, {})  # done already: not run again
    assert json.loads((tmp_path / "late.json").read_text())["status"] == "skipped"


@pytest.mark.launch
def test_the_dry_run_takes_every_job_of_the_whole_run_through_both_trainers(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "gpu_truth.py"), "--dry-run", "--out", str(tmp_path / "out")]
    done = subprocess.run([*cmd, "--export", str(tmp_path / "export")], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"estimate: \d+ s \(\d\.\d min\)", done.stdout)  # printed before anything ran
    truth = json.loads((tmp_path / "out" / "truth.json").read_text())
    assert list(truth["steps"]) == gpu_truth.DEFAULT_STEPS and {s["status"] for s in truth["steps"].values()} == {"ran"}
    peers = json.loads((tmp_path / "out" / "peers.json").read_text())
    rows = peers["peers"] + peers["offers"]
    assert [r["id"] for r in rows] == [j.id for j in gpu_plan.plan(False, dry=False)]  # every row of the GPU run
    for r in rows:
        if r["id"].endswith("-liger-anytrain") and r["status"] == "skipped":
            assert "not installed" in r["note"]
            continue
        assert r["status"] == "ran" and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1, r
    assert {r["trainer"] for r in peers["peers"]} == {"anytrain", "trl"}
    table = [line.split(" | ") for line in (tmp_path / "out" / "peers.md").read_text().splitlines()
             if line.startswith("| CPU |")]  # fmt: skip
    assert len(table) == len(peers["peers"]) and {cells[1] for cells in table} == {"0.5 B", "1 B"}
    assert {"1,024", "2,048"} <= {cells[2] for cells in table} and all(SEQUENCE.match(c[2]) for c in table)
    assert all(PERCENT.match(cells[7]) for cells in table)
    exported = {p.name for p in (tmp_path / "export").iterdir()}
    assert exported == {"truth.json", "truth.md", "peers.json", "peers.md", "logs.tar.gz"}
