"""The specification of `--task grpo --tools`: an optimizer step under plain SGD is lr times the gradient of TRL
1.16's GRPO loss (dapo, group-scaled advantages) on the step's conversations, the tools' tokens masked out
(GRPOTrainer._tool_call_loop's tool_mask: 0 for the tools' answers, 1 for the model's turns; the loss and its count
over `completion_mask * tool_mask`). Each conversation is rebuilt here, independently of anytrain's rollout code:

- the prompt: the row's chat rendered by the template with the tools' schemas (transformers' get_json_schema) and
  its generation prompt;
- the model's first turn (scripted, tests/tooldata.py: a call to add, with a bad argument, to an unknown tool, a
  malformed one, or its own text) and its end-of-turn token;
- where the turn calls a tool: the tool's message as TRL makes it (str(a + b), or {"error": ...} for the bad
  argument and the unknown tool), its tokens the template's text between that turn and the next generation prompt
  (the conversation rendered with and without it), then the model's second turn, through its stop token or its
  remaining --max-new-tokens;
- rewards: 1.0 where a tool's message is the row's answer; advantages (r - group mean) / (group std + 1e-4);
- log-probabilities of the model's tokens only, the whole sequence read in float64.

The control: the same formula with the tools' tokens counted too is far off.
"""

from __future__ import annotations

import re

import pytest
import torch
from hfchecks import in_process
from hfmodels import tiny_llama
from rollouts import recorded
from sgd import LR, TOLERANCE, float64_model, gradients, relative_difference, sgd_flags, token_logps, weights
from tooldata import TOOLS, first_call, scripted, write_sums

from anytrain.tasks.grpo.task import GroupRelative

transformers = pytest.importorskip("transformers")

G, NEW = 5, 120  # completions per prompt, --max-new-tokens (a scripted call is 69 tokens and its end)
REWARD = """
def answered(prompts, completions, completion_ids, answer, **columns):
    return [float(any(m["role"] == "tool" and m["content"] == a for m in c)) for c, a in zip(completions, answer)]
"""


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("conform_grpo_tools")
    (root / "tools.py").write_text(TOOLS)
    (root / "rewards.py").write_text(REWARD)
    rows = write_sums(root / "data", train=2, held_out=1)
    return {"root": root, "model": tiny_llama(root / "llama", tools=True), "rows": rows}


def tool_message(kind: str, a: str, b: str) -> dict | None:
    """The tool's message for the call of `kind`, as TRL's _tool_call_loop makes it."""
    if kind == "right":
        return {"role": "tool", "name": "add", "content": str(add(int(a), int(b)))}
    if kind == "bad argument":
        try:
            add(int(a), "many")  # type: ignore[arg-type]
        except TypeError as e:
            return {"role": "tool", "name": "add", "content": str({"error": str(e)})}
    if kind == "unknown":
        return {"role": "tool", "name": "mul", "content": str({"error": "Tool mul not found."})}
    return None


def rebuilt(tokenizer, row: dict, kind: str, region: list[int]) -> tuple[list[int], list[bool], float]:
    """One conversation rebuilt (module docstring): the prompt's ids, which tokens of `region` (every token after
    the prompt, as the rollout holds them) are the model's, and the reward."""
    from transformers.utils import get_json_schema

    schemas = [get_json_schema(add)]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    stops = {end, tokenizer.eos_token_id}
    text = tokenizer.apply_chat_template(row["prompt"], tools=schemas, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer(text).input_ids
    a, b = re.findall(r"(\d+) \+ (\d+)", row["prompt"][-1]["content"])[0]
    call = first_call(kind, a, b)
    if call is None:  # the model's own first turn, through its stop
        own = next((k + 1 for k, t in enumerate(region) if t in stops), min(len(region), NEW))
        return prompt, [True] * own + [False] * (len(region) - own), 0.0
    first = tokenizer(call).input_ids + [end]
    assert region[: len(first)] == first
    answer = tool_message(kind, a, b)
    if answer is None:  # malformed: no call, the turn ends the conversation
        return prompt, [True] * len(first) + [False] * (len(region) - len(first)), 0.0
    args = {"a": int(a), "b": "many" if kind == "bad argument" else int(b)}
    turn = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": answer["name"], "arguments": args}}]}  # fmt: skip
    through = tokenizer.apply_chat_template([*row["prompt"], turn], tools=schemas, tokenize=False)
    whole = tokenizer.apply_chat_template(
        [*row["prompt"], turn, answer], tools=schemas, tokenize=False, add_generation_prompt=True
    )
    assert through.startswith(text) and whole.startswith(through)
    told = tokenizer(whole[len(through.rstrip("\n")) :]).input_ids  # after the turn's end-of-turn token
    assert region[len(first) : len(first) + len(told)] == told
    rest = region[len(first) + len(told) :]
    second = next((k + 1 for k, t in enumerate(rest) if t in stops), min(len(rest), NEW - len(first)))
    learned = [True] * len(first) + [False] * len(told) + [True] * second
    reward = float(answer["content"] == row["answer"])
    return prompt, learned + [False] * (len(region) - len(learned)), reward


def loss(model, pieces, adv: torch.Tensor, tools_too: bool) -> torch.Tensor:
    """TRL's dapo loss at one update per rollout: sum over the counted tokens of -A (ratio 1, its gradient the
    log-probability's), over their count."""
    total, count = 0.0, 0
    for (prompt, region, learned), a in zip(pieces, adv):
        counted = [m or tools_too for m in learned[: len(region)]]
        last = max((k for k, m in enumerate(counted) if m), default=-1) + 1
        logp = token_logps(model, prompt + region[:last])[len(prompt) - 1 :]
        mask = torch.tensor(counted[:last], dtype=torch.float64)
        total = total + (-(logp - logp.detach()).exp() * a * mask).sum()
        count += int(mask.sum())
    return total / count


def test_an_sgd_step_with_tools_is_the_gradient_of_trls_loss_on_the_models_tokens_alone(folders, tmp_path, monkeypatch):
    seen = recorded(monkeypatch, GroupRelative)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["model"])
    turns = scripted(monkeypatch, tokenizer)
    root = folders["root"]
    in_process(
        tmp_path / "run", "--task", "grpo", "--model", f"hf:{folders['model']}", "--dataset", str(root / "data"),
        "--tools", f"{root / 'tools.py'}:add", "--reward", f"{root / 'rewards.py'}:answered",
        "--num-generations", str(G), "--max-new-tokens", str(NEW), "--batch-size", "1", "--seed", "3",
        *sgd_flags(steps=1),
    )  # fmt: skip
    rollout, rows = seen[-1].rollout, seen[-1].rows
    kinds = [t["kind"] for t in turns[len(rows) * G : 2 * len(rows) * G]]  # the step's, after the start-up check's
    width, pieces, rewards = rollout.rows.width, [], []
    for k in range(len(kinds)):
        real = rollout.rows.mask[k].bool()
        region = rollout.rows.ids[k, width:][real[width:]].tolist()
        prompt, learned, reward = rebuilt(tokenizer, folders["rows"][rows[k // G]], kinds[k], region)
        assert rollout.rows.ids[k, :width][real[:width]].tolist() == prompt
        pieces.append((prompt, region, learned))
        rewards.append(reward)
    r = torch.tensor(rewards, dtype=torch.float64).view(-1, G)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
    assert adv.abs().max() > 0.1 and any(not all(m for m in p[2][: len(p[1])]) for p in pieces)
    model = float64_model(folders["model"])
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    end = weights(tmp_path / "run" / "hf")
    diff = relative_difference(start, end, gradients(model, loss(model, pieces, adv, False)), LR)
    control = relative_difference(start, end, gradients(model, loss(model, pieces, adv, True)), LR)
    print(f"grpo with tools: kinds {kinds}, rewards {rewards}, relative difference {diff:.2e} (tools' tokens counted: "
          f"{control:.2e})")  # fmt: skip
    assert diff < TOLERANCE and control > 100 * TOLERANCE
