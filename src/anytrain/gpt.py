"""A small decoder-only transformer (GPT) for character-level language modelling.

The model maps token ids of shape (B, T) to next-token logits of shape (B, T, vocab_size); the
trainer computes the loss. Blocks are pre-norm, attention is causal through PyTorch's fused
scaled_dot_product_attention, no Linear or LayerNorm has a bias, and the output layer reuses the
token-embedding matrix. The tie is made by calling F.linear with that matrix rather than by a
second module holding the same tensor, so the state dict has exactly one name for it (safetensors
rejects state dicts in which two names share one tensor).
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

INIT_STD = 0.02  # GPT-2's initialisation scale for every Linear and Embedding weight


class SelfAttention(nn.Module):
    """Multi-head self-attention. Causal (the GPT): position t only sees positions <= t. Not causal
    (the text encoder): every position sees every real token, as `mask` (batch, T; True = a real
    token) says; padding is never attended to."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, causal: bool = True):
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.causal = causal
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=False)  # queries, keys and values in one matmul
        self.proj = nn.Linear(n_embd, n_embd, bias=False)  # residual output projection
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        # (B, T, 3C) -> three tensors of shape (B, n_head, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        keys = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, T): which keys each query may see
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=keys, is_causal=self.causal, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads back side by side
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward network: widen 4x, GELU, project back."""

    def __init__(self, n_embd: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * n_embd, n_embd, bias=False)  # residual output projection
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)). causal=False with a
    padding mask is the text encoder's block (models.py, Encoder)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, causal: bool = True):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd, bias=False)
        self.attn = SelfAttention(n_embd, n_head, dropout, causal)
        self.ln2 = nn.LayerNorm(n_embd, bias=False)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


def init_weights(model: nn.Module, blocks: nn.ModuleList) -> None:
    """GPT-2's initialisation: N(0, 0.02) for Linear and Embedding weights, LayerNorm weights 1, Linear
    biases 0. The two projections that write into the residual stream get std 0.02 / sqrt(2 * layers),
    so that the variance added by the 2 * layers residual branches does not grow with depth."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
    residual_std = INIT_STD / math.sqrt(2 * len(blocks))
    for block in blocks:
        nn.init.normal_(cast("Block", block).attn.proj.weight, mean=0.0, std=residual_std)
        nn.init.normal_(cast("Block", block).mlp.proj.weight, mean=0.0, std=residual_std)


class GPT(nn.Module):
    """Token + learned position embeddings, `n_layer` blocks, final LayerNorm, tied output layer."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int, dropout: float = 0.0):
        super().__init__()
        sizes = {
            "vocab_size": vocab_size,
            "block_size": block_size,
            "n_layer": n_layer,
            "n_head": n_head,
            "n_embd": n_embd,
        }
        bad = [f"{name}={value}" for name, value in sizes.items() if value < 1]
        if bad:
            raise ValueError(f"GPT sizes must be positive; got {', '.join(bad)}")
        if n_embd % n_head:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {dropout}")
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.n_layer = n_layer
        self.n_embd = n_embd

        self.tok_emb = nn.Embedding(vocab_size, n_embd)  # also the output layer's weight, see forward()
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=False)
        init_weights(self, self.blocks)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> logits (B, T, vocab_size) for the token after each position."""
        if idx.dim() != 2:
            raise ValueError(f"GPT expects token ids of shape (batch, time); got shape {tuple(idx.shape)}")
        T = idx.size(1)
        if T > self.block_size:
            raise ValueError(f"sequence length {T} exceeds the model's block_size {self.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.tok_emb.weight)  # tied output layer: one parameter, one name

    def num_parameters(self, exclude_position_embedding: bool = True) -> int:
        """Number of parameters (the tied embedding counted once), by default without the position
        embedding, which costs no matmul FLOPs."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.pos_emb.weight.numel() if exclude_position_embedding else n

    def flops_per_token(self) -> int:
        """Estimated training FLOPs per token: 6 * N + 12 * n_layer * n_embd * block_size.

        N is num_parameters() (without the position embedding). Each weight costs 2 FLOPs per token
        in the forward matmuls and 4 in the backward (gradients of activations and of weights), hence
        6 * N. Attention scores (q @ k^T) and their weighting of the values (att @ v) cost another
        2 * 2 * n_embd * T FLOPs per token and layer forward, tripled for the backward; at full
        context T = block_size this gives 12 * n_layer * n_embd * block_size. The causal mask's
        savings, LayerNorms, softmax and GELU are ignored."""
        return 6 * self.num_parameters() + 12 * self.n_layer * self.n_embd * self.block_size


def build_gpt(model, shape) -> GPT:
    """The registry's `--model gpt`: the model section's n_layer, n_head, n_embd and dropout, for the
    shape's vocabulary and block_size."""
    if shape.kind != "text":
        from .config import ConfigError

        raise ConfigError("--model gpt needs text data (--task lm)")
    return GPT(shape.vocab_size, shape.block_size, model.n_layer, model.n_head, model.n_embd, model.dropout)


@torch.no_grad()
def generate(
    model: GPT,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Extend the prompt `idx` (B, T) by `max_new_tokens` sampled tokens; returns (B, T + max_new_tokens).

    Each step feeds at most the last model.block_size tokens, divides the last position's logits by
    `temperature`, keeps only the `top_k` largest logits when top_k > 0, and samples from the softmax
    with `generator` (which must live on the model's device). The model runs in eval mode (no dropout)
    and is put back in its previous mode afterwards."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it); got {top_k}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0; got {max_new_tokens}")
    if idx.dim() != 2 or idx.size(1) == 0:
        raise ValueError(f"the prompt must have shape (batch, time) with time >= 1; got shape {tuple(idx.shape)}")
    idx = idx.to(next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        for _ in range(max_new_tokens):
            logits = model(idx[:, -model.block_size :])[:, -1, :] / temperature
            if top_k:
                k = min(top_k, logits.size(-1))
                kth_largest = torch.topk(logits, k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth_largest, float("-inf"))
            probs = torch.softmax(logits.float(), dim=-1)
            next_token = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, next_token], dim=1)
    finally:
        model.train(was_training)
    return idx
