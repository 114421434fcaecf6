"""Activation checkpointing for the course's model: which blocks recompute in backward.

`apply_checkpointing(model, policy)` wraps blocks of ``model.layers`` in `Checkpointed` modules
whose forward is the call the lessons teach, ``checkpoint(run_blocks, blocks, x,
use_reentrant=False, context_fn=...)``, as torchtitan's ``apply_ac`` wraps blocks. The policies
(`MODES`): ``none``; ``full`` (every block on its own); ``every-K`` (blocks 0, K, 2K, ...);
``segments:N`` (N contiguous segments, `segment_bounds`, *every* one checkpointed, unlike
``checkpoint_sequential``'s last); ``selective`` (every block, keeping the outputs of matmuls and
attention, `SAVE`); ``memory-budget:B`` (all blocks compiled as one region under the
partitioner's ``activation_memory_budget`` B: 1.0 is the default plan, 0.0 the activation memory
of checkpointing the whole compiled region).

Sources: ``torch.utils.checkpoint`` docs (``use_reentrant`` must be passed explicitly,
pytorch#65537); the PyTorch blog "Current and New Activation Checkpointing Techniques in
PyTorch" (2025); torchtitan ``torchtitan/distributed/activation_checkpoint.py``; Korthikanti et
al. 2022 (arXiv 2205.05198); the comment on ``activation_memory_budget`` in
``torch/_functorch/config.py`` (torch 2.13).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
    noop_context_fn,
)

from .i18n import tr

__all__ = ["MODES", "Policy", "parse_policy", "segment_bounds", "apply_checkpointing",
           "run_blocks", "checkpoint_every_segment", "Checkpointed", "CompiledUnderBudget",
           "SAVE", "save_matmuls_and_attention", "SelectiveContexts", "sac_kept",
           "selective_contexts"]

#: The policy names (K, N: integers from 1 to the number of blocks; B: from 0 to 1).
MODES = ("none", "full", "every-K", "segments:N", "selective", "memory-budget:B")

_PATTERNS = {"every-k": r"every-(\d+)", "segments": r"segments:(\d+)",
             "memory-budget": r"memory-budget:([0-9]*\.?[0-9]+)"}


@dataclass(frozen=True)
class Policy:
    """A parsed checkpoint policy: ``mode`` (``none``, ``full``, ``every-k``, ``segments``,
    ``selective``, ``memory-budget``) and its argument (K, N, B or None)."""

    mode: str
    arg: int | float | None = None


def _invalid(policy, n_layers: int, why: str) -> ValueError:
    return ValueError(tr("checkpoint policy {policy!r} does not fit a model of {n} blocks: "
                         "{why}. Valid policies: {modes} (K and N from 1 to {n}, B from 0 to 1).",
                         policy=policy, n=n_layers, why=why, modes=", ".join(MODES)))


def parse_policy(policy: str, n_layers: int) -> Policy:
    """Parse ``policy`` for a model of ``n_layers`` blocks.

    Raises:
        ValueError: not one of `MODES`, or K / N outside 1..n_layers, B outside 0..1.
    """
    if not isinstance(policy, str):
        raise _invalid(policy, n_layers, tr("a policy is a string"))
    p = policy.strip().lower()
    if p in ("none", "full", "selective"):
        return Policy(p)
    for mode, pattern in _PATTERNS.items():
        if (m := re.fullmatch(pattern, p)) is None:
            continue
        if mode == "memory-budget":
            b = float(m.group(1))
            if not 0.0 <= b <= 1.0:
                raise _invalid(policy, n_layers, tr("B={b} is outside 0..1", b=b))
            return Policy(mode, b)
        k = int(m.group(1))
        if not 1 <= k <= n_layers:
            raise _invalid(policy, n_layers, tr("{k} is outside 1..{n}", k=k, n=n_layers))
        return Policy(mode, k)
    raise _invalid(policy, n_layers, tr("unknown policy name"))


def segment_bounds(n_blocks: int, n_segments: int) -> list[tuple[int, int]]:
    """Split blocks ``0..n_blocks-1`` into ``n_segments`` contiguous ``(start, stop)`` ranges of
    near-equal length, the longer ones first (``divmod``): the course's one segment rule.

    >>> segment_bounds(10, 3)
    [(0, 4), (4, 7), (7, 10)]

    Raises:
        ValueError: ``n_segments`` outside 1..n_blocks.
    """
    if not 1 <= n_segments <= n_blocks:
        raise ValueError(tr("n_segments must be in 1..{n}, got {segments}.", n=n_blocks,
                            segments=n_segments))
    base, extra = divmod(n_blocks, n_segments)
    stops = list(accumulate(base + (i < extra) for i in range(n_segments)))
    return list(zip([0, *stops[:-1]], stops))


def run_blocks(blocks, x: torch.Tensor) -> torch.Tensor:
    """Run ``x`` through ``blocks`` in order (the plain, uncheckpointed path)."""
    for block in blocks:
        x = block(x)
    return x


def checkpoint_every_segment(blocks, x: torch.Tensor, n_segments: int) -> torch.Tensor:
    """Run ``x`` through ``blocks`` split into ``n_segments`` segments (`segment_bounds`), each
    checkpointed as one unit: only the segment inputs stay saved (what ``segments:N`` does)."""
    for start, stop in segment_bounds(len(blocks), n_segments):
        x = checkpoint(run_blocks, blocks[start:stop], x, use_reentrant=False)
    return x


class Checkpointed(nn.Module):
    """``blocks`` run as one region of non-reentrant ``torch.utils.checkpoint``, with its
    ``context_fn`` (selective checkpointing passes one): only the input is saved for backward."""

    def __init__(self, blocks, context_fn=noop_context_fn):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.context_fn = context_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(run_blocks, self.blocks, x, use_reentrant=False,
                          context_fn=self.context_fn)


class CompiledUnderBudget(nn.Module):
    """Blocks compiled with ``torch.compile`` as one region under the activation memory budget
    ``budget`` (``torch._functorch.config.activation_memory_budget``): 1.0 is the default plan,
    which already recomputes cheap pointwise ops; 0.0 the activation memory of checkpointing the
    whole region. Each instance has a backend of its own: dynamo guards a graph on its backend,
    not on the budget, so a shared backend reused one budget's graph for the next (torch 2.13).
    """

    def __init__(self, blocks, budget: float):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.budget = float(budget)
        self.compiled = torch.compile(self.blocks, backend=_budget_backend(self.budget))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.compiled(x)


def _budget_backend(budget: float):
    """A new ``torch.compile`` backend: inductor, with the activation memory budget patched."""
    def backend(gm, example_inputs):
        # lazy: torch.compile's stack (inductor) loads only when a memory-budget model compiles
        import torch._functorch.config as functorch_config
        from torch._inductor.compile_fx import compile_fx
        with functorch_config.patch(activation_memory_budget=budget):
            return compile_fx(gm, example_inputs)
    return backend


# --- selective checkpointing: the save list and policy that lesson 02 shows -----------------

aten = torch.ops.aten
SAVE = {aten.mm.default, aten.addmm.default, aten.bmm.default,
        # the attention kernel's name depends on the device and kernel:
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default}


def save_matmuls_and_attention(ctx, op, *args, **kwargs):
    # Runs for every op in the checkpointed region's forward: keep its output, or recompute it?
    if op in SAVE:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class SelectiveContexts:
    """``checkpoint``'s ``context_fn`` for selective checkpointing with ``policy``, whose kept
    tensors the meter counts: while ``recording`` is a list, each forward context made is added
    to it for `sac_kept` to read (not the policy's ``ctx.op_output``, which torch 2.11 lacks)."""

    def __init__(self, policy=save_matmuls_and_attention):
        self.policy = policy
        self.recording: list | None = None

    def __call__(self):
        forward_ctx, recompute_ctx = create_selective_checkpoint_contexts(self.policy)
        if self.recording is not None:
            self.recording.append(forward_ctx)
        return forward_ctx, recompute_ctx


def sac_kept(forward_contexts) -> list[torch.Tensor] | None:
    """The tensors that selective checkpointing's ``forward_contexts`` kept, read from each
    one's cache (``storage``, since torch 2.4 a dict of ``val`` tensors), or None where unreadable."""
    kept = []
    for ctx in forward_contexts:
        storage = getattr(ctx, "storage", None)
        if not isinstance(storage, dict):
            return None
        for leaf in tree_leaves(storage):
            val = getattr(leaf, "val", None)
            if isinstance(val, torch.Tensor):
                kept.append(val)
    return kept


def selective_contexts(model: nn.Module) -> list[SelectiveContexts]:
    """The `SelectiveContexts` of ``model``'s selective-checkpointing regions: the
    ``context_fn`` of any wrapper module (`Checkpointed`, lesson 05's per-block wrapper)."""
    return [m.context_fn for m in model.modules()
            if isinstance(getattr(m, "context_fn", None), SelectiveContexts)]


def _wrapped(layers: list, p: Policy) -> list:
    """``layers`` wrapped for policy ``p``: one branch per mode."""
    if p.mode == "none":
        return layers
    if p.mode == "full":
        return [Checkpointed([b]) for b in layers]
    if p.mode == "every-k":
        return [Checkpointed([b]) if i % p.arg == 0 else b for i, b in enumerate(layers)]
    if p.mode == "segments":
        return [Checkpointed(layers[a:b]) for a, b in segment_bounds(len(layers), p.arg)]
    if p.mode == "selective":
        return [Checkpointed([b], SelectiveContexts(save_matmuls_and_attention)) for b in layers]
    return [CompiledUnderBudget(layers, p.arg)]


def apply_checkpointing(model: nn.Module, policy: str) -> nn.Module:
    """Apply ``policy`` to ``model`` in place and return it: ``model.layers`` (an
    ``nn.ModuleList`` of blocks) is replaced by the wrapped units; the parameters are the same
    objects under longer names (``layers.0.blocks.0.ln1.weight``).

    Raises:
        ValueError: a policy `parse_policy` refuses, a model without ``layers``, or one whose
            blocks are already wrapped.
    """
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(tr("apply_checkpointing needs a model with its blocks in an "
                            "nn.ModuleList called 'layers' (the course's GPT); for another model "
                            "call torch.utils.checkpoint.checkpoint in its forward."))
    if any(isinstance(m, (Checkpointed, CompiledUnderBudget)) for m in layers):
        raise ValueError(tr("this model's blocks are already wrapped: build a fresh model "
                            "(build_model(config.replace(checkpoint=...))) to change the "
                            "policy."))
    p = parse_policy(policy, len(layers))
    model.layers = nn.ModuleList(_wrapped(list(layers), p))
    return model
