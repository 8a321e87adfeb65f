"""Hugging Face transformers models behind `--model hf:PATH_OR_ID`: the model and its own tokenizer
loaded from one folder (or a hub id where the network allows) for the task, checked against the data,
and saved back with `save_pretrained` so transformers can load the result. transformers is optional
(`pip install 'anytrain[hf]'`); nothing here imports it before a run asks for an hf: model.

Each transformers task (tasks/hf_*.py) names its `Head`: the Auto class (AutoModelForSequenceClassification,
AutoModelForCausalLM, ...), and whether its labels come from the data (num_labels, id2label, label2id).

A tokenizer without a pad token gets its end-of-text token as pad token, as transformers' own
recipes do (run_clm, run_glue), and the model's config is told the pad id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .config import HF_PREFIX, ConfigError, TrainConfig, first_line

FOLDER = "hf"  # the run folder's save_pretrained output: run_dir/hf
CAUSAL = "AutoModelForCausalLM"  # the Auto class of the tasks that train a causal LM (lm, sft, dpo)
# A folder's tokenizer: without one of these, transformers 5 builds an empty tokenizer of special tokens only.
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
)


@dataclass(frozen=True)
class Head:
    """What a transformers task needs of a model: its Auto class, the head's name (for messages), whether its
    labels come from the data (num_labels; a checkpoint's head for another label count is replaced), the
    loss transformers should name where the class does not, and whether --max-length must fit its positions."""

    auto_class: str
    name: str
    labelled: bool = False
    loss_type: str | None = None
    positions: bool = True


def source_of(cfg: TrainConfig) -> str:
    """The folder or hub id after hf:, a folder's path expanded."""
    source = cfg.model.name.removeprefix(HF_PREFIX)
    path = Path(source).expanduser()
    return str(path) if path.exists() else source


def transformers():
    """The transformers module; one line naming the extra when it is not installed."""
    try:
        import transformers as module

        module.utils.logging.disable_progress_bar()  # "Loading weights" bars: the run's own bar is enough
    except ImportError:
        raise ConfigError(
            "--model hf:...: transformers is not installed; pip install 'anytrain[hf]' (or pip install transformers)"
        ) from None
    return module


def check_folder(cfg: TrainConfig) -> str:
    """The source, once a local folder is seen to hold a config.json (a hub id is left to transformers)."""
    source = source_of(cfg)
    path = Path(source)
    looks_local = path.exists() or source.startswith((".", "/", "~")) or source.count("/") > 1
    if looks_local and not (path / "config.json").is_file():
        what = "folder" if path.is_dir() else "path" if path.exists() else "folder (it does not exist)"
        raise ConfigError(
            f"--model hf:{source}: no config.json in this {what}; a transformers model folder holds config.json, "
            "the weights and the tokenizer files"
        )
    return source


def load_tokenizer(cfg: TrainConfig):
    """The model's own tokenizer from the same folder, padding at the end of a text; a missing pad token
    is the end-of-text token."""
    source = check_folder(cfg)
    folder = Path(source)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"--model hf:{source}: no tokenizer in this folder (none of {', '.join(TOKENIZER_FILES)}); save the "
            "model's tokenizer beside it (tokenizer.save_pretrained)"
        )
    try:
        tokenizer = transformers().AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"--model hf:{source}: no tokenizer could be loaded from it ({first_line(e)})") from None
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ConfigError(f"--model hf:{source}: its tokenizer has neither a pad token nor an end-of-text token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


def model_config(cfg: TrainConfig, head: Head, task: str, pad_id: int | None, labels: list[str] | None = None):
    """The model's config for the task's head (with labels: num_labels, id2label, label2id from the data; the
    tokenizer's pad id), checked before anything is written: ConfigError when its architecture has no such
    head in transformers, a causal LM's attention would be bidirectional (both_ways) or its positions are fewer
    than --max-length."""
    source = check_folder(cfg)
    module = transformers()
    extra = {}
    if labels is not None:
        extra = dict(
            num_labels=len(labels), id2label=dict(enumerate(labels)), label2id={n: k for k, n in enumerate(labels)}
        )
    config = read_config(source, extra)
    try:
        getattr(module, head.auto_class)._model_mapping[type(config)]  # noqa: B018 - raises: no head for the task
    except (KeyError, ValueError) as e:
        kind = getattr(locals().get("config"), "model_type", "this")
        raise ConfigError(
            f"--model hf:{source}: a {kind} model has no {head.name} head in transformers, so it does not fit --task "
            f"{task} ({first_line(e)})"
        ) from None
    except OSError as e:
        raise ConfigError(f"--model hf:{source}: cannot read its config ({first_line(e)})") from None
    if head.auto_class == CAUSAL:
        check_causal(source, config, task)
    positions = max_positions(config)
    if head.positions and positions is not None and cfg.data.max_length > positions:
        raise ConfigError(
            f"--max-length {cfg.data.max_length} exceeds the {positions} positions of hf:{source} "
            f"(max_position_embeddings); pass --max-length {positions} or less"
        )
    if pad_id is not None:
        config.pad_token_id = pad_id
    return config


def both_ways(config) -> str | None:
    """The config's flag that leaves its causal-LM class attending both ways (an encoder: BERT, RoBERTa, ELECTRA,
    XLM, ...), None when its attention is causal. transformers gives such architectures a causal-LM class, whose
    attention is causal only when the config says so: is_decoder (XLM: causal); a masked-LM checkpoint says not.
    Encoder-decoder configs (BART's ForCausalLM is its decoder) and decoder-only ones have no such switch."""
    if (
        getattr(config, "is_encoder_decoder", False)
        or type(config) not in transformers().AutoModelForMaskedLM._model_mapping
    ):
        return None
    if hasattr(config, "causal"):
        return None if config.causal else "causal=False"
    return None if getattr(config, "is_decoder", False) else "is_decoder=False"


def check_causal(source: str, config, task: str) -> None:
    """A task that trains a causal LM refuses a model whose attention would see the tokens it is to predict."""
    flag = both_ways(config)
    if flag is not None:
        name = (getattr(config, "architectures", None) or [f"a {config.model_type} model"])[0]
        raise ConfigError(
            f"--model hf:{source}: {name} is not a causal LM ({flag}: bidirectional attention, each token would see "
            f"the tokens it is trained to predict), so it does not fit --task {task}; give a decoder (GPT-2, Llama, "
            "Qwen, ...), or train this encoder with --task mlm, classify, tag or reward"
        )


def read_config(source: str, extra: dict | None = None):
    """The model's transformers config; one line for a folder transformers cannot read or whose model_type it
    does not know."""
    module = transformers()
    try:
        return module.AutoConfig.from_pretrained(source, **(extra or {}))
    except (KeyError, ValueError) as e:
        kind = model_type_of(source)
        if kind is not None:
            raise ConfigError(
                f"--model hf:{source}: its config.json names model_type '{kind}', which transformers "
                f"{module.__version__} does not know (a newer transformers, or the model's own code)"
            ) from None
        raise ConfigError(f"--model hf:{source}: cannot read its config ({first_line(e)})") from None
    except OSError as e:
        raise ConfigError(f"--model hf:{source}: cannot read its config ({first_line(e)})") from None


def model_type_of(source: str) -> str | None:
    try:
        return json.loads((Path(source) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def check_vocabulary(cfg: TrainConfig, tokenizer, config) -> None:
    """Every id the tokenizer makes must index the model's embeddings: else a step fails mid-run."""
    rows = getattr(config, "vocab_size", None)
    if isinstance(rows, int) and len(tokenizer) > rows:
        raise ConfigError(
            f"--model {cfg.model.name}: its tokenizer has {len(tokenizer)} tokens, more than the {rows} rows of the "
            "model's embeddings (vocab_size): the tokenizer is not this model's"
        )


def load_model(cfg: TrainConfig, head: Head, config):
    """The pretrained weights under the checked config. A head with labels from the data is new where the
    checkpoint's is for another label count (transformers initialises it from the seeded RNG), as run_glue does."""
    source = source_of(cfg)
    mismatched = dict(ignore_mismatched_sizes=True) if head.labelled else {}
    try:
        model, info = getattr(transformers(), head.auto_class).from_pretrained(
            source, config=config, output_loading_info=True, **mismatched
        )
    except (OSError, ValueError, RuntimeError) as e:
        raise ConfigError(f"--model hf:{source}: cannot load its weights ({first_line(e)})") from None
    body = f"{model.base_model_prefix}."
    for name, saved, wanted in info.get("mismatched_keys") or []:
        if name.startswith(body):  # only the task's head (outside the base model) may be new
            raise ConfigError(
                f"--model hf:{source}: its weights do not fit its config ({name}: {tuple(saved)} in the checkpoint, "
                f"{tuple(wanted)} in the model); only the task's head may be replaced"
            )
    return with_loss_type(model, head)


def checkpoint_activations(model) -> None:
    """Recompute each block's activations in the backward pass, with torch's non-reentrant checkpoint (which
    restores the RNG state, so dropout draws the same masks). transformers 5.24 renamed the method."""
    kwargs = {"use_reentrant": False}
    refused = (
        f"--gradient-checkpointing: {type(model).__name__} ({model.config.model_type}) cannot recompute its blocks"
    )
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(f"{refused}: transformers does not support it for this architecture; train without it")
    try:
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    except (ValueError, NotImplementedError, AttributeError) as e:
        raise ConfigError(f"{refused} ({first_line(e)}); train without it") from None
    if getattr(model.config, "use_cache", None):
        model.config.use_cache = (
            False  # a cache of keys and values is for generating, not for training (export restores it)
        )


def checkpoints_activations(model) -> bool:
    """Whether any of the model's blocks recomputes its activations (what the model really does)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def with_loss_type(model, head: Head):
    """Name the loss transformers uses where the class name does not say (GPT2LMHeadModel; it warns so)."""
    if head.loss_type and getattr(model, "loss_type", None) is None:
        model.loss_type = head.loss_type
    return model


def max_positions(config) -> int | None:
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def model_from_config(head: Head, config_json: str):
    """The model rebuilt from the config saved with the weights (no folder needed), weights to be loaded."""
    module = transformers()
    data = json.loads(config_json)
    config = module.AutoConfig.for_model(data.pop("model_type"), **data)
    return with_loss_type(getattr(module, head.auto_class).from_config(config), head)


def save_pretrained(model, preprocessor, run_dir: Path) -> Path:
    """run_dir/hf: the model (safetensors) and its tokenizer or image processor, as transformers loads them."""
    folder = Path(run_dir) / FOLDER
    model.save_pretrained(folder)
    preprocessor.save_pretrained(folder)
    return folder


def num_channels(cfg: TrainConfig) -> int:
    """The image channels a vision model's config says it takes (3 where it does not say)."""
    try:
        config = transformers().AutoConfig.from_pretrained(check_folder(cfg))
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"--model {cfg.model.name}: cannot read its config ({first_line(e)})") from None
    return int(getattr(config, "num_channels", 3) or 3)


def tokenizer_of_run(folder: Path):
    """The tokenizer a finished run saved in run_dir/hf; one line when that folder is missing or damaged."""
    saved = Path(folder) / FOLDER
    if not any((saved / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"run_dir: {saved} holds no tokenizer: the run's save_pretrained folder is missing or damaged"
        )
    try:
        return transformers().AutoTokenizer.from_pretrained(str(saved))
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
        raise ConfigError(f"run_dir: the tokenizer in {saved} does not load ({first_line(e)})") from None
