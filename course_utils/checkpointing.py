"""Checkpoint policies for the reference model: which blocks recompute in backward.

Policies (the course's names; DESIGN.md "Terms"):

=================  =====================================================================
``none``           no checkpointing: every block keeps all its saved tensors.
``full``           every block checkpointed on its own (``use_reentrant=False``): only the
                   block inputs stay saved.
``every-K``        blocks 0, K, 2K, ... checkpointed one by one; the others run plain.
``segments:N``     the blocks split into N contiguous segments of near-equal length, *every*
                   segment checkpointed (unlike ``torch.utils.checkpoint.checkpoint_sequential``,
                   which always runs its last segment plain).
``selective``      every block checkpointed with an op-level save list (selective activation
                   checkpointing, SAC): outputs of matmuls and attention are kept, the cheap
                   pointwise ops (LayerNorm, GELU, adds) are recomputed.
=================  =====================================================================

Sources: ``torch.utils.checkpoint`` docs (PyTorch 2.4+: ``use_reentrant`` must be passed
explicitly, pytorch#65537; ``create_selective_checkpoint_contexts``); the PyTorch blog "Current
and New Activation Checkpointing Techniques in PyTorch" (2025); Korthikanti et al. 2022
(arXiv 2205.05198) for selective recomputation.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)

__all__ = ["Segment", "POLICIES", "plan_segments", "apply_checkpointing", "run_blocks",
           "SELECTIVE_SAVE_OPS", "selective_policy", "selective_context_fn"]

#: The policy names and their syntax, for error messages and docs.
POLICIES = ("none", "full", "every-K", "segments:N", "selective")


@dataclass(frozen=True)
class Segment:
    """Blocks ``start`` .. ``stop - 1`` run as one unit; ``checkpointed`` says if recomputed."""

    start: int
    stop: int
    checkpointed: bool


def _policy_error(policy, n_layers, why: str) -> ValueError:
    return ValueError(f"checkpoint policy {policy!r} does not fit a model of {n_layers} layers: "
                      f"{why}. Valid policies: {', '.join(POLICIES)} "
                      f"(K from 1 to {n_layers}, N from 1 to {n_layers}).")


def plan_segments(policy: str, n_layers: int) -> list[Segment]:
    """The segments a policy runs for a model of ``n_layers`` blocks.

    ``selective`` plans like ``full`` (one checkpointed segment a block); its save list is
    applied by `selective_context_fn`.

    Returns:
        Segments covering ``range(n_layers)`` in order.

    Raises:
        ValueError: an unknown policy, or K / N outside 1..n_layers.
    """
    if not isinstance(policy, str):
        raise _policy_error(policy, n_layers, "a policy is a string")
    p = policy.strip().lower()
    if p == "none":
        return [Segment(0, n_layers, False)]
    if p in ("full", "selective"):
        return [Segment(i, i + 1, True) for i in range(n_layers)]
    m = re.fullmatch(r"every-(\d+)", p)
    if m:
        k = int(m.group(1))
        if not 1 <= k <= n_layers:
            raise _policy_error(policy, n_layers, f"K={k} is outside 1..{n_layers}")
        return [Segment(i, i + 1, i % k == 0) for i in range(n_layers)]
    m = re.fullmatch(r"segments:(\d+)", p)
    if m:
        n = int(m.group(1))
        if not 1 <= n <= n_layers:
            raise _policy_error(policy, n_layers, f"N={n} is outside 1..{n_layers}")
        base, extra = divmod(n_layers, n)
        segs, start = [], 0
        for i in range(n):
            stop = start + base + (1 if i < extra else 0)
            segs.append(Segment(start, stop, True))
            start = stop
        return segs
    raise _policy_error(policy, n_layers, "unknown policy name")


#: ATen ops whose outputs the ``selective`` policy keeps: matmuls and attention. The attention
#: op's name depends on the device and kernel (CPU: ``_scaled_dot_product_flash_attention_for_cpu``;
#: CUDA: flash, memory-efficient or cuDNN), so all of them are listed.
SELECTIVE_SAVE_OPS = tuple(op for op in (
    getattr(torch.ops.aten, name, None) for name in (
        "mm", "addmm", "bmm", "baddbmm",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )) if op is not None)


#: Callables that `selective_policy` hands each tensor it keeps (the forward pass only).
#: `course_utils.measure` listens here: tensors kept by SAC are invisible to
#: ``saved_tensors_hooks`` (they live in SAC's own cache, not in the autograd graph).
SAC_SAVE_LISTENERS: list = []


def selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """SAC policy: keep the outputs of `SELECTIVE_SAVE_OPS`, recompute everything else."""
    if op in SELECTIVE_SAVE_OPS or getattr(op, "overloadpacket", None) in SELECTIVE_SAVE_OPS:
        if SAC_SAVE_LISTENERS and not ctx.is_recompute:
            for listener in SAC_SAVE_LISTENERS:
                listener(getattr(ctx, "op_output", None))
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def selective_context_fn():
    """The ``context_fn`` for ``checkpoint(..., context_fn=...)`` that applies `selective_policy`."""
    return create_selective_checkpoint_contexts(selective_policy)


def run_blocks(blocks, x: torch.Tensor) -> torch.Tensor:
    """Run ``x`` through ``blocks`` in order (the plain, uncheckpointed path)."""
    for block in blocks:
        x = block(x)
    return x


def forward_with_plan(layers, x: torch.Tensor, plan: list[Segment], context_fn=None) -> torch.Tensor:
    """Run ``layers`` (an ``nn.ModuleList``) on ``x`` following ``plan``.

    Checkpointed segments go through ``checkpoint(run_blocks, blocks, x, use_reentrant=False)``
    when autograd is recording; under ``torch.no_grad()`` everything runs plain.
    """
    for seg in plan:
        blocks = layers[seg.start:seg.stop]
        if seg.checkpointed and torch.is_grad_enabled():
            kw = {"context_fn": context_fn} if context_fn is not None else {}
            x = checkpoint(run_blocks, blocks, x, use_reentrant=False, **kw)
        else:
            x = run_blocks(blocks, x)
    return x


def apply_checkpointing(model, policy: str):
    """Set ``model``'s checkpoint policy in place and return it.

    ``model`` must have ``layers`` (an ``nn.ModuleList`` of blocks) and the attributes
    ``checkpoint_plan`` / ``checkpoint_context_fn`` read by its forward (the course's
    `course_utils.models.GPT` does). Parameters and ``state_dict`` keys are unchanged.

    Raises:
        ValueError: an unknown policy, one that does not fit ``len(model.layers)``, or a model
            without ``layers``.
    """
    layers = getattr(model, "layers", None)
    if layers is None or not hasattr(model, "checkpoint_plan"):
        raise ValueError("apply_checkpointing needs the course's GPT model (blocks in "
                         "model.layers); for another model call torch.utils.checkpoint.checkpoint "
                         "in its forward.")
    model.checkpoint_plan = plan_segments(policy, len(layers))
    model.checkpoint_context_fn = (selective_context_fn if policy.strip().lower() == "selective"
                                   else None)
    model.checkpoint_policy = policy
    return model

