"""What on-policy distillation buys on the bundled sums: a small student taught by a larger model trained there,
either on-policy (`--task distill`: the student writes its own answers, the teacher's next-token distribution grades
every token) or offline (the same student SFT'd on the teacher's own sampled answers), at equal steps, each scored on
held-out sums.

The sums are the bundled ones with every number --digits wide (sums.py's `digits`; 0: the bundled 4 to 6): a
model this small learns to copy digits that sit at fixed distances, not digits it must find by their content.
Every run is an anytrain run (anytrain.train, in this process) in OUT/NAME, its log in OUT/NAME.log:
    teacher    a tiny chat Llama (--teacher-width x --teacher-layers), SFT'd on the `tool-sums` chats (a sum, the add
               call, the tool's answer, the reply) for --teacher-steps
    student    a smaller one (--student-width x --student-layers), the same tokenizer, SFT'd on the same chats for
               --student-steps (0: untrained): a student that already answers in the tool's form, as one distils in
               practice; both branches start from it
    on-policy  --task distill --teacher hf:OUT/teacher/hf on the first --steps x --batch prompts of `sum-questions`,
               with the add tool: --steps steps of --batch prompts, each answered once by the student
    offline    the teacher answers the same prompts once each (anytrain's rollout engine, sampled at the same
               temperature, the tool called and answered as in training); --task sft on those conversations for the
               same --steps steps of --batch chats, the same learning rate
One function then answers held-out sums (another seed's, asked in neither set) greedily with each of the four hf/
folders through the same rollout code, and counts the answers whose final reply is the sum (right), that call add
(called), whose calls ran without an error (well formed; malformed turns count as calls that did not) and that called
add with the question's two numbers (right call). It prints a table and writes OUT/results.json.

    python examples/distill_sums.py --out runs/distill_sums
    python examples/distill_sums.py --quick --out runs/distill_sums_quick     # seconds: the tests' size

docs/examples.md gives its figures: the teacher answers most held-out sums, no student does in either
branch; on-policy distillation keeps the student's well-formed calls where SFT on the teacher's sampled answers, a
third of them malformed, teaches the student to break its calls.

The models' chat template is the tests' tool template (tests/hfmodels.py, Qwen 2.5's layout) with the tools block
cut to the tools' names ("Tools: add"): the JSON schema would be ~300 of the ~500 tokens of a chat, which the models
would read on every step and learn nothing from. OUT/teacher is reused when its hf/ folder is there (--reuse-teacher).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from anytrain.data import sums  # noqa: E402

HELDOUT_SEED = sums.SEED + 7  # neither the chats' seed nor the questions'
TOOLS = "anytrain.data.sums:add"
POSITIONS = 512  # a chat with a wrong first call is ~250 tokens
CALLS = 2  # the calls an answer may make: the chats make one, or a wrong one and the right one


# --------------------------------------------------------------------------- the models and the data
def template() -> str:
    """The tests' tool template with its tools block cut to the tools' names."""
    from hfmodels import TOOLS_TEMPLATE

    start, end = TOOLS_TEMPLATE.index("# Tools"), TOOLS_TEMPLATE.index("{% elif messages[0]['role'] == 'system' %}")
    names = "Tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}<|im_end|>{{ nl }}"
    return TOOLS_TEMPLATE[:start] + names + TOOLS_TEMPLATE[end:]


def build(folder: Path, width: int, layers: int, seed: int) -> Path:
    """A random Llama (tests/hfmodels.py's config) with the tool tokenizer and the short template, as a hub folder."""
    import torch
    from hfmodels import llama_config, tool_tokenizer
    from transformers import LlamaForCausalLM

    tokenizer = tool_tokenizer()
    tokenizer.chat_template = template()
    torch.manual_seed(seed)
    LlamaForCausalLM(llama_config(tokenizer, width, layers, POSITIONS)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def training_prompts(count: int, digits: int | None) -> list[dict]:
    """The first `count` bundled sum-questions (prompt: the user's question; answer)."""
    return sums.load_sum_questions(digits=digits).select(range(count)).to_list()


def held_out(count: int, digits: int | None) -> list[dict]:
    """`count` sums asked neither in the chats nor in the questions."""
    seen = {r["messages"][0]["content"] for r in sums.rows(digits=digits)}
    seen |= {r["messages"][0]["content"] for r in sums.rows(seed=sums.SEED + 1, digits=digits)}
    fresh: dict[str, dict] = {}  # the first `count` distinct ones (2 digits: 8,100 sums, most of them seen)
    for row in sums.rows(20 * count, HELDOUT_SEED, digits):
        if len(fresh) < count and row["messages"][0]["content"] not in seen:
            fresh.setdefault(row["messages"][0]["content"], row)
    return [{"prompt": r["messages"][:1], "answer": r["answer"]} for r in fresh.values()]


# --------------------------------------------------------------------------- answering: the rollout engine
def answer_all(folder: Path, rows: list[dict], seed: int | None, max_new_tokens: int) -> list:
    """Each row answered once as a conversation with the add tool (calls parsed, run, answered as in training):
    greedily (seed None) or sampled at temperature 1 by keys of (seed, the row)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from anytrain.tasks.causal_lm.generation import Sampling, completion_keys, stop_ids
    from anytrain.tasks.causal_lm.turns import Conversation, Toolkit, converse

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    schemas = sums.schema()
    stops = stop_ids(tokenizer, model.generation_config.eos_token_id, True)
    kit = Toolkit(tokenizer, stops, model.config.max_position_embeddings, CALLS, 5.0)
    sampling = Sampling(max_new_tokens, tuple(stops), stops[0])
    keys = None if seed is None else completion_keys(seed, 0, 0, torch.arange(len(rows)), 1)
    talks = []
    for start in range(0, len(rows), 64):
        part = [Conversation(tokenizer.apply_chat_template(r["prompt"], tools=schemas, add_generation_prompt=True,
                                                           tokenize=True, return_dict=True)["input_ids"],
                             {"add": sums.add}, schemas) for r in rows[start : start + 64]]  # fmt: skip
        with torch.no_grad():
            converse(model, part, None if keys is None else keys[start : start + 64], sampling, kit)
        talks += part
    return talks


def calls_of(talk) -> list[dict]:
    return [c["function"] for m in talk.messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]


def measured(talks: list, rows: list[dict]) -> dict:
    """The shares of the answers that are right, called add, called it with the question's numbers; of the call
    attempts (malformed turns counted), those that ran without an error."""
    attempts = sum(t.calls + t.malformed for t in talks)
    right, right_call = [], []
    for talk, row in zip(talks, rows):
        a, b = (int(x) for x in row["prompt"][0]["content"][len("What is ") : -1].split(" + "))
        right.append((talk.messages[-1].get("content") or "").strip() == row["answer"])
        right_call.append(any(c.get("arguments") == {"a": a, "b": b} for c in calls_of(talk)))
    return {"right": share(right), "called": share([t.calls > 0 for t in talks]),
            "well_formed": sum(t.calls - t.failed for t in talks) / attempts if attempts else 0.0,
            "right_call": share(right_call)}  # fmt: skip


def share(flags: list[bool]) -> float:
    return sum(flags) / len(flags)


# --------------------------------------------------------------------------- training: anytrain runs
def train(out: Path, **options) -> dict:
    """One anytrain run into `out`, what it prints in OUT/NAME.log; its summary, with its wall time."""
    import anytrain

    start = time.perf_counter()
    with (out.parent / f"{out.name}.log").open("w") as log, contextlib.redirect_stdout(log):
        with contextlib.redirect_stderr(log):
            summary = anytrain.train(output_dir=str(out), overwrite=True, progress=False, plot=False,
                                     eval_every_steps=0, final_weights="last", **options)  # fmt: skip
    return {**summary, "seconds": time.perf_counter() - start}


def splits(train_rows: list[dict], held: list[dict]):
    """A DatasetDict: the training rows, and a few held rows as the run's own validation and test (unused here)."""
    import datasets

    return datasets.DatasetDict({"train": datasets.Dataset.from_list(train_rows),
                                 "validation": datasets.Dataset.from_list(held),
                                 "test": datasets.Dataset.from_list(held)})  # fmt: skip


def teach_teacher(args: argparse.Namespace) -> dict:
    """The teacher: built, then SFT'd on the bundled tool-sums (reused when OUT/teacher/hf is there)."""
    out = args.out / "teacher"
    if args.reuse_teacher and (out / "hf" / "config.json").exists():
        return {**json.loads((out / "summary.json").read_text()), "seconds": 0.0}
    model = build(args.out / "teacher-init", args.teacher_width, args.teacher_layers, seed=1)
    return sft_on_sums(out, model, args, args.teacher_steps, args.teacher_batch, args.teacher_lr)


def sft_on_sums(out: Path, model: Path, args: argparse.Namespace, steps: int, batch: int, lr: float) -> dict:
    """`model` SFT'd on the first --teacher-chats tool-sums chats (at --digits) into `out`."""
    chats = sums.load_tool_sums(args.digits)
    data = chats.select(range(args.teacher_chats)) if args.teacher_chats < len(chats) else chats
    return train(out, model=f"hf:{model}", dataset=data, batch_size=batch, max_steps=steps, lr=lr,
                 max_length=POSITIONS, seed=args.seed, val_fraction=0.005, test_fraction=0.005)  # fmt: skip


def start_student(args: argparse.Namespace) -> tuple[Path, dict]:
    """The student both branches start from: built untrained (--student-steps 0), or then SFT'd on the same chats
    as the teacher for --student-steps (a student that already writes answers of the right kind)."""
    student = build(args.out / "student-init", args.student_width, args.student_layers, seed=2)
    if not args.student_steps:
        return student, {}
    run = sft_on_sums(args.out / "student", student, args, args.student_steps, args.teacher_batch, args.teacher_lr)
    return args.out / "student" / "hf", run


def on_policy(args: argparse.Namespace, student: Path, prompts: list[dict]) -> dict:
    """The student distilled on-policy: one epoch of the prompts, --steps steps of --batch."""
    data = splits(prompts, prompts[: args.batch])
    return train(args.out / "on-policy", task="distill", model=f"hf:{student}", teacher=f"hf:{args.out}/teacher/hf",
                 dataset=data, tools=[TOOLS], max_tool_calls=CALLS, max_new_tokens=args.max_new_tokens, beta=args.beta,
                 batch_size=args.batch, max_steps=args.steps, lr=args.lr, seed=args.seed,
                 log_every_steps=max(1, args.steps // 10))  # fmt: skip


def chat_of(talk, tokenizer) -> list[dict]:
    """A conversation's messages, to learn from: each model turn as parsed, or as its text where the parse does not
    render back (a call without a name: the parser read a broken call, the tool answered an error; no text)."""
    turns, start = [], None
    for k, learned in enumerate([*talk.learned, False]):
        if learned and start is None:
            start = k
        elif not learned and start is not None:
            turns.append(tokenizer.decode(talk.ids[start:k]).removesuffix("<|im_end|>"))
            start = None
    messages, turn = [], iter(turns)
    for message in talk.messages:
        if message["role"] == "assistant":
            text = next(turn)
            message = message if readable(message) else {"role": "assistant", "content": text}
        messages.append(message)
    return messages


def readable(message: dict) -> bool:
    """A parsed turn the chat template renders back: named calls, or text."""
    calls = message.get("tool_calls") or []
    if calls:
        return all(isinstance(c.get("function", {}).get("name"), str) for c in calls)
    return isinstance(message.get("content"), str)


def offline(args: argparse.Namespace, student: Path, prompts: list[dict]) -> dict:
    """The teacher's own sampled answers to the same prompts, then the student SFT'd on them for the same steps."""
    from transformers import AutoTokenizer

    start = time.perf_counter()
    talks = answer_all(args.out / "teacher" / "hf", prompts, args.seed, args.max_new_tokens)
    sampled = time.perf_counter() - start
    tools, tokenizer = json.dumps(sums.schema()), AutoTokenizer.from_pretrained(args.out / "teacher" / "hf")
    chats = [{"messages": p["prompt"] + chat_of(t, tokenizer), "tools": tools} for p, t in zip(prompts, talks)]
    (args.out / "teacher-samples.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    data = splits(chats, chats[: args.batch])
    done = train(args.out / "offline", task="sft", model=f"hf:{student}", dataset=data, batch_size=args.batch,
                 max_steps=args.steps, lr=args.lr, max_length=POSITIONS, seed=args.seed)  # fmt: skip
    return {**done, "seconds": done["seconds"] + sampled, "sampling_seconds": sampled,
            "teacher_samples": measured(talks, prompts)}  # fmt: skip


# --------------------------------------------------------------------------- the study
STAGES = {  # row name: (the folder scored, what trained it)
    "teacher": ("teacher/hf", "SFT on tool-sums"),
    "student, start": ("student/hf", "{start}"),
    "student, on-policy distilled": ("on-policy/hf", "--task distill, beta {beta}"),
    "student, SFT on the teacher's samples": ("offline/hf", "--task sft on the teacher's answers"),
}


def table(results: dict) -> str:
    lines = ["| model | parameters | training | steps | right | called | well formed | right call | seconds |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, (_, how) in STAGES.items():
        s, run = results["scores"][name], results["runs"].get(name, {})
        cells = [f"{s[k]:.3f}" for k in ("right", "called", "well_formed", "right_call")]
        steps, secs = run.get("optimizer_steps", 0), run.get("seconds", 0.0)
        how = how.format(beta=results["args"]["beta"], start="SFT on tool-sums" if run else "none")
        lines.append(f"| {name} | {results['parameters'][name]:,} | {how} | {steps} | " + " | ".join(cells)
                     + f" | {secs:.0f} |")  # fmt: skip
    return "\n".join(lines)


def parameters(folder: Path) -> int:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).num_parameters()


def study(args: argparse.Namespace) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runs = {"teacher": teach_teacher(args)}
    student, runs["student, start"] = start_student(args)
    prompts = training_prompts(args.steps * args.batch, args.digits)
    runs["student, on-policy distilled"] = on_policy(args, student, prompts)
    runs["student, SFT on the teacher's samples"] = offline(args, student, prompts)
    rows = held_out(args.heldout, args.digits)
    folders = {name: student if name == "student, start" else args.out / folder
               for name, (folder, _) in STAGES.items()}  # fmt: skip
    scores = {
        name: measured(answer_all(folder, rows, None, args.max_new_tokens), rows) for name, folder in folders.items()
    }
    sizes = {name: parameters(folder) for name, folder in folders.items()}
    return {
        "args": {k: str(v) for k, v in vars(args).items()},
        "runs": runs,
        "scores": scores,
        "parameters": sizes,
        "prompts": len(prompts),
        "heldout": len(rows),
        "seconds": time.perf_counter() - started,
    }


QUICK = dict(
    teacher_width=64,
    teacher_layers=2,
    teacher_steps=60,
    teacher_chats=400,
    teacher_batch=8,
    teacher_lr=1e-2,
    student_width=32,
    student_layers=1,
    student_steps=10,
    steps=3,
    batch=4,
    heldout=8,
)


def options(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/distill_sums"), help="the study's folder")
    p.add_argument("--quick", action="store_true", help="the tests' size: tiny models, a few steps (seconds)")
    p.add_argument("--teacher-width", type=int, default=128)
    p.add_argument("--teacher-layers", type=int, default=4)
    p.add_argument(
        "--digits", type=int, default=4, help="the width of every number of the sums (0: the bundled 4 to 6)"
    )
    p.add_argument("--teacher-steps", type=int, default=800, help="SFT steps of the teacher on tool-sums")
    p.add_argument("--teacher-batch", type=int, default=16)
    p.add_argument("--teacher-chats", type=int, default=sums.ROWS, help="the first N of the tool-sums chats")
    p.add_argument("--teacher-lr", type=float, default=3e-3)
    p.add_argument("--reuse-teacher", action="store_true", help="keep OUT/teacher where it is already trained")
    p.add_argument("--student-width", type=int, default=128)
    p.add_argument("--student-layers", type=int, default=2)
    p.add_argument(
        "--student-steps",
        type=int,
        default=300,
        help="SFT steps of the student on the teacher's chats before both branches (0: untrained)",
    )
    p.add_argument("--steps", type=int, default=100, help="optimizer steps of each branch")
    p.add_argument("--batch", type=int, default=8, help="prompts (on-policy) or chats (offline) per step")
    p.add_argument("--lr", type=float, default=3e-3, help="both branches' learning rate")
    p.add_argument("--beta", type=float, default=1.0, help="on-policy: distill's --beta (1: the reverse KL)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="the model's own tokens per answer")
    p.add_argument("--heldout", type=int, default=100, help="held-out sums scored")
    p.add_argument("--seed", type=int, default=1)
    if p.parse_known_args(argv)[0].quick:  # its sizes are the defaults: a flag given still wins
        p.set_defaults(**QUICK)
    args = p.parse_args(argv)
    args.digits = args.digits or None
    return args


def main(argv: list[str] | None = None) -> dict:
    args = options(argv)
    results = study(args)
    samples = results["runs"]["student, SFT on the teacher's samples"]["teacher_samples"]
    print(table(results))
    print(f"{results['prompts']} training prompts, {results['heldout']} held-out sums, {results['seconds']:.0f} s; the "
          "teacher's samples: " + ", ".join(f"{k.replace('_', ' ')} {v:.3f}" for k, v in samples.items()))  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    return results


if __name__ == "__main__":
    main()
