"""The conformance suite's one measurement: a run of one plain SGD step, whose update divided by the learning rate
must be the gradient of a method's formula, computed by the test itself in float64.

Under `sgd_flags` (no momentum, no weight decay, no clipping, a constant learning rate from the first step, float32)
an optimizer step is w1 = w0 - lr g, so (w0 - w1) / lr is the gradient g anytrain computed for its loss, whatever code
path it took (fused log-probabilities, packing, accumulation). The test writes the method's formula out and
differentiates it with autograd on a float64 copy of the starting model (full logits, plain log_softmax, each text
alone and unpadded); `relative_difference` compares the two over every trainable parameter:

    ||(w0 - w1) / lr - g|| / ||g||

float32 training against float64 autograd is ~1e-6 apart; a wrong formula (a missing term, a mean over the wrong
count, a token too many) is off by far more than `TOLERANCE`. `trained` runs the step in process, or launched on 2
gloo ranks (each rank half the step's rows): the same formula holds on both.
"""

from __future__ import annotations

from pathlib import Path

import torch

TWO_RANKS = {"two ranks": ["--batch-size", "2"]}  # launched: 2 ranks x 2 rows, the step's 4 rows
TOLERANCE = 1e-4
LR = 0.5  # large enough that the update stands far above float32's rounding of the weights


def sgd_flags(lr: float = LR, steps: int = 1) -> list[str]:
    """Plain SGD for `steps` optimizer steps at a constant `lr`, keeping the last step's weights."""
    return [
        "--optimizer", "sgd", "--momentum", "0", "--weight-decay", "0", "--max-grad-norm", "0",
        "--schedule", "constant", "--warmup-steps", "0", "--lr", str(lr), "--max-steps", str(steps),
        "--final-weights", "last", "--log-every-steps", "1",
    ]  # fmt: skip


def trained(run_dir: Path, flags: list[str], ranks: int = 1) -> dict:
    """The run of the step and its summary: in process, or launched on `ranks` gloo ranks (multi_cpu.yaml)."""
    from conftest import launch, read_summary
    from hfchecks import in_process

    if ranks == 1:
        return in_process(run_dir, *flags)
    done = launch("multi_cpu.yaml", *flags, "--output-dir", str(run_dir))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    summary = read_summary(run_dir)
    assert summary["scenario"]["num_processes"] == ranks
    return summary


def float64_model(folder: Path, auto_class: str = "AutoModelForCausalLM") -> torch.nn.Module:
    """A transformers model loaded in float64 (dropout is off in the tests' models), in training mode."""
    import transformers

    model = getattr(transformers, auto_class).from_pretrained(folder, dtype=torch.float64)
    model.config.use_cache = False
    return model.train()


def weights(folder: Path, auto_class: str = "AutoModelForCausalLM") -> dict[str, torch.Tensor]:
    """The named parameters of the model saved in `folder` (a run's exported `hf` folder), in float64."""
    return {name: p.detach() for name, p in float64_model(folder, auto_class).named_parameters()}


def gradients(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    """d loss / d parameter for every parameter (zero where the loss does not reach it)."""
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return {n: torch.zeros_like(p) if g is None else g for (n, p), g in zip(params.items(), grads)}


def relative_difference(start: dict, end: dict, grads: dict, lr: float = LR) -> float:
    """||(start - end) / lr - grads|| / ||grads||, over every parameter the gradient names."""
    assert start.keys() == end.keys() == grads.keys(), (start.keys() ^ end.keys(), start.keys() ^ grads.keys())
    num = sum(((start[n] - end[n]) / lr - grads[n]).pow(2).sum() for n in grads)
    den = sum(g.pow(2).sum() for g in grads.values())
    assert den > 0, "the formula's gradient is zero: the check would prove nothing"
    return float((num / den).sqrt())


def step_difference(model: torch.nn.Module, loss: torch.Tensor, run_dir: Path, lr: float = LR, **kw) -> float:
    """The relative difference between the run's first update over lr and the gradient of `loss` (a float64 formula
    of `model`, the starting model), against the weights the run exported (run_dir/hf)."""
    start = {n: p.detach() for n, p in model.named_parameters()}
    return relative_difference(start, weights(Path(run_dir) / "hf", **kw), gradients(model, loss), lr)


def token_logps(model: torch.nn.Module, ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log p(ids[t] | ids[:t]) for t = 1 .. len - 1: one text alone, unpadded, full logits, plain log_softmax."""
    x = torch.tensor([ids])
    logits = model(input_ids=x, use_cache=False).logits[0, :-1] / temperature
    return logits.log_softmax(-1).gather(1, x[0, 1:, None])[:, 0]


def answer_mask(tokenizer, text: str, spans: list[tuple[int, int]], special: bool) -> tuple[list[int], list[bool]]:
    """The text's tokens, and which of them hold any character of the spans (the answers)."""
    enc = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    marks = [any(a < e and s < b for s, e in spans) for a, b in enc["offset_mapping"]]
    return enc["input_ids"], marks


def trl_completion(tokenizer, prompt, answers: list) -> list[tuple[list[int], list[bool]]]:
    """TRL 1.16's tokenisation of a prompt and its completions (DPOTrainer._prepare_dataset's tokenize_fn, SFTTrainer's
    for prompt-completion rows): text gets the end-of-text token after each completion and is tokenised whole
    (tokenizer(text)); a chat is rendered by the chat template (the prompt with its generation prompt). The completion
    starts where the prompt's tokens and each prompt + completion's part (trl.data_utils.common_prefix_length), the
    earliest over the completions. Returns each sequence's ids and which are completion tokens."""

    def ids(part, **kw) -> list[int]:
        if isinstance(part, str):
            return tokenizer(part)["input_ids"]
        return tokenizer.apply_chat_template(part, tokenize=True, return_dict=True, **kw)["input_ids"]

    end = tokenizer.eos_token if isinstance(prompt, str) else None
    fulls = [ids(prompt + a + end) if end else ids(prompt + a) for a in answers]
    alone = ids(prompt, add_generation_prompt=True) if not isinstance(prompt, str) else ids(prompt)
    shared = min(next((k for k, (a, b) in enumerate(zip(alone, f)) if a != b), min(len(alone), len(f))) for f in fulls)
    return [(f, [k >= shared for k in range(len(f))]) for f in fulls]


def answer_logps(model: torch.nn.Module, ids: list[int], mask: list[bool], temperature: float = 1.0) -> torch.Tensor:
    """The log-probabilities of the answer tokens (mask) of one sequence, each predicted from the tokens before it."""
    keep = torch.tensor(mask[1:])
    assert not mask[0], "a sequence's first token is predicted by nothing"
    return token_logps(model, ids, temperature)[keep]
