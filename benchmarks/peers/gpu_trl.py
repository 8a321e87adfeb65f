"""A TRL job of the GPU comparison (gpu_worker.py runs it): SFTTrainer, DPOTrainer or GRPOTrainer, configured as TRL's
docs show and set to the job anytrain runs (gpu_anytrain.py): the same model, data, batch, steps, LR (constant, no
warm-up), AdamW (fused, weight decay 0), clipping at 1.0, bf16 autocast on a GPU, no gradient checkpointing (TRL's SFT
default is on), LoRA rank 16 alpha 32 on every linear projection; SFT packed (bfd_split: texts split, not cut, as
anytrain's packing; TRL then feeds the batch as one padding-free row, which SDPA attends over whole under a mask), the
loss on the answers; DPO's reference precomputed (precompute_ref_log_probs: anytrain's cached reference); GRPO's
rollout the model's generate, one generation per step, grpo_job's settings.

Figures: each step's seconds (between the ends of consecutive optimizer steps, CUDA synchronised: what anytrain's
one-step log windows time), each step's tokens (the non-padding tokens of the batch the loss reads; GRPO's prompts
and completions), their median rate after the warm-up steps, the first and last logged loss."""

from __future__ import annotations

import importlib.util
import statistics
import time
from pathlib import Path

from transformers import TrainerCallback
from trl_run import lora_config  # the TRL jobs' LoRA: every linear projection, no dropout


class StepClock(TrainerCallback):
    """perf_counter at the start of training and at the end of each optimizer step, the GPU synchronised first."""

    def __init__(self):
        self.marks: list[float] = []

    def mark(self) -> None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.marks.append(time.perf_counter())

    def on_train_begin(self, args, state, control, **kwargs):
        self.marks = []
        self.mark()

    def on_step_end(self, args, state, control, **kwargs):
        self.mark()


def tokens_in(inputs: dict) -> int:
    """The real tokens of a batch the loss reads: GRPO's prompts and completions, else the attention mask's, else
    (a padding-free row) every token."""
    if "completion_mask" in inputs and "prompt_mask" in inputs:
        return int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
    if "attention_mask" in inputs:
        return int(inputs["attention_mask"].sum())
    return int(inputs["input_ids"].numel())


def common(job: dict, cuda: bool) -> dict:
    """The settings every trainer shares."""
    return dict(
        output_dir=job["run_dir"], max_steps=job["steps"], learning_rate=job["lr"], lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch_fused", logging_steps=1,
        save_strategy="no", eval_strategy="no", report_to="none", seed=42, bf16=cuda, gradient_checkpointing=False,
        use_cpu=not cuda, dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip


def reward(rewards: str):
    spec = importlib.util.spec_from_file_location("rewards", rewards)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ones


def trainer_for(job: dict, cuda: bool, train):
    """The job's TRL trainer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(job["model"])
    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    lora = job["variant"] == "lora"
    peft = lora_config(16, 32) if lora else None
    kwargs = dict(model=model, train_dataset=train, processing_class=tokenizer, peft_config=peft)
    if job["task"] == "sft":
        from trl import SFTConfig, SFTTrainer

        config = SFTConfig(**common(job, cuda), per_device_train_batch_size=job["rows"], max_length=job["length"],
                           packing=True, packing_strategy="bfd_split", completion_only_loss=True)  # fmt: skip
        return SFTTrainer(args=config, **kwargs)
    if job["task"] == "dpo":
        from trl import DPOConfig, DPOTrainer

        config = DPOConfig(**common(job, cuda), per_device_train_batch_size=job["rows"], max_length=job["length"],
                           beta=0.1, loss_type=["sigmoid"], precompute_ref_log_probs=True)  # fmt: skip
        return DPOTrainer(args=config, **kwargs)
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        **common(job, cuda), per_device_train_batch_size=job["prompts"] * job["generations"],
        num_generations=job["generations"], steps_per_generation=1, gradient_accumulation_steps=1,
        max_completion_length=job["new_tokens"], temperature=1.0, top_p=1.0, top_k=0, num_iterations=1, beta=0.0,
        loss_type="dapo", scale_rewards="group", epsilon=0.2, mask_truncated_completions=False, use_vllm=False,
        log_completions=False,
    )  # fmt: skip
    return GRPOTrainer(args=config, reward_funcs=[reward(job["rewards"])], **kwargs)


def run(job: dict) -> dict:
    """Train, then the figures (the module's docstring)."""
    import datasets
    import torch

    cuda = torch.cuda.is_available()
    train = datasets.load_dataset("json", data_files=str(Path(job["data"]) / "train.jsonl"), split="train")
    trainer = trainer_for(job, cuda, train)
    clock, counts = StepClock(), []
    trainer.add_callback(clock)
    compute_loss = trainer.compute_loss

    def counted(model, inputs, *args, **kwargs):
        counts.append(tokens_in(inputs))
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = counted
    trainer.train()
    seconds = [b - a for a, b in zip(clock.marks, clock.marks[1:])]
    rates = [n / s for n, s in list(zip(counts, seconds))[job["warmup"] :]]
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    figures = {"tokens_per_s": statistics.median(rates), "step_tokens_per_s": rates, "steps": trainer.state.global_step,
               "loss_first": losses[0], "loss_last": losses[-1], "step_tokens": counts,
               "attention": trainer.model.config._attn_implementation}  # fmt: skip
    trainer.accelerator.free_memory()
    del trainer
    return figures
