"""A GPT-2 style decoder-only language model (Radford et al., 2019), "small" size by default.

Token and position embeddings, dropout, ``n_layer`` pre-LayerNorm transformer blocks, a final
LayerNorm and a language-model head that shares its weight with the token embedding. With the
defaults (50257 tokens, 1024 positions, 12 layers, width 768, 12 heads) it has GPT-2 small's
124,439,808 parameters, the shared matrix counted once.

The head is ``F.linear(x, wte.weight)`` rather than a second module holding the same Parameter:
there is then one parameter under one name, which ``torch.func.functional_call`` and
``functorch.compile.aot_module`` accept (they reject a Parameter registered under two names).

Each block computes ``x + drop(proj(attn(ln_1(x))))`` then ``x + drop(mlp(ln_2(x)))``. Attention uses
one Linear(n_embd, 3 * n_embd) for queries, keys and values and
``torch.nn.functional.scaled_dot_product_attention`` with ``is_causal=True``; the MLP is
Linear(n_embd, 4 * n_embd), tanh-approximated GELU (as GPT-2), Linear(4 * n_embd, n_embd).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["CausalSelfAttention", "MLP", "Block", "GPT2", "gpt2_small"]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention on (batch, seq, n_embd).

    Args:
        n_embd: model width; must be divisible by ``n_head``.
        n_head: number of heads.
        dropout: dropout on the attention weights (training only) and on the output projection.
    """

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        self.n_head = n_head
        self.dropout = dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        # (batch, seq, width) -> (batch, heads, seq, head_dim)
        q, k, v = (t.view(batch, seq, self.n_head, width // self.n_head).transpose(1, 2)
                   for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).contiguous().view(batch, seq, width)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward: widen 4x, tanh-approximated GELU, project back, dropout."""

    def __init__(self, n_embd: int, dropout: float) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """One pre-LayerNorm transformer block: attention then MLP, each on a residual branch."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """GPT-2 style language model: token ids (batch, seq) -> logits (batch, seq, vocab_size).

    Args:
        vocab_size: number of token ids; inputs must lie in ``[0, vocab_size)``.
        n_positions: longest sequence the position embedding covers.
        n_layer, n_embd, n_head: depth, width and heads of the transformer.
        dropout: probability for the embedding, attention, and residual dropouts.
    """

    def __init__(self, vocab_size: int = 50257, n_positions: int = 1024, n_layer: int = 12,
                 n_embd: int = 768, n_head: int = 12, dropout: float = 0.1) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.n_positions = n_positions
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(n_positions, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self._init_weights(n_layer)

    def _init_weights(self, n_layer: int) -> None:
        """GPT-2's scheme: N(0, 0.02) weights, zero biases, residual projections scaled by
        1/sqrt(2 * n_layer), unit/zero LayerNorm."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for block in self.h:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(proj.weight, 0.0, 0.02 / math.sqrt(2 * n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        seq = idx.shape[1]
        if seq > self.n_positions:
            raise ValueError(f"sequence length {seq} exceeds n_positions={self.n_positions}")
        positions = torch.arange(seq, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        # Language-model head, tied to the token embedding, without bias.
        return F.linear(self.ln_f(x), self.wte.weight)


def gpt2_small(vocab_size: int = 50257, n_positions: int = 1024, dropout: float = 0.1, *,
               n_layer: int = 12, n_embd: int = 768, n_head: int = 12) -> GPT2:
    """GPT-2 small: 124,439,808 parameters with the defaults (tied embedding counted once).

    ``n_layer``, ``n_embd``, ``n_head``, ``vocab_size`` and ``n_positions`` shrink it for fast tests.
    Default input in the zoo: 1024 token ids (dtype torch.long) per sample.
    """
    return GPT2(vocab_size, n_positions, n_layer, n_embd, n_head, dropout)
