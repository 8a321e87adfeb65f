"""--task grpo's reward functions as TRL 1.16 calls them, and the completions table.

A completion no function scored is unscorable: left out of its group's mean and of the (unbiased, nan-aware)
standard deviations, advantage 0, left out of the logged reward (the advantages equal TRL's formula, written out
here, GRPOTrainer's and RLOOTrainer's); bools are numbers; the functions get trainer_state, log_metric and
log_extra, also when a failing row is looked for; what they log reaches the log line and run_dir/completions.jsonl,
whose rows say each completion's values, reward and advantage, and which a resumed run appends to (the rows it
samples again dropped); the trackers that take tables get those rows (wandb's log_table, tensorboard's text summary
as a markdown table)."""

from __future__ import annotations

import json
import math
import random
import re
import statistics
from html.parser import HTMLParser
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import read_metrics
from hfchecks import in_process
from hfmodels import tiny_llama

from anytrain.config import ConfigError
from anytrain.tasks.grpo import loss as objective
from anytrain.tasks.grpo.completions import TAG, CompletionsTable
from anytrain.tasks.grpo.figures import Figures, reserved
from anytrain.tasks.grpo.rewards import Reward, RewardCall, TrainerState, scores, total

NAN = float("nan")


def trl_advantages(rewards: list[float], generations: int, scale: str) -> list[float]:
    """TRL 1.16's advantages (grpo_trainer.py, sum_then_normalize), written out: reward minus its group's nanmean,
    over the group's (or the batch's) nanstd with Bessel's correction (NaN below 2 values) + 1e-4; NaN -> 0."""

    def mean_std(values):
        seen = [v for v in values if not math.isnan(v)]
        return (sum(seen) / len(seen) if seen else NAN), (statistics.stdev(seen) if len(seen) > 1 else NAN)

    batch_std = mean_std(rewards)[1]
    out = []
    for start in range(0, len(rewards), generations):
        group = rewards[start : start + generations]
        mean, std = mean_std(group)
        for r in group:
            a = r - mean
            a = a / (std + 1e-4) if scale == "group" else a / (batch_std + 1e-4) if scale == "batch" else a
            out.append(0.0 if math.isnan(a) else a)
    return out


def trl_rloo_advantages(rewards: list[float], generations: int, normalize: bool) -> list[float]:
    """TRL 1.16's RLOO advantages (rloo_trainer.py, _generate_and_score_completions), written out: the reward minus
    the mean of its group's other scorable rewards (NaN where it has none, or is unscorable); normalize_advantages:
    minus the mean of the step's (not NaN) advantages, over their stdev (Bessel) + 1e-4; NaN -> 0."""
    out = []
    for start in range(0, len(rewards), generations):
        group = rewards[start : start + generations]
        seen = [v for v in group if not math.isnan(v)]
        out += [r - (sum(seen) - r) / (len(seen) - 1) if len(seen) > 1 else NAN for r in group]
    if normalize:
        seen = [a for a in out if not math.isnan(a)]
        mean, std = sum(seen) / len(seen), statistics.stdev(seen)
        out = [(a - mean) / (std + 1e-4) for a in out]
    return [0.0 if math.isnan(a) else a for a in out]


def fixed(values: list) -> Reward:
    return Reward("f", lambda prompts, completions, completion_ids, **kwargs: values, 1.0)


# (f, g) per completion, weights 1 and 0.5; None: that function does not score it. Groups of 4.
TABLE = [
    (1, None), (None, None), (0, 1), (None, 2),  # one unscorable completion
    (None, None), (None, None), (None, None), (2, None),  # one scorable: no standard deviation
    (None, None), (None, None), (None, None), (None, None),  # none scorable
    (1, 0), (1, 0), (0, 0), (3, None),
]  # fmt: skip


def table_rewards() -> tuple[torch.Tensor, list[Reward]]:
    rewards = [
        Reward("f", lambda prompts, completions, completion_ids, **kw: [row[0] for row in TABLE], 1.0),
        Reward("g", lambda prompts, completions, completion_ids, **kw: [row[1] for row in TABLE], 0.5),
    ]
    args = {"prompts": ["p"] * 16, "completions": ["c"] * 16, "completion_ids": [[1]] * 16}
    return scores(rewards, args, lambda k: f"row {k}"), rewards


def test_an_unscorable_completion_is_left_out_of_the_mean_and_std_and_gets_advantage_zero():
    table, rewards = table_rewards()
    reward = total(table, rewards)
    expected = [1.0, NAN, 0.5, 1.0, NAN, NAN, NAN, 2.0, NAN, NAN, NAN, NAN, 1.0, 1.0, 0.0, 3.0]
    assert reward.tolist() == pytest.approx(expected, nan_ok=True)  # some None: the others' weighted sum
    for scale in ("group", "batch", "none"):
        batch_std = objective.nanstd(reward) if scale == "batch" else None
        ours = objective.advantages(reward, 4, scale, batch_std)
        assert ours.tolist() == pytest.approx(trl_advantages(expected, 4, scale), abs=1e-6), scale
        assert ours[[1, 4, 5, 6, 8, 9, 10, 11]].tolist() == [0.0] * 8  # unscorable, or alone in its group
    for normalize in (False, True):
        rloo = objective.advantages(reward, 4, "none", None, "rloo", (lambda values: values) if normalize else None)
        assert rloo.tolist() == pytest.approx(trl_rloo_advantages(expected, 4, normalize), abs=1e-6), normalize
        assert rloo[[1, 4, 5, 6, 7, 8, 9, 10, 11]].tolist() == [0.0] * 9  # unscorable, or alone: no baseline
    group = objective.advantages(reward, 4, "group", None)
    assert group[0].item() == pytest.approx((1.0 - 2.5 / 3) / (statistics.stdev([1.0, 0.5, 1.0]) + 1e-4), abs=1e-6)
    assert group[7].item() == 0.0  # the one scorable completion of its group: TRL's nanstd is NaN there
    plain = torch.randn(3, 5, dtype=torch.float64)
    assert torch.allclose(objective.nanstd(plain, 1), plain.std(1)) and torch.allclose(
        objective.nanstd(plain), plain.std()
    )


class OneProcess:
    """What Figures asks of an accelerator, for one process."""

    device = torch.device("cpu")

    def reduce(self, tensor, op):
        return tensor

    def gather(self, tensor):
        return tensor


def test_the_logged_reward_leaves_unscorable_completions_out_and_log_metric_is_averaged_per_rollout():
    table, rewards = table_rewards()
    reward = total(table, rewards)
    completion = torch.arange(3)[None, :] < torch.tensor([3] * 8 + [1] * 8)[:, None]  # 3 tokens, then 1
    done = SimpleNamespace(completion=completion, truncated=torch.arange(16) < 4)
    figures = Figures()
    for logged in ({"a": [1.0, 2.0], "b": [NAN]}, {"a": [3.0]}):  # two rollouts: the base's lengths, grpo's rewards
        figures.add_lengths(OneProcess(), done)
        figures.add_rollout(OneProcess(), table, reward, 4, ["f", "g"], logged)
    out = figures.take(OneProcess())
    scorable = [r for r in reward.tolist() if not math.isnan(r)]
    assert out["reward"] == pytest.approx(sum(scorable) / len(scorable))  # TRL's `reward`: a nanmean
    assert out["reward_f"] == pytest.approx(8 / 7) and out["reward_g"] == pytest.approx(3 / 5)
    assert out["flat_groups"] == 0.5  # one scorable (a single value) and none scorable: no signal
    assert out["completion_length"] == 2.0 and out["truncated"] == 0.25  # over every completion, unscorable too
    assert out["a"] == pytest.approx((1.5 + 3.0) / 2) and out["b"] is None  # each rollout's mean, then their mean
    assert figures.take(OneProcess()) == {}  # a new window


def test_bools_are_numbers_and_nan_is_still_refused():
    args = {"prompts": ["p"] * 4, "completions": ["a", "b", "c", "d"], "completion_ids": [[1]] * 4}
    table = scores([fixed([True, False, np.bool_(True), None])], args, lambda k: f"row {k}")
    assert table[:, 0].tolist()[:3] == [1.0, 0.0, 1.0] and torch.isnan(table[3, 0])
    with pytest.raises(ConfigError, match=r"^--reward f: returned nan for row 1 \(a number or None\)$"):
        scores([fixed([1.0, float("nan"), 0.0, 0.0])], args, lambda k: f"row {k}")


def trl_style(prompts, completions, completion_ids, **kwargs):
    """A reward function as TRL's docs write one: the extra arguments read from kwargs."""
    state = kwargs["trainer_state"]
    kwargs["log_metric"]("seen", len(completions))
    kwargs["log_extra"]("doubled", [2 * len(c) for c in completions])
    if any(c == "bbbb" for c in completions):
        raise ValueError("too long")
    return [state.global_step + state.epoch] * len(completions)


def test_reward_functions_get_trainer_state_log_metric_and_log_extra_also_row_by_row():
    state = TrainerState(global_step=7, epoch=0.5, max_steps=10, num_train_epochs=2)
    args = {"prompts": ["p"] * 3, "completions": ["a", "bb", "c"], "completion_ids": [[1], [1, 2], [2]]}
    call = RewardCall(state)
    assert scores([Reward("trl_style", trl_style, 1.0)], args, lambda k: f"row {k}", call)[:, 0].tolist() == [7.5] * 3
    assert call.metrics == {"seen": [3.0]} and call.extra == {"doubled": [2, 4, 2]}
    bad = {**args, "completions": ["a", "bbbb", "c"]}
    with pytest.raises(ConfigError) as err:  # each row called alone, trainer_state and the loggers passed whole
        scores([Reward("trl_style", trl_style, 1.0)], bad, lambda k: f"row {k}", RewardCall(state))
    assert str(err.value) == "--reward trl_style: raised ValueError: too long (on row 1)"


def test_what_a_reward_function_logs_is_checked_in_one_line():
    args = {"prompts": ["p"] * 2, "completions": ["a", "b"], "completion_ids": [[1], [2]]}
    state = TrainerState(0, 0.0, 1, 1)

    def logging(what):
        def fn(prompts, completions, completion_ids, log_metric, log_extra, **kwargs):
            what(log_metric, log_extra)
            return [1.0] * len(completions)

        return Reward("fn", fn, 1.0)

    cases = [
        (lambda m, e: e("short", [1]), "--reward fn: log_extra('short') got 1 values for 2 completions (one each)"),
        (lambda m, e: e("text", "ab"), "--reward fn: raised TypeError: log_extra('text'): str is not a list of values"),
        (
            lambda m, e: m("loss", 1.0),
            "--reward fn: raised ValueError: log_metric('loss'): the training log line has "
            "its own 'loss'; choose another name (on row 0)",
        ),
        (lambda m, e: m("x", "many"), "--reward fn: raised TypeError: log_metric('x'): 'many' is not a number"),
    ]
    for what, said in cases:
        call = RewardCall(state, reserved(["fn"]), frozenset({"reward"}))
        with pytest.raises(ConfigError) as err:
            scores([logging(what)], args, lambda k: f"row {k}", call)
        assert str(err.value).startswith(said), str(err.value)


def test_a_resumed_run_keeps_the_rows_sampled_before_its_step_and_appends(tmp_path):
    path = tmp_path / "completions.jsonl"
    path.write_text("".join(json.dumps({"step": s, "prompt": "p"}) + "\n" for s in range(5)) + '{"step": 5, "pr')
    table = CompletionsTable()
    table.start(tmp_path, main=True)
    args = {"prompts": ["2 + 2 ="], "completions": [[{"role": "assistant", "content": "4"}]]}
    reward, advantage = torch.tensor([1.0], dtype=torch.float64), torch.tensor([0.0])
    before = path.read_text()
    table.add(0, args, torch.tensor([[0.0, 0.0]], dtype=torch.float64), ["answer", "reward"], reward, advantage, {})
    table.forget()  # the start-up check's rollout (step 0 of a run resumed at 3): neither kept nor counted
    table.add(3, args, torch.tensor([[1.0, NAN]], dtype=torch.float64), ["answer", "reward"], reward, advantage,
              {"note": ["ok"]})  # fmt: skip
    assert path.read_text() == before  # nothing written until the log line
    shown = table.flush()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()[:-1]] == [0, 1, 2]  # 3 on: redone
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[-1] == {"step": 3, "prompt": "2 + 2 =", "completion": "4", "answer": 1.0, "reward_reward": None,
                        "reward": 1.0, "advantage": 0.0, "note": "ok"}  # fmt: skip
    assert shown == ["completions:", "  ...'2 + 2 =' -> '4' (reward 1, advantage +0.000)"]
    assert table.flush() == [] and len(path.read_text().splitlines()) == 4  # the window's rows written once
    fresh = CompletionsTable()
    fresh.start(tmp_path, main=True)
    fresh.add(0, args, torch.tensor([[1.0, 0.0]], dtype=torch.float64), ["answer", "b"], reward, advantage, {})
    fresh.flush()
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0]  # a fresh run starts it again


class Cells(HTMLParser):
    """The cells of an HTML table (each stripped, as markdown strips them), a <br> a newline."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self.inside = False

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.rows[-1].append("")
            self.inside = True
        elif tag == "br":
            self.rows[-1][-1] += "\n"

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.inside = False
            self.rows[-1][-1] = self.rows[-1][-1].strip()

    def handle_data(self, data):
        if self.inside:
            self.rows[-1][-1] += data


def shown(value) -> str:
    """A value (text as it is, others as JSON) as the table cell shows it: stripped, its line ends newlines, a tab a
    space, other control characters \ufffd."""
    text = re.sub(r"\r\n?", "\n", value if isinstance(value, str) else json.dumps(value)).replace("\t", " ")
    return re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", "\ufffd", text).strip()


class TableTracker:
    """A tracker with accelerate's log_table (wandb's, clearml's), recording its calls."""

    name = "wandb"

    def __init__(self):
        self.calls = []

    def log_table(self, table_name, columns=None, data=None, dataframe=None, step=None):
        self.calls.append((table_name, columns, data, step))


def test_a_tracker_with_log_table_gets_the_windows_rows_as_the_file_holds_them(tmp_path):
    markdown_to_safe_html = pytest.importorskip("tensorboard.plugin_util").markdown_to_safe_html
    table, wandb, numbers_only = CompletionsTable(), TableTracker(), SimpleNamespace(name="mlflow")
    texts = []
    writer = SimpleNamespace(add_text=lambda *args, **kwargs: texts.append((args, kwargs)), flush=lambda: None)
    tensorboard = SimpleNamespace(name="tensorboard", tracker=writer)
    table.start(tmp_path, main=True)
    chat = [{"role": "user", "content": "2 + 2 ="}]
    args = {"prompts": [chat, "1 + 1 ="], "completions": ["<think>4 | 2*2*1</think>\n4", "2"]}
    values = torch.tensor([[1.0, NAN], [0.0, 0.5]], dtype=torch.float64)
    reward, advantage = torch.tensor([1.0, 0.25], dtype=torch.float64), torch.tensor([0.5, -0.5])
    table.add(4, args, values, ["answer", "step"], reward, advantage, {"length": np.array([3, 1])})
    assert table.flush([numbers_only, wandb, tensorboard])  # the one without log_table gets nothing, and nothing fails
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    columns = ["step", "prompt", "completion", "answer", "reward_step", "reward", "advantage", "length"]
    as_cells = [[json.dumps(v) if isinstance(v, list) else v for v in row.values()] for row in rows]  # a chat: JSON
    assert [list(row) for row in rows] == [columns] * 2
    assert wandb.calls == [(TAG, columns, as_cells, 4)]
    assert as_cells == [
        [4, json.dumps(chat), "<think>4 | 2*2*1</think>\n4", 1.0, None, 1.0, 0.5, 3],
        [4, "1 + 1 =", "2", 0.0, 0.5, 0.25, -0.5, 1],
    ]
    (tag, text), step = texts[0][0], texts[0][1]["global_step"]
    cells = Cells()  # the markdown table as TensorBoard shows it: <think>, |, * and the newline as written
    cells.feed(markdown_to_safe_html(text))
    assert (tag, step) == (TAG, 4) and cells.rows == [columns, *([shown(v) for v in row] for row in as_cells)]
    assert table.flush([wandb, tensorboard]) == [] and len(wandb.calls) == len(texts) == 1  # handed over once


# --------------------------------------------------------------------------- through a run

REWARDS = '''
def shaped(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, **columns):
    """The share of 1s, None for each group's first completion; logs the state, the mean length, each length."""
    log_metric("called_at", trainer_state.global_step)
    log_metric("epochs_done", trainer_state.epoch)
    log_metric("of_steps", trainer_state.max_steps)
    log_metric("mean_length", sum(len(ids) for ids in completion_ids) / len(completion_ids))
    log_extra("length", [len(ids) for ids in completion_ids])
    texts = [c[-1]["content"] for c in completions]
    return [None if k % 4 == 0 else t.count("1") / max(len(t), 1) for k, t in enumerate(texts)]


def even(prompts, completions, completion_ids, **kwargs):
    """True where the completion has an even number of tokens (a bool), None for each group's first."""
    return [None if k % 4 == 0 else len(ids) % 2 == 0 for k, ids in enumerate(completion_ids)]
'''


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo_rewards")
    rng = random.Random(0)
    rows = []
    for _ in range(24):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"prompt": [{"role": "user", "content": f"{a} + {b} ="}], "answer": str(a + b)})
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "rewards.py").write_text(REWARDS)
    return {"root": root, "model": tiny_llama(root / "llama"), "data": root / "prompts.jsonl"}


@pytest.mark.parametrize("scale", ["group", "batch"])
def test_a_run_logs_what_its_rewards_log_and_writes_the_completions_table(folders, tmp_path, capsys, scale):
    rewards = folders["root"] / "rewards.py"
    summary = in_process(
        tmp_path / "run", "--model", f"hf:{folders['model']}", "--dataset", str(folders["data"]),
        "--reward", f"{rewards}:shaped", f"{rewards}:even", "--reward-weights", "1", "0.5", "--num-generations", "4",
        "--max-new-tokens", "6", "--batch-size", "2", "--max-steps", "3", "--log-every-steps", "1",
        "--eval-every-steps", "0", "--seed", "3", "--scale-rewards", scale,
    )  # fmt: skip
    train = [m for m in read_metrics(tmp_path / "run") if m["kind"] == "train"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert [m["called_at"] for m in train] == [0, 1, 2] and [m["of_steps"] for m in train] == [3] * 3
    per_epoch = summary["train_rollouts_per_epoch"]
    assert [m["epochs_done"] for m in train] == pytest.approx([s / per_epoch for s in range(3)])
    assert [r["step"] for r in rows] == [0] * 8 + [1] * 8 + [2] * 8  # batch 2 x G 4: every completion of a rollout
    for step, line in enumerate(train):
        window = rows[8 * step : 8 * step + 8]
        assert line["mean_length"] == pytest.approx(sum(r["length"] for r in window) / 8)
        assert line["mean_length"] == pytest.approx(line["completion_length"])
        scorable = [r["reward"] for r in window if r["reward"] is not None]
        assert len(scorable) == 6 and line["reward"] == pytest.approx(sum(scorable) / 6)  # the 2 unscorable left out
        expected = trl_advantages([NAN if r["reward"] is None else r["reward"] for r in window], 4, scale)
        assert [r["advantage"] for r in window] == pytest.approx(expected, abs=1e-5)
    for k, row in enumerate(rows):
        assert set(row) == {"step", "prompt", "completion", "shaped", "even", "reward", "advantage", "length"}
        if k % 4 == 0:
            assert row["shaped"] is None and row["even"] is None and row["reward"] is None and row["advantage"] == 0
            continue
        assert row["shaped"] == pytest.approx(row["completion"].count("1") / max(len(row["completion"]), 1))
        assert row["even"] == float(row["length"] % 2 == 0)  # a bool, as 1.0 or 0.0
        assert row["reward"] == pytest.approx(row["shaped"] + 0.5 * row["even"])
        assert isinstance(row["prompt"], list) and row["prompt"][-1]["content"].endswith(" =")
    printed = capsys.readouterr().out
    assert printed.count("completions:\n  ...'") == 3 and "(reward " in printed and "advantage " in printed


def test_tensorboard_gets_each_windows_rows_as_a_markdown_table_in_a_text_summary(folders, tmp_path):
    markdown_to_safe_html = pytest.importorskip("tensorboard.plugin_util").markdown_to_safe_html
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    in_process(
        tmp_path / "run", "--model", f"hf:{folders['model']}", "--dataset", str(folders["data"]),
        "--reward", f"{folders['root'] / 'rewards.py'}:shaped", "--num-generations", "4", "--max-new-tokens", "6",
        "--batch-size", "2", "--max-steps", "2", "--log-every-steps", "1", "--eval-every-steps", "0",
        "--report-to", "tensorboard", "--run-name", "grpo",
    )  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(next((tmp_path / "run" / "trackers" / "grpo").rglob("events.*")).parent))
    events.Reload()
    summaries = events.Tensors(f"{TAG}/text_summary")  # torch's add_text: the text plugin's summary
    assert [e.step for e in summaries] == [0, 1] and [r["step"] for r in rows] == [0] * 8 + [1] * 8
    for summary in summaries:
        cells = Cells()  # the markdown rendered as TensorBoard's Text tab renders it
        cells.feed(markdown_to_safe_html(summary.tensor_proto.string_val[0]))
        header, *body = cells.rows
        window = [r for r in rows if r["step"] == summary.step]
        assert header == list(window[0]) == ["step", "prompt", "completion", "shaped", "reward", "advantage", "length"]
        expected = [[shown(v) for v in row.values()] for row in window]
        assert body == expected  # completions, rewards: the file's
    assert any(r["reward"] is not None for r in rows)
