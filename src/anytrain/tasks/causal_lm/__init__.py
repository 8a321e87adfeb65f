"""The causal-LM base: everything the transformers causal-LM tasks (hf:lm, sft, dpo, kto, grpo, distill) share, and the
preference pairs the reward model reads too. Not a task: nothing here is registered.

    task.py        CausalLM, their abstract base: the model, its fused output layer, reload, export, sample
    tokens.py      NextTokenLoss: the next-token loss and evaluation (hf:lm, sft)
    head.py        CausalLMHead, the module the loop trains: the fused loss and the per-token log-probabilities
    logprobs.py    per-token and per-sequence log-probabilities at a temperature; a group's prompt read once
    generation.py  generate: a complete sampling config, the stop ids, a group's prompt read once
    sampler.py     keyed sampling: TRL's filters (repetition penalty, temperature, top-k, top-p, min-p), the noise
    rollout_options.py  the rollout engine's options, which grpo's and distill's inherit
    slots.py       the training prompts as the loader's slots, a rollout's per process (grpo, distill)
    sampled.py     SampledCausalLM, grpo's and distill's base: sampling a rollout and holding it, the figures, the table
    answers.py     evaluation's generated answers (exact match) and `anytrain sample`'s reply
    prompts.py     chat messages checked and rendered by the template
    chats.py       sft's chats and instructions, rendered and tokenised, the answers' tokens learned
    pairs.py       preference pairs (dpo, reward), rendered and tokenised, TRL's implicit-prompt split
    reference.py   the frozen reference (dpo, grpo): a live copy, or the model with its adapter off
    cached.py      dpo's and kto's reference log-probabilities, computed once before step 0 and saved
    tools.py       tool calling: the tools' schemas, running a call, parsing a turn
    divergence.py  distill's generalized JSD between a teacher and the model, a chunk of tokens at a time
    completions.py the completions table of the tasks that sample their own completions (grpo, distill)
    figures.py     their time and tool figures in the training log lines
"""
