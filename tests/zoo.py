"""The zoo: tiny random causal language models of many architectures, for tests that must hold across them (packing,
gradient checkpointing, a fused loss, mixture-of-experts losses). Each is built offline from transformers' own
config class, with random weights: about 64 wide, 2 layers, 128 positions, dropout off everywhere (the equality
tests compare logits and weights), the word embeddings tied or not as the architecture usually has them, and the
special tokens at id 0 (the end-of-text token of tests/hfmodels.py's GPT-2 tokenizer). The mixtures of experts
return their router logits and add the load-balancing loss to the model's own loss.

`ARCHITECTURES` maps a name (the model_type, or a variant such as "falcon-rotary") to a function of the vocabulary
size that returns the config; `tiny_causal_lm` builds a model from it, `save_tiny` saves one with a tokenizer as a
hub download would be."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

WIDTH = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2  # grouped-query attention where the architecture has it
INNER = 128
POSITIONS = 128
EXPERTS = 4
TOP_K = 2
AUX_COEF = 0.02  # the load-balancing loss's weight in a mixture of experts' loss (router_aux_loss_coef)
SPECIAL = {"bos_token_id": 0, "eos_token_id": 0}  # "<|endoftext|>" in gpt2_tokenizer(): id 0


def _llama_like(cls_name: str, vocab_size: int, **extra):
    """Llama's config arguments, shared by the decoders modelled on it."""
    import transformers

    return getattr(transformers, cls_name)(
        vocab_size=vocab_size,
        hidden_size=WIDTH,
        intermediate_size=INNER,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=POSITIONS,
        attention_dropout=0.0,
        **{**SPECIAL, **extra},
    )


def _moe(cls_name: str, vocab_size: int, **extra):
    """A mixture of experts: 4 experts, 2 per token, the router's logits out and its load-balancing loss in the loss."""
    return _llama_like(
        cls_name,
        vocab_size,
        num_experts_per_tok=TOP_K,
        output_router_logits=True,
        router_aux_loss_coef=AUX_COEF,
        **extra,
    )


def gpt2(vocab_size: int):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=vocab_size,
        n_positions=POSITIONS,
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        summary_first_dropout=0.0,
        **SPECIAL,
    )


def llama(vocab_size: int):
    return _llama_like("LlamaConfig", vocab_size)


def mistral(vocab_size: int):
    return _llama_like("MistralConfig", vocab_size, head_dim=WIDTH // HEADS)


def qwen2(vocab_size: int):
    return _llama_like("Qwen2Config", vocab_size)


def qwen3(vocab_size: int):
    return _llama_like("Qwen3Config", vocab_size, head_dim=WIDTH // HEADS)


def gemma(vocab_size: int):
    return _llama_like("GemmaConfig", vocab_size, head_dim=WIDTH // HEADS, pad_token_id=None)


def gemma2(vocab_size: int):
    """Gemma 2: logit softcapping (final 30, attention 50), sliding-window layers alternating with full ones."""
    return _llama_like(
        "Gemma2Config",
        vocab_size,
        head_dim=WIDTH // HEADS,
        query_pre_attn_scalar=WIDTH // HEADS,
        final_logit_softcapping=30.0,
        attn_logit_softcapping=50.0,
        pad_token_id=None,
    )


def phi(vocab_size: int):
    return _llama_like("PhiConfig", vocab_size, resid_pdrop=0.0, embd_pdrop=0.0)


def phi3(vocab_size: int):
    return _llama_like("Phi3Config", vocab_size, resid_pdrop=0.0, embd_pdrop=0.0, pad_token_id=None)


def gpt_neox(vocab_size: int):
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        vocab_size=vocab_size,
        hidden_size=WIDTH,
        intermediate_size=INNER,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        max_position_embeddings=POSITIONS,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        classifier_dropout=0.0,
        **SPECIAL,
    )


def gptj(vocab_size: int):
    from transformers import GPTJConfig

    return GPTJConfig(
        vocab_size=vocab_size,
        n_positions=POSITIONS,
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        rotary_dim=WIDTH // HEADS // 2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **SPECIAL,
    )


def codegen(vocab_size: int):
    from transformers import CodeGenConfig

    return CodeGenConfig(
        vocab_size=vocab_size,
        n_positions=POSITIONS,
        n_ctx=POSITIONS,
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        rotary_dim=WIDTH // HEADS // 2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **SPECIAL,
    )


def opt(vocab_size: int):
    from transformers import OPTConfig

    return OPTConfig(
        vocab_size=vocab_size,
        hidden_size=WIDTH,
        word_embed_proj_dim=WIDTH,
        ffn_dim=INNER,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        max_position_embeddings=POSITIONS,
        dropout=0.0,
        attention_dropout=0.0,
        layerdrop=0.0,
        pad_token_id=1,
        **SPECIAL,
    )


def bloom(vocab_size: int):
    """BLOOM: ALiBi, no position embeddings."""
    from transformers import BloomConfig

    return BloomConfig(
        vocab_size=vocab_size,
        hidden_size=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        **SPECIAL,
    )


def _falcon(vocab_size: int, alibi: bool):
    from transformers import FalconConfig

    return FalconConfig(
        vocab_size=vocab_size,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        max_position_embeddings=POSITIONS,
        alibi=alibi,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        **SPECIAL,
    )


def falcon(vocab_size: int):
    """Falcon with ALiBi (as the 7B's relatives were trained); "falcon-rotary" is the rotary one."""
    return _falcon(vocab_size, alibi=True)


def falcon_rotary(vocab_size: int):
    return _falcon(vocab_size, alibi=False)


def mpt(vocab_size: int):
    """MPT: ALiBi, no position embeddings."""
    from transformers import MptConfig

    return MptConfig(
        vocab_size=vocab_size,
        d_model=WIDTH,
        n_heads=HEADS,
        n_layers=LAYERS,
        expansion_ratio=2,
        max_seq_len=POSITIONS,
        resid_pdrop=0.0,
        emb_pdrop=0.0,
        attn_config={"attn_pdrop": 0, "alibi": True},
        **SPECIAL,
    )


def olmo(vocab_size: int):
    return _llama_like("OlmoConfig", vocab_size, pad_token_id=None)


def olmo2(vocab_size: int):
    return _llama_like("Olmo2Config", vocab_size, pad_token_id=None)


def stablelm(vocab_size: int):
    return _llama_like("StableLmConfig", vocab_size, hidden_dropout=0.0)


def gpt_bigcode(vocab_size: int):
    """GPT-BigCode (StarCoder 1): multi-query attention."""
    from transformers import GPTBigCodeConfig

    return GPTBigCodeConfig(
        vocab_size=vocab_size,
        n_positions=POSITIONS,
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **SPECIAL,
    )


def biogpt(vocab_size: int):
    from transformers import BioGptConfig

    return BioGptConfig(
        vocab_size=vocab_size,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INNER,
        max_position_embeddings=POSITIONS,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        activation_dropout=0.0,
        layerdrop=0.0,
        pad_token_id=1,
        **SPECIAL,
    )


def xglm(vocab_size: int):
    from transformers import XGLMConfig

    return XGLMConfig(
        vocab_size=vocab_size,
        d_model=WIDTH,
        ffn_dim=INNER,
        num_layers=LAYERS,
        attention_heads=HEADS,
        max_position_embeddings=POSITIONS,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        layerdrop=0.0,
        pad_token_id=1,
        decoder_start_token_id=0,
        **SPECIAL,
    )


def gpt_neo(vocab_size: int):
    """GPT-Neo: global and local (windowed) attention layers alternating."""
    from transformers import GPTNeoConfig

    return GPTNeoConfig(
        vocab_size=vocab_size,
        hidden_size=WIDTH,
        num_layers=LAYERS,
        attention_types=[[["global", "local"], LAYERS // 2]],
        num_heads=HEADS,
        intermediate_size=INNER,
        window_size=POSITIONS // 2,
        max_position_embeddings=POSITIONS,
        resid_dropout=0.0,
        embed_dropout=0.0,
        attention_dropout=0.0,
        classifier_dropout=0.0,
        **SPECIAL,
    )


def starcoder2(vocab_size: int):
    return _llama_like("Starcoder2Config", vocab_size, residual_dropout=0.0, embedding_dropout=0.0)


def granite(vocab_size: int):
    """Granite: its multipliers as the 3.x checkpoints have them, the logits divided by logits_scaling."""
    return _llama_like(
        "GraniteConfig",
        vocab_size,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=1 / (WIDTH // HEADS),
        logits_scaling=4.0,
        tie_word_embeddings=True,
    )


def cohere(vocab_size: int):
    """Cohere (Command-R): the logits multiplied by logit_scale (0.0625)."""
    return _llama_like("CohereConfig", vocab_size, logit_scale=0.0625, pad_token_id=None)


def mixtral(vocab_size: int):
    return _moe("MixtralConfig", vocab_size, num_local_experts=EXPERTS, router_jitter_noise=0.0)


def qwen2_moe(vocab_size: int):
    """Qwen2-MoE: routed experts plus a gated shared expert in every layer."""
    return _moe(
        "Qwen2MoeConfig",
        vocab_size,
        num_experts=EXPERTS,
        moe_intermediate_size=INNER // 2,
        shared_expert_intermediate_size=INNER,
        decoder_sparse_step=1,
    )


def olmoe(vocab_size: int):
    return _moe("OlmoeConfig", vocab_size, num_experts=EXPERTS, pad_token_id=None)


def jetmoe(vocab_size: int):
    """JetMoE: experts in the attention and the MLP; transformers does not checkpoint its activations."""
    from transformers import JetMoeConfig

    return JetMoeConfig(
        vocab_size=vocab_size,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        num_key_value_heads=KV_HEADS,
        kv_channels=WIDTH // HEADS,
        intermediate_size=INNER,
        num_local_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        max_position_embeddings=POSITIONS,
        attention_dropout=0.0,
        **SPECIAL,
    )


def mamba(vocab_size: int):
    """Mamba: a selective state-space model, no attention (nor attention mask, nor position ids)."""
    from transformers import MambaConfig

    return MambaConfig(
        vocab_size=vocab_size,
        hidden_size=WIDTH,
        num_hidden_layers=LAYERS,
        state_size=8,
        expand=2,
        time_step_rank=WIDTH // 16,
        pad_token_id=None,
        **SPECIAL,
    )


ARCHITECTURES: dict[str, Callable[[int], object]] = {
    "gpt2": gpt2,
    "llama": llama,
    "mistral": mistral,
    "qwen2": qwen2,
    "qwen3": qwen3,
    "gemma": gemma,
    "gemma2": gemma2,
    "phi": phi,
    "phi3": phi3,
    "gpt_neox": gpt_neox,
    "gptj": gptj,
    "opt": opt,
    "bloom": bloom,
    "falcon": falcon,
    "falcon-rotary": falcon_rotary,
    "mpt": mpt,
    "olmo": olmo,
    "olmo2": olmo2,
    "stablelm": stablelm,
    "gpt_bigcode": gpt_bigcode,
    "codegen": codegen,
    "biogpt": biogpt,
    "xglm": xglm,
    "gpt_neo": gpt_neo,
    "starcoder2": starcoder2,
    "granite": granite,
    "cohere": cohere,
    "mixtral": mixtral,
    "qwen2_moe": qwen2_moe,
    "olmoe": olmoe,
    "jetmoe": jetmoe,
    "mamba": mamba,
}
MOE = ("mixtral", "qwen2_moe", "olmoe")
NO_ATTENTION = ("mamba",)


def tiny_config(name: str, vocab_size: int = 400):
    return ARCHITECTURES[name](vocab_size)


def tiny_causal_lm(name: str, vocab_size: int = 400, seed: int = 0, **kwargs):
    """The zoo's `name` as a random AutoModelForCausalLM, in eval mode; kwargs go to from_config (as
    attn_implementation="eager")."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(name, vocab_size)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, **kwargs).eval()


def save_tiny(name: str, folder: Path, tokenizer, seed: int = 0) -> Path:
    """The zoo's `name`, sized to `tokenizer`, saved with it to `folder` as a hub checkpoint is."""
    tiny_causal_lm(name, vocab_size=len(tokenizer), seed=seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)
