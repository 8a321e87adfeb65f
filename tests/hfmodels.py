"""Tiny random transformers models for the tests, built offline: a tokenizer for the generated texts
(tests/textdata.py) and a slice of the bundled Tiny Shakespeare (GPT-2's a byte-level BPE trained with
Hugging Face `tokenizers`; BERT's and BART's a WordPiece vocabulary made here, in a fixed order),
then a BERT (for classify) and a GPT-2 (for lm) of about 150,000 parameters, dropout off (the
equality tests compare weights), from transformers' config classes, saved with save_pretrained to a
folder as a hub download would be."""

from __future__ import annotations

from pathlib import Path

from tagdata import PEOPLE, PLACES
from textdata import FILLER, TOPICS

from anytrain.data.text import SHAKESPEARE_PATH

VOCAB = 400
POSITIONS = 128


def corpus() -> list[str]:
    words = " ".join(FILLER + [w for topic in TOPICS.values() for w in topic])
    return [words] * 20 + SHAKESPEARE_PATH.read_text(encoding="utf-8")[:100_000].split("\n\n")


def fixed_wordpiece(texts: list[str], specials: list[str], unk: str, pre_tokenizer):
    """A WordPiece model whose vocabulary is made here: the specials, every character (alone and as a
    continuation), then the words by count, ties by spelling, up to VOCAB. tokenizers' WordPiece trainer
    breaks ties between equally frequent pieces in hash order, so its vocabulary changed from run to run,
    and with it how far a tiny model got in a test's epochs (a seq2seq and a tagging test failed by draw)."""
    from collections import Counter

    from tokenizers import models

    counts = Counter(word for text in texts for word, _ in pre_tokenizer.pre_tokenize_str(text))
    chars = sorted({c for word in counts for c in word})
    words = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if len(w) > 1]
    vocab = [*specials, *chars, *(f"##{c}" for c in chars), *words][:VOCAB]
    return models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token=unk)


def bert_tokenizer():
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    names = " ".join([*(w for person in PEOPLE for w in person), *PLACES])  # the tagging tests' names: whole words
    texts = [*corpus(), *[names] * 20]
    tok = Tokenizer(fixed_wordpiece(texts, specials, "[UNK]", pre_tokenizers.BertPreTokenizer()))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def gpt2_tokenizer():
    """Byte-level BPE with an end-of-text token and, like GPT-2's, no pad token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def bert_config(tokenizer):
    """The tiny BERT: 2 layers 64 wide, dropout off (the equality tests compare weights)."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=POSITIONS,
        pad_token_id=tokenizer.pad_token_id,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )


def tiny_bert(folder: Path, seed: int = 0) -> Path:
    import torch
    from transformers import BertForSequenceClassification

    tokenizer = bert_tokenizer()
    config = bert_config(tokenizer)
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_gpt2(folder: Path, seed: int = 0) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = gpt2_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=POSITIONS,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(seed)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_bert_mlm(folder: Path, seed: int = 0) -> Path:
    """The tiny BERT with its masked-LM head (BertForMaskedLM), as a pretrained checkpoint is saved: the masked-LM
    task trains it as it is, the token classifier replaces the head with one for the tags."""
    import torch
    from transformers import BertForMaskedLM

    tokenizer = bert_tokenizer()
    config = bert_config(tokenizer)
    torch.manual_seed(seed)
    BertForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def bart_tokenizer(corpus_texts: list[str]):
    """A WordPiece tokenizer with BART's special tokens (<s> 0, <pad> 1, </s> 2, <unk> 3), wrapping every text in
    <s> ... </s> as BART's tokenizer does."""
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    tok = Tokenizer(fixed_wordpiece(corpus_texts, specials, "<unk>", pre_tokenizers.WhitespaceSplit()))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def tiny_bart(folder: Path, corpus_texts: list[str], seed: int = 0, init_std: float = 0.02) -> Path:
    """A BART encoder-decoder of about 180,000 parameters, dropout off, its tokenizer trained on `corpus_texts`;
    its decoder starts from </s>, as BART's does. The translation test starts it at init_std 0.1, not BART's 0.02:
    from 0.02 it sat on a plateau for 12 epochs (the decoder a language model, cross-attention not yet aligned) and
    needed 35 epochs; from 0.1 it translates its validation split exactly by epoch 3.
    (A tiny T5 learns word order far slower here: its
    cross-attention has no positions, and its relative positions are all a model this small has.)"""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    tokenizer = bart_tokenizer(corpus_texts)
    config = BartConfig(
        vocab_size=len(tokenizer),
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=POSITIONS,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
        init_std=init_std,
    )
    torch.manual_seed(seed)
    BartForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_vit(folder: Path, image_size: int = 16, seed: int = 0, init_std: float = 0.02) -> Path:
    """A ViT image classifier of about 30,000 parameters (10 labels: a head the fine-tuning replaces when the data
    has another count), with its image processor (resize to image_size, normalise to [-1, 1]), as a hub checkpoint.
    The learning test starts it at init_std 0.1, not ViT's 0.02: it then reaches the 20 epochs' accuracy in 5."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    config = ViTConfig(
        image_size=image_size,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=10,
        initializer_range=init_std,
    )
    torch.manual_seed(seed)
    ViTForImageClassification(config).save_pretrained(folder)
    size = {"height": image_size, "width": image_size}
    ViTImageProcessor(size=size, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(folder)
    return folder


CHATML = (  # the chat template of the tests' chat models (ChatML, as Qwen's and SmolLM's)
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


TOOLS_TEMPLATE = (  # CHATML with tools, laid out as Qwen 2.5's template lays them out (written here; a newline
    # after a block tag is written {{ nl }}: transformers renders with trim_blocks)
    "{% set nl = '\\n' %}{% if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] }}{{ nl }}{{ nl }}{% endif %}# Tools\n\nYou may call functions.\n<tools>"
    "{% for t in tools %}{{ nl }}{{ t | tojson }}{% endfor %}{{ nl }}</tools>\n\nAnswer a call as <tool_call>\n"
    '{"name": NAME, "arguments": {...}}\n</tool_call><|im_end|>{{ nl }}'
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>{{ nl }}"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and loop.first %}"
    "{% elif m['role'] in ('user', 'system') %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>{{ nl }}"
    "{% elif m['role'] == 'assistant' %}<|im_start|>assistant\n{{ m['content'] or '' }}"
    "{% for c in m['tool_calls'] or [] %}{% set f = c['function'] if c['function'] is defined else c %}"
    "{% if m['content'] or not loop.first %}{{ nl }}{% endif %}<tool_call>\n{\"name\": \"{{ f['name'] }}\", "
    "\"arguments\": {{ f['arguments'] | tojson }}}\n</tool_call>{% endfor %}<|im_end|>{{ nl }}"
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ nl }}<tool_response>\n{{ m['content'] }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>{{ nl }}{% endif %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TOOLS_RESPONSE = {  # transformers' response parsing for TOOLS_TEMPLATE: an assistant turn's text and its calls
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def tool_tokenizer():
    """The chat tokenizer with TOOLS_TEMPLATE and its response template (saved with it in tokenizer_config.json)."""
    tokenizer = chat_tokenizer()
    tokenizer.chat_template, tokenizer.response_template = TOOLS_TEMPLATE, TOOLS_RESPONSE
    return tokenizer


def chat_tokenizer():
    """The GPT-2 test tokenizer with ChatML's turn markers as special tokens and its chat template."""
    tokenizer = gpt2_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML
    return tokenizer


def llama_config(tokenizer, width: int = 64, layers: int = 2, positions: int = POSITIONS):
    """A Llama-style decoder (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention), dropout off."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=width * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        attention_dropout=0.0,
    )


TOOL_POSITIONS = 1024  # a tool chat's tools block alone is ~450 of the test tokenizer's tokens


def tiny_llama(
    folder: Path, seed: int = 0, width: int = 64, layers: int = 2, chat: bool = True, tools: bool = False
) -> Path:
    """A Llama-style causal LM of about 100,000 parameters (at width 64), with the chat tokenizer (or, chat=False,
    the same tokenizer without a chat template; tools=True, the tool tokenizer and TOOL_POSITIONS positions), as a
    hub checkpoint."""
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = tool_tokenizer() if tools else chat_tokenizer()
    if not chat:
        tokenizer.chat_template = None
    torch.manual_seed(seed)
    config = llama_config(tokenizer, width, layers, TOOL_POSITIONS if tools else POSITIONS)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
