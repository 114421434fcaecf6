r"""Chunked cross-entropy: the head matmul and the loss of a language model a few tokens at a
time, so that the full ``(tokens, vocabulary)`` logits, which checkpointing never touches (they
come after the last block), never exist.

Relatives: NVIDIA NeMo AutoModel's ``ChunkedCrossEntropy`` (each chunk recomputed in backward,
as here); Apple's Cut Cross-Entropy (Wijmans et al. 2024, arXiv 2411.09009, in Triton);
torchtune's ``CEWithChunkedOutputLoss`` (PR 1390) and ``LinearCrossEntropyLoss``; Liger Kernel's
``LigerFusedLinearCrossEntropyLoss`` and torch 2.13's ``F.linear_cross_entropy``, which compute
the gradients in forward. This one is plain PyTorch, so that it runs on every torch the course
supports (>= 2.7) and its bytes can be stated exactly (`chunked_loss_bytes`).
"""
from __future__ import annotations

import torch

from .i18n import tr
from .terms import check_positive_int

__all__ = ["IGNORE_INDEX", "chunked_cross_entropy", "chunked_loss_bytes"]

#: The target value that does not count, as ``F.cross_entropy``'s default ``ignore_index``.
IGNORE_INDEX = -100


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The head matmul's dtype: autocast's where it is on (``linear`` is on every device's
    lower-precision list), else the inputs' own (ValueError if they differ, as ``F.linear``)."""
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    if hidden.dtype != weight.dtype:
        raise ValueError(tr("hidden is {hidden} and weight {weight}: run under torch.autocast or "
                            "give both one dtype.", hidden=hidden.dtype, weight=weight.dtype))
    return hidden.dtype


def _logits_fp32(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """One chunk's logits ``(c, V)``: the matmul in ``h``'s dtype, upcast to fp32."""
    logits = torch.mm(h, w.t()) if b is None else torch.addmm(b, h, w.t())
    return logits.float()


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """``mean(logsumexp(h W^T + b) - (h W^T + b)[target])`` over the counted tokens, chunk by
    chunk; saves ``h``, ``W``, ``b``, the targets and the fp32 log-sum-exp. Autocast is off
    inside: the caller casts ``h``, ``W`` and ``b``; the softmax arithmetic is fp32."""

    @staticmethod
    def forward(ctx, h, w, b, targets, chunk, ignore_index):
        with torch.autocast(h.device.type, enabled=False):
            n = h.shape[0]
            valid = targets != ignore_index
            safe = torch.where(valid, targets, 0)
            lse = torch.empty(n, dtype=torch.float32, device=h.device)
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            for s in range(0, n, chunk):
                e = min(s + chunk, n)
                x = _logits_fp32(h[s:e], w, b)
                picked = x.gather(1, safe[s:e, None]).squeeze(1)
                m = x.amax(1, keepdim=True)
                x.sub_(m).exp_()                                  # in place: no second (c, V)
                lse[s:e] = x.sum(1).log_().add_(m.squeeze(1))
                del x
                total += ((lse[s:e] - picked) * valid[s:e]).sum()
            ctx.save_for_backward(h, w, b, targets, lse)
            ctx.chunk, ctx.ignore_index = chunk, ignore_index
            return total / valid.sum()                            # 0/0 = nan, as F.cross_entropy

    @staticmethod
    def backward(ctx, grad_loss):
        h, w, b, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        with torch.autocast(h.device.type, enabled=False):
            valid = targets != ctx.ignore_index
            safe = torch.where(valid, targets, 0)
            coef = valid * (grad_loss.float() / valid.sum())      # d loss / d (token's term)
            grad_h = torch.empty_like(h) if need_h else None
            grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
            grad_b = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device) if need_b else None
            for s in range(0, h.shape[0], ctx.chunk):
                e = min(s + ctx.chunk, h.shape[0])
                x = _logits_fp32(h[s:e], w, b)
                x.sub_(lse[s:e, None]).exp_()                     # softmax, in place
                x.scatter_add_(1, safe[s:e, None], -valid[s:e, None].float())  # minus one-hot
                x.mul_(coef[s:e, None])                           # the logits' gradient, fp32
                if need_b:
                    grad_b += x.sum(0)
                g = x.to(h.dtype)
                del x
                if need_h:
                    torch.mm(g, w, out=grad_h[s:e])
                if need_w:
                    if g.dtype == torch.float32:
                        grad_w.addmm_(g.t(), h[s:e])
                    else:
                        grad_w += torch.mm(g.t(), h[s:e])         # accumulated in fp32
                del g
        grad_w = grad_w.to(w.dtype) if need_w else None
        grad_b = grad_b.to(b.dtype) if need_b else None
        return grad_h, grad_w, grad_b, None, None, None


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk_tokens: int, bias: torch.Tensor | None = None,
                          ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    r"""``F.cross_entropy(F.linear(hidden, weight, bias), targets)`` computed ``chunk_tokens``
    tokens at a time: the full ``(N, V)`` logits are never alive, in forward or in backward.

    Args:
        hidden: the final hidden states, ``(B, T, d)`` or ``(N, d)`` (``N`` tokens).
        weight: the head's weight, ``(V, d)`` (``V``: vocabulary).
        targets: int64 token ids, ``(B, T)`` or ``(N,)``; ``ignore_index`` marks tokens that do
            not count (no counted token gives ``nan``, as ``F.cross_entropy``).
        chunk_tokens: tokens per chunk (>= 1). bias: the head's bias ``(V,)``, or None.

    Returns:
        The loss, a 0-dim fp32 tensor.

    Forward keeps each token's fp32 log-sum-exp; backward recomputes each chunk's logits, so
    the bytes are ours to state on every device (`chunked_loss_bytes`), unlike a checkpointed
    ``F.cross_entropy`` per chunk. Under autocast the matmul runs in autocast's dtype and the
    softmax in fp32. Equal to the plain loss within rounding (tests/test_chunked_loss.py).

    Raises:
        ValueError: ``chunk_tokens`` not a positive integer; shapes that do not fit; ``targets``
            not int64, or outside ``[0, V)`` where not ``ignore_index`` (not checked inside
            ``torch.compile``); without autocast, inputs of different dtypes.
    """
    check_positive_int("chunk_tokens", chunk_tokens)
    if hidden.dim() not in (2, 3):
        raise ValueError(tr("hidden must be (B, T, d) or (N, d), got shape {shape}.",
                            shape=tuple(hidden.shape)))
    d = hidden.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != d:
        raise ValueError(tr("weight must be (V, {d}) for hidden of width {d}, got shape {shape}.",
                            d=d, shape=tuple(weight.shape)))
    V = weight.shape[0]
    if bias is not None and tuple(bias.shape) != (V,):
        raise ValueError(tr("bias must be ({V},), got shape {shape}.", V=V,
                            shape=tuple(bias.shape)))
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(tr("targets must have shape {want} (one per token), got {shape}.",
                            want=tuple(hidden.shape[:-1]), shape=tuple(targets.shape)))
    if targets.dtype != torch.int64:
        raise ValueError(tr("targets must be int64 token ids, got {dtype}.", dtype=targets.dtype))
    t = targets.reshape(-1)
    if not torch.compiler.is_compiling():
        bad = ((t < 0) | (t >= V)) & (t != ignore_index)
        if bool(bad.any()):
            raise ValueError(tr("target {target} is outside the vocabulary [0, {V}) and is not "
                                "ignore_index ({ignore_index}).", target=int(t[bad][0]), V=V,
                                ignore_index=ignore_index))
    dtype = _compute_dtype(hidden, weight)
    h = hidden.reshape(-1, d).to(dtype)
    w = weight.to(dtype)
    b = bias.to(dtype) if bias is not None else None
    return _ChunkedLinearCrossEntropy.apply(h, w, b, t, chunk_tokens, ignore_index)


def chunked_loss_bytes(tokens: int, d_model: int, vocab_size: int, chunk_tokens: int,
                       elem_bytes: int, device_type: str = "cpu") -> dict:
    """Bytes of `chunked_cross_entropy` in one training step, without bias, for ``tokens``
    tokens (``N``), width ``d``, vocabulary ``V``, chunks of ``C = min(chunk_tokens, N)`` tokens
    and the head matmul in ``a = elem_bytes`` bytes (4 fp32, 2 bf16/fp16), read from its code;
    ``a' = 0`` in fp32 (the matmul's output is the fp32 buffer), else ``a``.

    Returns:
        ``{"saved": 4 N`` (the fp32 log-sum-exp; hidden state, weight and targets are kept by
        the plain loss too), ``"forward": C V (4 + a')`` (one chunk's logits and their fp32
        copy), ``"backward"``: ``N d a + 4 V d`` (the hidden state's and the fp32 weight's
        gradients) plus the largest of ``C V (4 + a')``, ``a' (C V + V d)`` + ``4 V d`` on a CPU
        (TensorIterator copies a low-precision operand to fp32 for an in-place add,
        ``compute_types`` in aten/src/ATen/TensorIterator.cpp; 0 on an H200) and ``a' V d``.
        Within 32 bytes a token of the CPU profiler's peaks (tests/test_chunked_loss.py), and
        backward within 0.1 % of an H200's allocator peak (torch 2.11, V 128,256).

    Raises:
        ValueError: a size that is not a positive integer, ``elem_bytes`` not 2 or 4.
    """
    for name, v in (("tokens", tokens), ("d_model", d_model), ("vocab_size", vocab_size),
                    ("chunk_tokens", chunk_tokens)):
        check_positive_int(name, v)
    if elem_bytes not in (2, 4):
        raise ValueError(tr("elem_bytes must be 2 or 4, got {elem_bytes!r}.", elem_bytes=elem_bytes))
    N, d, V, a = tokens, d_model, vocab_size, elem_bytes
    C = min(chunk_tokens, N)
    low = 0 if a == 4 else a
    cast_copy = 4 * V * d if low and device_type == "cpu" else 0
    return {"saved": 4 * N,
            "forward": C * V * (4 + low),
            "backward": N * d * a + 4 * V * d + max(C * V * (4 + low),
                                                    low * (C * V + V * d) + cast_copy,
                                                    low * V * d)}
