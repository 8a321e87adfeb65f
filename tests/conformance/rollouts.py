"""What the conformance cases of the tasks that sample their own completions (grpo, distill) read from their runs: a
model made to stop early now and then (`stopping`), each rollout the run trained on recorded with the weights that
sampled it (`recorded`: the task's roll_out wrapped), and each completion cut at its first stop token
(`completions`). Everything else each case recomputes itself (test_conformance_grpo.py, test_conformance_distill.py,
test_conformance_grpo_tools.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def stopping(folder, scale: float):
    """The Llama saved in `folder`, its output layer's <|im_end|> row set along the mean of its last hidden states
    (times `scale` over its squared norm), so that some completions stop early, at various lengths (else all run to
    --max-new-tokens: grpo's three normalisations of the loss are one, distill's per-token and per-completion means
    too). Returns the folder."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    stop = transformers.AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        ids = torch.randint(5, 300, (16, 20), generator=torch.Generator().manual_seed(0))
        mean = model(input_ids=ids, output_hidden_states=True).hidden_states[-1].flatten(0, 1).mean(0)
        model.lm_head.weight[stop] = scale * mean / mean.norm() ** 2
    model.save_pretrained(folder)
    return folder


@dataclass
class Recorded:
    """One rollout as the task's roll_out returned it, with the weights that sampled it (float64 copies), the rows
    of its slot and whether a repeated prompt was read once (--share-prompts)."""

    before: dict
    rollout: object
    rows: list[int]
    shared: bool


def recorded(monkeypatch, task_class) -> list[Recorded]:
    """Each rollout of the runs that follow, in order (the start-up check's first, then each step's)."""
    seen, original = [], task_class.roll_out

    def recording(self, ctx, slot):
        model = ctx.accelerator.unwrap_model(ctx.model)
        before = {n: p.detach().double().clone() for n, p in model.named_parameters()}
        rollout = original(self, ctx, slot)
        seen.append(Recorded(before, rollout, list(slot.rows), self.engine.shared is not None))
        return rollout

    monkeypatch.setattr(task_class, "roll_out", recording)
    return seen


def completions(tokenizer, rows, new: int) -> list[tuple[list[int], list[int]]]:
    """Each row's (prompt, completion) tokens (rows: generation.Completions): the prompt without its left padding;
    the completion through its first stop token (end-of-text, ChatML's <|im_end|>), or all `new` of them."""
    stops = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
    out = []
    for ids, mask in zip(rows.ids.tolist(), rows.mask.tolist()):
        prompt = [t for t, m in zip(ids[: rows.width], mask[: rows.width]) if m]
        region = ids[rows.width : rows.width + new]
        end = next((k + 1 for k, t in enumerate(region) if t in stops), len(region))
        out.append((prompt, region[:end]))
    return out
