"""The course's reference model: a small GPT-style, pre-LayerNorm, byte-level transformer, written
to be read in the spirit of nanoGPT's ``model.py`` (Karpathy): token and learned position
embeddings, ``n_layers`` blocks in ``model.layers``, a final LayerNorm and a head over the 256 byte
values (untied, so parameter counts are plain). `course_utils.checkpointing.apply_checkpointing`
wraps the blocks; with ``loss_chunk`` the head and the loss are `course_utils.chunked_loss`'s.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .checkpointing import apply_checkpointing
from .chunked_loss import chunked_cross_entropy
from .config import ModelShape
from .hardware import require_device
from .i18n import tr
from .terms import check_positive_int

__all__ = ["CausalSelfAttention", "MLP", "Block", "GPT", "build_model"]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: ``"sdpa"`` calls ``F.scaled_dot_product_attention``
    (O(seq) saved memory); ``"naive"`` writes softmax(QK^T / sqrt(d_head)) V out, saving the
    (batch, heads, seq, seq) attention matrix: O(seq^2).
    """

    def __init__(self, d_model: int, n_heads: int, attention: str = "sdpa"):
        super().__init__()
        self.n_heads = n_heads
        self.attention = attention
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
            y = scores.softmax(dim=-1) @ v
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(d, 4d) -> GELU -> Linear(4d, d)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, d_model: int, n_heads: int, attention: str = "sdpa"):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, attention)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class GPT(nn.Module):
    """Byte-level GPT of ``shape`` (`course_utils.config.ModelShape`): embeddings -> ``layers``
    -> LayerNorm -> head; ``loss_chunk``: tokens per chunk of the cross-entropy (0: plain).

    Raises:
        ValueError: ``loss_chunk`` is not an integer >= 0.
    """

    def __init__(self, shape: ModelShape, loss_chunk: int = 0):
        super().__init__()
        check_positive_int("loss_chunk", loss_chunk, minimum=0)
        self.shape = shape
        self.loss_chunk = loss_chunk
        d = shape.d_model
        self.tok_emb = nn.Embedding(shape.vocab_size, d)
        self.pos_emb = nn.Embedding(shape.seq_len, d)
        self.layers = nn.ModuleList(Block(d, shape.n_heads, shape.attention)
                                    for _ in range(shape.n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, shape.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        # GPT-2's initialisation: N(0, 0.02) weights, zero biases
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """``(logits, loss)`` of ``idx`` ``(B, T)`` int64 bytes: logits ``(B, T, vocab)`` and, if
        ``targets`` ``(B, T)`` is given, the mean cross-entropy (else None). With ``loss_chunk``
        and ``targets``, the logits are None: the full logits are never computed.

        Raises:
            ValueError: ``idx`` is longer than ``shape.seq_len``.
        """
        B, T = idx.shape
        if T > self.shape.seq_len:
            raise ValueError(tr("sequence of {T} tokens is longer than the model's seq_len "
                                "{seq_len}.", T=T, seq_len=self.shape.seq_len))
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.layers:
            x = block(x)
        x = self.ln_f(x)
        if targets is not None and self.loss_chunk:
            return None, chunked_cross_entropy(x, self.head.weight, targets, self.loss_chunk)
        logits = self.head(x)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def build_model(config) -> GPT:
    """The model of a `RunConfig`, seeded by ``config.seed`` (equal on one device), its
    checkpoint policy and ``loss_chunk`` applied, built in fp32 on ``config.device``.

    Raises:
        ValueError: ``config.device`` is not available on this machine.
    """
    require_device(config.device)
    torch.manual_seed(config.seed)
    # built where it runs: a CPU build and copy took 3.5-4 s at the h100 size (results/gpu-budget.md)
    with torch.device(config.device):
        model = GPT(config.shape, config.loss_chunk)
    apply_checkpointing(model, config.checkpoint)
    return model.to(config.device)
