"""A tiny Llama-style model (RMSNorm, rotary GQA attention, SwiGLU or a plain SiLU MLP) in torchtitan's module layout.

Used to prove on CPU that an emitted FSDP2/TP/PP plan computes the same training step as one process.
Layout (the FSDP2 emitter's convention): ``tok_embeddings``, ``layers`` (``nn.ModuleDict`` "0"..),
``norm``, ``output``; ``forward`` skips modules that a pipeline stage set to ``None``. Attention infers
its local head counts from its projections' output widths, so column-parallel TP shards heads.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def _rotate(x: torch.Tensor) -> torch.Tensor:
    """Rotary embedding over the last dim (half-split form) for x of shape (b, s, heads, d)."""
    s, d = x.shape[1], x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.arange(s, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        rep = q.shape[2] // k.shape[2]  # query heads per KV head (GQA), local or global alike
        q, k = _rotate(q), _rotate(k)
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU ``w2(silu(w1 x) * w3 x)``, or (``gated`` false, a ModelSpec with gated_mlp false) ``w2(silu(w1 x))``:
    no w3, the FSDP2 emitter's layout of a non-gated MLP."""

    def __init__(self, dim: int, hidden: int, gated: bool = True) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False) if gated else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = F.silu(self.w1(x))
        return self.w2(up * self.w3(x) if self.w3 is not None else up)


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, hidden: int, gated: bool = True) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, n_heads, n_kv_heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden, gated)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class TinyLlama(nn.Module):
    def __init__(self, vocab: int, dim: int, n_layers: int, n_heads: int, n_kv_heads: int, hidden: int,
                 gated: bool = True) -> None:
        super().__init__()
        self.tok_embeddings: nn.Module | None = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleDict({str(i): Block(dim, n_heads, n_kv_heads, hidden, gated) for i in range(n_layers)})
        self.norm: nn.Module | None = RMSNorm(dim)
        self.output: nn.Module | None = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
