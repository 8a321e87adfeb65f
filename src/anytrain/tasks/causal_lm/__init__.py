"""The causal-LM core that the transformers causal-LM tasks (lm, sft, dpo, grpo) compose rather than inherit: one
way to generate (tasks/causal_lm/generation.py: a complete sampling config the model's own generation config cannot
change, reproducible keyed sampling, the stop ids) and one way to take per-token log-probabilities at a temperature
(tasks/causal_lm/logprobs.py: through the chunked fused output layer of lmhead.py, never the full logits). Not a
task: nothing here is registered."""
