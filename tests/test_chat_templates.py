"""Finding the answers in chats rendered by the chat templates of many model families (tests/templates.py):
each answer is the text the template adds after the turns before it rendered with the generation prompt, so
a template that closes a chat with its end-of-text token (Phi-3) trains every turn of a multi-turn chat; a
template that rewrites earlier turns (Qwen 3 drops the reasoning of answers before the last question) trains
turn by turn, each answer with the context the template gives it; one whose generation prompt is not how it
renders an answer (DeepSeek-R1 opens a <think> it strips from answers) is refused in one line. The learned
tokens are checked token by token: the runs of target tokens, decoded, are exactly the answers with the
template's end of turn. Empty answers are counted at start, and refused when every answer is empty."""

from __future__ import annotations

import pytest
from conftest import run_cli_error
from hfchecks import in_process, target_runs
from templates import templated_tokenizer
from textdata import write_jsonl

from anytrain.config import ConfigError
from anytrain.data import instructions
from anytrain.tasks.causal_lm.chats import Renderer, tokenise

pytest.importorskip("transformers")

CHAT = [
    {"role": "system", "content": "Reply tersely."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
    {"role": "user", "content": "And 3 + 3?"},
    {"role": "assistant", "content": "<think>\nagain\n</think>\n\n6"},
]
PLAIN = [{**turn, "content": turn["content"].split("</think>")[-1].strip()} for turn in CHAT]
# what each template makes an answer end with (what the model learns to stop with), after "4" and after "6"
ENDS = {
    "chatml": ("<|im_end|>\n", "<|im_end|>\n"),
    "llama3": ("<|eot_id|>", "<|eot_id|>"),
    "llama2": (" </s>", " </s>"),  # the template puts a space before the answer and before </s>
    "mistral": ("</s>", "</s>"),
    "phi3": ("<|end|>\n", "<|end|>\n<|endoftext|>"),  # the last answer is followed by the chat's closing token
    "gemma": ("<end_of_turn>\n", "<end_of_turn>\n"),
    "zephyr": ("</s>\n", "</s>\n"),
    "vicuna": ("</s>", "</s>"),
    "qwen3": ("<|im_end|>\n", "<|im_end|>\n"),
}
STARTS = {"llama2": " ", "vicuna": " "}  # the template's space between the prompt and the answer


def learned(name: str, chat: list) -> list[list[str]]:
    """Per text the chat is trained as: the decoded runs of its target tokens."""
    tokenizer = templated_tokenizer(name)
    found = []
    for text, spans in Renderer("messages", "messages", tokenizer, "rows", "train")({"messages": chat}, 0):
        found.append(target_runs(tokenizer, *tokenise(tokenizer, text, spans, False)))
    return found


@pytest.mark.parametrize("name", sorted(ENDS))
def test_every_answer_of_a_multi_turn_chat_is_learned_with_its_end_of_turn(name):
    start = STARTS.get(name, "")
    assert learned(name, PLAIN) == [[f"{start}4{ENDS[name][0]}", f"{start}6{ENDS[name][1]}"]]
    assert learned(name, PLAIN[1:3]) == [[f"{start}4{ENDS[name][1]}"]]  # one exchange, no system line


@pytest.mark.parametrize("name", sorted(set(ENDS) - {"qwen3"}))
def test_reasoning_kept_by_the_template_is_learned_with_the_answer(name):
    start = STARTS.get(name, "")
    content = [turn["content"] for turn in CHAT if turn["role"] == "assistant"]
    if name in ("llama3", "gemma", "llama2"):  # these templates trim the content
        content = [c.strip() for c in content]
    assert learned(name, CHAT) == [[f"{start}{content[0]}{ENDS[name][0]}", f"{start}{content[1]}{ENDS[name][1]}"]]


def test_a_template_that_drops_earlier_reasoning_trains_turn_by_turn():
    """Qwen 3 keeps an answer's reasoning only after the last question: in the whole chat the first answer has
    none, so each answer is trained on the turns through it, as the template renders them then."""
    assert learned("qwen3", CHAT) == [
        ["<think>\nadd them\n</think>\n\n4<|im_end|>\n"],
        ["<think>\nagain\n</think>\n\n6<|im_end|>\n"],
    ]


def test_a_generation_prompt_that_no_answer_starts_with_is_refused():
    with pytest.raises(ConfigError, match="does not render turn 2 as a continuation of its generation prompt"):
        learned("r1", PLAIN)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny Llama for each of two templates (tests/hfmodels.py's, with this tokenizer)."""
    import torch
    from hfmodels import llama_config
    from transformers import LlamaForCausalLM

    folders = {}
    for name in ("phi3", "qwen3"):
        folder = tmp_path_factory.mktemp(name)
        tokenizer = templated_tokenizer(name)
        torch.manual_seed(0)
        LlamaForCausalLM(llama_config(tokenizer)).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders[name] = folder
    return folders


def thinking(chat: list) -> list:
    """The chat with a line of reasoning before every answer."""
    return [
        {**turn, "content": f"<think>\nthe answer\n</think>\n\n{turn['content']}"}
        if turn["role"] == "assistant"
        else turn
        for turn in chat
    ]


def splits(folder, chats: list) -> str:
    """A folder of train (128 chats), validation and test (16 each) files."""
    folder.mkdir()
    for name, part in (("train", chats[:128]), ("validation", chats[128:144]), ("test", chats[144:])):
        write_jsonl(folder / f"{name}.jsonl", part)
    return str(folder)


def test_multi_turn_chats_train_with_either_template(models, tmp_path):
    chats = [row["messages"] for row in instructions.rows(160, seed=4)]
    earlier = sum(1 for chat in chats[:128] if sum(turn["role"] == "assistant" for turn in chat) == 2)
    assert earlier > 10  # chats with an earlier exchange
    flags = ("--max-steps", "2", "--max-length", "128")
    data = splits(tmp_path / "plain", [{"messages": chat} for chat in chats])
    summary = in_process(tmp_path / "phi3", "--model", f"hf:{models['phi3']}", "--dataset", data, *flags)
    assert summary["train_samples"] == 128 and summary["train_target_tokens"] > 0  # every chat one row
    data = splits(tmp_path / "thinking", [{"messages": thinking(chat)} for chat in chats])
    summary = in_process(tmp_path / "qwen3", "--model", f"hf:{models['qwen3']}", "--dataset", data, *flags)
    assert summary["train_samples"] == 128 + earlier  # a chat with an earlier answer: a text per answer


def test_empty_answers_are_counted_and_refused_when_all_are(models, tmp_path, capsys):
    chats = [row["messages"] for row in instructions.rows(40, seed=2)]
    for chat in chats[:5]:
        chat[-1] = {"role": "assistant", "content": " "}
    answers = sum(1 for chat in chats for turn in chat if turn["role"] == "assistant")
    data = write_jsonl(tmp_path / "some.jsonl", [{"messages": chat} for chat in chats])
    model = ["--model", f"hf:{models['phi3']}", "--max-steps", "1"]
    in_process(tmp_path / "run", *model, "--dataset", str(data))
    assert f"5 of {answers} assistant answers in {data} are empty: only their end of turn is learned" in (
        capsys.readouterr().out
    )
    for chat in chats:
        for turn in chat:
            turn["content"] = "" if turn["role"] == "assistant" else turn["content"]
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"messages": chat} for chat in chats])
    err = run_cli_error(capsys, [*model, "--dataset", str(empty), "--output-dir", str(tmp_path / "none")])
    assert f"every assistant answer in {empty} is empty: there is nothing to learn" in err
    assert not (tmp_path / "none").exists()
