"""The five sections of options, one frozen dataclass each: every option a field made by `option()`, its facts
beside it.

    data   what is read and how it is batched        model  which network, and its sizes
    optim  optimizer, schedule, steps and batches   eval   validation and early stopping
    run    seed, run folder, logging, checkpoints, trackers, DDP
"""

from __future__ import annotations

from dataclasses import dataclass

from .facts import NON_NEGATIVE, POSITIVE, UNIT, option

HF_PREFIX = "hf:"  # --model hf:NAME_OR_FOLDER: a transformers model (hf.py builds it, tasks/ keys its tasks by it)


@dataclass(frozen=True)
class DataConfig:
    task: str = option(
        "auto",
        "what to learn: a task of the registry (README 'Tasks'), or your own task class as FILE.py:Class, FILE.py "
        "(the one task class it defines) or module:Class; auto = the first task of the registry that recognises the "
        "data (the start-up line says which and why)",
    )
    dataset: str = option(
        "digits",
        "a bundled dataset (digits, shakespeare, shakespeare-speakers, instructions, questions, preferences, "
        "tool-sums, sum-questions: docs/guide.md says what each holds), 'synthetic', a local parquet/csv/json/txt "
        "file, a folder of them or a save_to_disk folder, or a hub dataset name",
        model_parallel=True,
    )
    input_columns: list[str] = option(
        [],
        "feature columns (numbers or fixed-length lists of numbers); empty = every column but the label",
        model_parallel=True,
    )
    label_column: str = option(
        "label",
        "column holding the label: a class id or name (classify), a number (regress; several columns "
        "comma-separated), or a list of class ids or names (multilabel)",
        model_parallel=True,
    )
    num_classes: int = option(
        0, "number of classes; 0 = from the label feature or max label + 1", bounds=NON_NEGATIVE, model_parallel=True
    )
    val_fraction: float = option(
        0.1,
        "share of the data held out for validation when the dataset has no validation split",
        bounds=UNIT,
        model_parallel=True,
    )
    test_fraction: float = option(
        0.2, "share of the data held out for test when the dataset has no test split", bounds=UNIT, model_parallel=True
    )
    streaming: bool = option(
        False,
        "read the dataset as a stream (datasets' IterableDataset) instead of preparing it first: "
        "for datasets bigger than the disk. Needs --max-steps, a validation split in the dataset, and "
        "--num-classes unless the label is a ClassLabel; the main process reads, accelerate dispatches "
        "each rank its slice",
    )
    max_in_memory_mb: int = option(
        1024,
        "tables of numbers whose features (as float32) fit in this many MB are held as "
        "tensors, the fastest path; larger ones stay in memory-mapped Arrow files and are read per "
        "batch (0 = always Arrow). The summary's data_path says which",
        bounds=NON_NEGATIVE,
    )
    synthetic_samples: int = option(20000, "rows of the 'synthetic' dataset", bounds=POSITIVE, model_parallel=True)
    synthetic_features: int = option(64, "features of the 'synthetic' dataset", bounds=POSITIVE, model_parallel=True)
    synthetic_classes: int = option(10, "classes of the 'synthetic' dataset", bounds="[2, inf)", model_parallel=True)
    text_column: str = option(
        "",
        "the text column of a parquet/json/csv/hub dataset: with --label-column the text is classified, alone it "
        "is modelled (lm; for lm, with any model, empty = 'text')",
    )
    block_size: int = option(
        64,
        "context length in tokens of a text read as token windows (--model gpt: its positions); each training "
        "window holds block_size + 1 tokens",
        bounds=POSITIVE,
    )
    image_size: int = option(
        0, "images: resize every image to N x N pixels; 0 = the first training image's larger side", bounds=NON_NEGATIVE
    )
    augment: list[str] = option(
        ["crop", "flip"],
        "images: training augmentations, any of crop (random crop after padding by "
        "image_size/8) and flip (horizontal); none given = no augmentation",
        choices=("crop", "flip"),
    )
    num_workers: int = option(
        -1,
        "DataLoader worker processes per training process (0 = load in the training process); -1 = "
        "auto: 0 for tables and text (a batch is one index operation); for images 1 where it gets a core "
        "of its own (beside a GPU, or more cores than training threads), else 0 (docs/benchmarks.md has "
        "the figures)",
        bounds="[-1, inf)",
        resumable=True,
    )
    pin_memory: bool = option(
        False, "pin host memory of batches (helps host-to-GPU copies)", resumable=True, model_parallel=True
    )
    persistent_workers: bool = option(
        False, "keep DataLoader workers alive between epochs (needs num_workers > 0)", resumable=True
    )
    tokenizer: str = option(
        "auto",
        "text: char (the training text's characters), byte (UTF-8 bytes, 256 tokens), bpe (byte-level BPE "
        "trained on the training split, --vocab-size tokens, saved as tokenizer.json) or auto: for lm char when "
        "the training alphabet has at most 256 characters and covers the validation text, else byte; to "
        "classify text bpe (at most --vocab-size tokens). --vocab is its earlier name",
        choices=("auto", "char", "byte", "bpe"),
        aliases=("vocab",),
    )
    vocab_size: int = option(
        2000, "--tokenizer bpe: tokens in the vocabulary (the 256 bytes plus learned merges)", bounds="[256, inf)"
    )
    max_length: int = option(
        256,
        "tokens kept of each text a model reads whole (longer ones are truncated; a chat, a pair or a prompt as its "
        "task says); also the encoder's positions. Batches are padded to their longest text",
        bounds=POSITIVE,
    )
    packing: bool = option(
        False,
        "tasks that offer packing (transformers causal LMs): texts (chats) concatenated into rows of --max-length "
        "tokens, the attention and positions restarting at each text (no attention across texts); texts longer "
        "than a row are split instead of truncated",
    )


@dataclass(frozen=True)
class ModelConfig:
    """What a model factory receives, with the data's shape: `factory(model: ModelConfig, shape: DataShape)`."""

    name: str = option(
        "auto",
        "the model: mlp, cnn, resnet (classify; resnet needs images), encoder or bag (text classification) or "
        "gpt (lm) from the registry, or your own factory as package.module:function or path/to/file.py:function "
        "(README: 'Your own model and data'); auto = mlp for tables, resnet for images, bag for text to "
        "classify, gpt for text to model",
        model_parallel=True,
        flag="model",
    )
    hidden_sizes: list[int] = option([256, 256], "mlp, bag: hidden layer widths", bounds=POSITIVE, model_parallel=True)
    channels: list[int] = option(
        [16, 32],
        "cnn: conv channels (tabular inputs must form a square image); resnet: the width of each stage",
        bounds=POSITIVE,
        model_parallel=True,
    )
    blocks_per_stage: int = option(
        2, "resnet: residual blocks per stage (--channels 16 32 64 --blocks-per-stage 3 is ResNet-20)", bounds=POSITIVE
    )
    n_layer: int = option(4, "gpt, encoder: transformer blocks", bounds=POSITIVE)
    n_head: int = option(4, "gpt, encoder: attention heads per block (must divide n_embd)", bounds=POSITIVE)
    n_embd: int = option(128, "gpt, encoder, bag: embedding width", bounds=POSITIVE)
    ngrams: int = option(
        1,
        "bag: also average hashed n-grams of 2..N consecutive tokens (fastText-style; with --tokenizer char, "
        "character n-grams); 1 = tokens alone",
        bounds=POSITIVE,
    )
    ngram_buckets: int = option(
        65536, "bag with --ngrams > 1: hash buckets shared by the n-grams (extra embedding rows)", bounds=POSITIVE
    )
    dropout: float = option(
        0.2,
        "dropout after each hidden layer (gpt, encoder: on embeddings, attention and residuals)",
        bounds=UNIT,
        model_parallel=True,
    )
    gradient_checkpointing: bool = option(
        False,
        "transformers models (--model hf:...): recompute each block's activations in the backward pass instead "
        "of keeping them: less memory for about a third more compute, the same gradients",
        resumable=True,
    )
    lora_r: int = option(
        0,
        "tasks that offer LoRA (transformers causal LMs): train LoRA adapters of this rank (through peft) beside the "
        "frozen weights; 0 = full fine-tuning",
        bounds=NON_NEGATIVE,
    )
    lora_alpha: float = option(16.0, "LoRA: the adapters' output is scaled by alpha / r", bounds=POSITIVE)
    lora_dropout: float = option(0.0, "LoRA: dropout on the adapters' inputs", bounds=UNIT)
    lora_targets: str = option(
        "",
        "LoRA: the linear layers to adapt, by name, comma-separated (GPT-2: c_attn,c_proj,c_fc); empty = every "
        "linear projection of the blocks (attention and MLP), not the output layer",
    )


@dataclass(frozen=True)
class OptimConfig:
    epochs: int = option(40, "passes over the training split", bounds=POSITIVE, resumable=True, model_parallel=True)
    max_steps: int = option(
        0,
        "stop after this many optimizer steps; 0 = no limit",
        bounds=NON_NEGATIVE,
        resumable=True,
        model_parallel=True,
    )
    batch_size: int = option(
        32,
        "samples per process per forward pass: the global batch is batch_size x processes x grad_accum_steps; for "
        "grpo, prompts per process and optimizer step, each answered --num-generations times, the step's "
        "completions split into --grad-accum-steps micro-batches",
        bounds=POSITIVE,
        model_parallel=True,
    )
    grad_accum_steps: int = option(1, "forward/backward passes per optimizer step", bounds=POSITIVE)
    optimizer: str = option("adamw", "adamw or sgd", choices=("adamw", "sgd"), model_parallel=True)
    lr: float = option(2e-3, "peak learning rate", bounds=POSITIVE, model_parallel=True)
    momentum: float = option(0.9, "SGD momentum", bounds=NON_NEGATIVE, model_parallel=True)
    adam_beta1: float = option(0.9, "AdamW beta1", bounds=UNIT)
    adam_beta2: float = option(0.999, "AdamW beta2", bounds=UNIT)
    weight_decay: float = option(
        0.1,
        "weight decay (decoupled for AdamW), applied to weight matrices and embeddings only, not to biases or norms",
        bounds=NON_NEGATIVE,
        model_parallel=True,
    )
    schedule: str = option(
        "cosine",
        "constant, step or cosine (all with linear warm-up), counted in optimizer steps",
        choices=("constant", "step", "cosine"),
        model_parallel=True,
    )
    min_lr: float = option(0.0, "cosine schedule: the learning rate it decays to at the last step", bounds=NON_NEGATIVE)
    warmup_steps: int = option(
        20, "optimizer steps of linear warm-up from 0 to lr", bounds=NON_NEGATIVE, model_parallel=True
    )
    step_size: int = option(
        100,
        "'step' schedule: multiply the lr by gamma every step_size optimizer steps",
        bounds=POSITIVE,
        model_parallel=True,
    )
    gamma: float = option(0.5, "'step' schedule: decay factor", bounds="(0, 1]", model_parallel=True)
    loss: str = option(
        "auto",
        "the training loss: auto = the task's (cross-entropy; MSE for regress; BCE for multilabel), huber "
        "(regress), or your own fn(outputs, targets) -> scalar as package.module:fn or path/to/file.py:fn. "
        "Metrics and early stopping use the task's loss",
    )
    max_grad_norm: float = option(
        1.0,
        "clip the gradient norm to this on each optimizer step; 0 = no clipping",
        bounds=NON_NEGATIVE,
        model_parallel=True,
    )


@dataclass(frozen=True)
class EvalConfig:
    eval_every_steps: int = option(
        0, "also validate every N optimizer steps; 0 = only at epoch ends", bounds=NON_NEGATIVE, resumable=True
    )
    eval_windows: int = option(
        0,
        "validation windows per evaluation of a text read as token windows; 0 = every non-overlapping window",
        bounds=NON_NEGATIVE,
    )
    early_stopping_patience: int = option(
        0,
        "stop after this many validations without improvement of the --best-metric; 0 = off",
        bounds=NON_NEGATIVE,
        resumable=True,
    )
    early_stopping_min_delta: float = option(
        0.0, "improvement of the --best-metric smaller than this does not count", bounds=NON_NEGATIVE, resumable=True
    )
    best_metric: str = option(
        "auto",
        "the validation metric that picks the best weights (--final-weights best, checkpoints/best) and that early "
        "stopping watches, higher or lower being better as the task declares: auto = the task's headline metric, "
        "or any metric the task logs on validation (loss, accuracy, ...)",
    )
    final_weights: str = option(
        "best",
        "the weights the run ends with, evaluates on the test split and saves as model.safetensors: best = those of "
        "the best validation by --best-metric (when there is a validation split), last = the last step's",
        choices=("best", "last"),
        resumable=True,
    )


@dataclass(frozen=True)
class RunConfig:
    seed: int = option(42, "seed for weights, shuffling and splits", model_parallel=True)
    output_dir: str = option("runs/default", "run folder: config, metrics, weights, summary", resumable=True)
    log_every_steps: int = option(
        10,
        "log the training loss (and, with several processes, check for SIGTERM/SIGINT) every N optimizer steps",
        bounds=POSITIVE,
        resumable=True,
    )
    checkpoint_every_steps: int = option(
        0, "also save a checkpoint every N optimizer steps; 0 = only at epoch ends", bounds=NON_NEGATIVE, resumable=True
    )
    keep_checkpoints: int = option(
        2,
        "keep the newest K checkpoints (plus the best by --best-metric); 0 = keep all",
        bounds=NON_NEGATIVE,
        resumable=True,
    )
    resume: str = option(
        "",
        "continue from a checkpoint: bare --resume = latest in --output-dir, or a checkpoint folder; "
        "'auto' = latest if --output-dir has one, else start fresh (for restarted or re-queued jobs)",
        resumable=True,
    )
    overwrite: bool = option(False, "replace an existing run in --output-dir (otherwise refused)", resumable=True)
    progress: bool = option(True, "show a tqdm progress bar (main process only)", resumable=True)
    plot: bool = option(
        True,
        "draw the run's curves to curves.png in the run folder at the end (needs matplotlib; skipped without it)",
        resumable=True,
    )
    report_to: str = option(
        "none",
        "also log the metrics to an experiment tracker through accelerate: none, tensorboard, "
        "trackio, wandb, mlflow or all (every installed one); metrics.jsonl is always written",
        choices=("none", "tensorboard", "trackio", "wandb", "mlflow", "all"),
        resumable=True,
    )
    run_name: str = option(
        "", "the run's name in the tracker (default: the --output-dir folder's name)", resumable=True
    )
    peak_tflops: float = option(
        0.0,
        "one device's peak TFLOP/s for the MFU in summary.json and the last line; 0 = a table of GPUs by name and "
        "precision, a CPU's measured by matrix products once per machine (~/.cache/anytrain/cpu_peak.json)",
        bounds=NON_NEGATIVE,
        resumable=True,
    )
    ddp_bucket_mb: int = option(
        0,
        "several processes: gradients are all-reduced in buckets of this many MB while the backward "
        "pass goes on (DDP's bucket_cap_mb); the numbers do not change. 0 = auto: 5 on CPUs (gloo; "
        "1.33x the samples/s of 25 in docs/benchmarks.md), torch's 25 on GPUs",
        bounds=NON_NEGATIVE,
        resumable=True,
    )
    ddp_comm_hook: str = option(
        "none",
        "several processes: 'fp16' or 'bf16' rounds each gradient to 16 bits for the "
        "all-reduce (half the bytes; the weights then differ from a 1-process run by that rounding); "
        "'none' all-reduces in fp32. bf16 needs NCCL (GPUs)",
        choices=("none", "fp16", "bf16"),
    )
    collective_timeout: int = option(
        1800,
        "seconds a rank waits in a collective (gradient all-reduce, barrier) for the others "
        "before the job fails with an error: a hung or stopped rank; long enough for the main "
        "process to prepare a large dataset first",
        bounds=POSITIVE,
        resumable=True,
    )
    mmap_threshold_kb: int = option(
        0,
        "host memory, glibc's malloc (Linux) only: blocks of at least this many KB (1024 bytes) are mapped apart and "
        "given back to the system when freed instead of kept in malloc's free lists (mallopt M_MMAP_THRESHOLD): a "
        "lower peak resident memory for some CPU time (docs/kto.md measures 512). 0 = glibc's own threshold, which "
        "rises as large blocks are freed",
        bounds=NON_NEGATIVE,
        resumable=True,
    )
