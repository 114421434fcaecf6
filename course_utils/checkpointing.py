"""Activation checkpointing for the course's model: which blocks recompute in backward.

`apply_checkpointing(model, policy)` wraps blocks of ``model.layers`` in `Checkpointed`
modules whose forward is the call the lessons teach,
``checkpoint(run_blocks, blocks, x, use_reentrant=False, context_fn=...)``, as torchtitan's
``apply_ac`` wraps blocks; the model's forward stays a plain loop over ``model.layers``.

The policies form a closed set:

=====================  ================================================================
``none``               no checkpointing: every block keeps all its saved tensors.
``full``               every block checkpointed on its own: only block inputs stay saved.
``every-K``            blocks 0, K, 2K, ... checkpointed one by one; the others run plain.
``segments:N``         the blocks split into N contiguous segments (`segment_bounds`), *every*
                       segment checkpointed as one unit (unlike
                       ``torch.utils.checkpoint.checkpoint_sequential``, which always runs its
                       last segment plain).
``selective``          every block checkpointed with an op-level save list (selective
                       activation checkpointing, SAC): the outputs of matmuls and attention
                       (`SAVE`) are kept, the cheap pointwise ops are recomputed.
``memory-budget:B``    all blocks compiled with ``torch.compile``, whose partitioner keeps at
                       most the fraction B (0 to 1) of the activations
                       (``torch._functorch.config.activation_memory_budget``).
=====================  ================================================================

Sources: ``torch.utils.checkpoint`` docs (``use_reentrant`` must be passed explicitly,
pytorch#65537; ``create_selective_checkpoint_contexts``); the PyTorch blog "Current and New
Activation Checkpointing Techniques in PyTorch" (2025); torchtitan
``torchtitan/distributed/activation_checkpoint.py`` (one function per mode); Korthikanti et al.
2022 (arXiv 2205.05198) for selective recomputation.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts, noop_context_fn)

__all__ = ["MODES", "Policy", "parse_policy", "segment_bounds", "apply_checkpointing",
           "run_blocks", "Checkpointed", "CompiledUnderBudget", "SAVE",
           "save_matmuls_and_attention", "RecordingPolicy", "recording_policies"]

#: The policy names, as written in a config (K, N: integers from 1 to the number of blocks;
#: B: a fraction from 0 to 1).
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
    return ValueError(f"checkpoint policy {policy!r} does not fit a model of {n_layers} blocks: "
                      f"{why}. Valid policies: {', '.join(MODES)} (K and N from 1 to "
                      f"{n_layers}, B from 0 to 1).")


def parse_policy(policy: str, n_layers: int) -> Policy:
    """Parse ``policy`` for a model of ``n_layers`` blocks.

    Raises:
        ValueError: not one of `MODES`, or K / N outside 1..n_layers, B outside 0..1; the
            message lists the valid policies.
    """
    if not isinstance(policy, str):
        raise _invalid(policy, n_layers, "a policy is a string")
    p = policy.strip().lower()
    if p in ("none", "full", "selective"):
        return Policy(p)
    for mode, pattern in _PATTERNS.items():
        m = re.fullmatch(pattern, p)
        if m is None:
            continue
        if mode == "memory-budget":
            b = float(m.group(1))
            if not 0.0 <= b <= 1.0:
                raise _invalid(policy, n_layers, f"B={b} is outside 0..1")
            return Policy(mode, b)
        k = int(m.group(1))
        if not 1 <= k <= n_layers:
            raise _invalid(policy, n_layers, f"{k} is outside 1..{n_layers}")
        return Policy(mode, k)
    raise _invalid(policy, n_layers, "unknown policy name")


def segment_bounds(n_blocks: int, n_segments: int) -> list[tuple[int, int]]:
    """Split blocks ``0..n_blocks-1`` into ``n_segments`` contiguous ``(start, stop)`` ranges of
    near-equal length, the longer ones first (``divmod``): the course's one segment rule.

    >>> segment_bounds(10, 3)
    [(0, 4), (4, 7), (7, 10)]

    Raises:
        ValueError: ``n_segments`` outside 1..n_blocks.
    """
    if not 1 <= n_segments <= n_blocks:
        raise ValueError(f"n_segments must be in 1..{n_blocks}, got {n_segments}.")
    base, extra = divmod(n_blocks, n_segments)
    bounds, start = [], 0
    for i in range(n_segments):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def run_blocks(blocks, x: torch.Tensor) -> torch.Tensor:
    """Run ``x`` through ``blocks`` in order (the plain, uncheckpointed path)."""
    for block in blocks:
        x = block(x)
    return x


class Checkpointed(nn.Module):
    """Blocks run as one checkpointed region: only its input is saved for backward, and
    backward runs its forward again (non-reentrant ``torch.utils.checkpoint``).

    Args:
        blocks: the blocks of the region, in order.
        context_fn: ``checkpoint``'s ``context_fn`` (selective checkpointing passes one).
    """

    def __init__(self, blocks, context_fn=noop_context_fn):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.context_fn = context_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(run_blocks, self.blocks, x, use_reentrant=False,
                          context_fn=self.context_fn)


class CompiledUnderBudget(nn.Module):
    """Blocks compiled with ``torch.compile``, the partitioner told to keep at most ``budget``
    (0 to 1) of their activations (``torch._functorch.config.activation_memory_budget``, read
    at compile time: the setting is patched around every call, the first one compiles)."""

    def __init__(self, blocks, budget: float):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)
        self.budget = float(budget)
        self.compiled = torch.compile(self.blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch._functorch.config as functorch_config
        with functorch_config.patch(activation_memory_budget=self.budget):
            return self.compiled(x)


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


class RecordingPolicy:
    """A selective-checkpointing policy that remembers what it kept, for the meter.

    Calls ``policy`` and, while ``kept`` is a list (the meter sets one for the duration of a
    forward; it is None otherwise), appends ``(device, storage pointer, nbytes, shape, dtype)``
    for every tensor the policy keeps in the forward pass. It stores no tensor, so it keeps
    nothing alive. (Tensors kept by SAC live in SAC's cache, where saved-tensor hooks cannot
    see them.)
    """

    def __init__(self, policy=save_matmuls_and_attention):
        self.policy = policy
        self.kept: list | None = None

    def __call__(self, ctx, op, *args, **kwargs):
        decision = self.policy(ctx, op, *args, **kwargs)
        if (self.kept is not None and not ctx.is_recompute
                and decision in (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)):
            for t in tree_leaves(getattr(ctx, "op_output", None)):
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage()
                    self.kept.append((str(t.device), st.data_ptr(), st.nbytes(), tuple(t.shape),
                                      t.dtype))
        return decision


def recording_policies(model: nn.Module) -> list[RecordingPolicy]:
    """The `RecordingPolicy` objects of ``model``'s selective-checkpointing regions."""
    return [m.sac_policy for m in model.modules()
            if isinstance(getattr(m, "sac_policy", None), RecordingPolicy)]


# --- one function per mode ----------------------------------------------------------------

def _apply_none(layers, arg):
    return list(layers)


def _apply_full(layers, arg):
    return [Checkpointed([b]) for b in layers]


def _apply_every_k(layers, arg):
    return [Checkpointed([b]) if i % arg == 0 else b for i, b in enumerate(layers)]


def _apply_segments(layers, arg):
    return [Checkpointed(layers[a:b]) for a, b in segment_bounds(len(layers), arg)]


def _apply_selective(layers, arg):
    units = []
    for b in layers:
        policy = RecordingPolicy(save_matmuls_and_attention)
        unit = Checkpointed([b], functools.partial(create_selective_checkpoint_contexts, policy))
        unit.sac_policy = policy
        units.append(unit)
    return units


def _apply_memory_budget(layers, arg):
    return [CompiledUnderBudget(list(layers), arg)]


_APPLY = {"none": _apply_none, "full": _apply_full, "every-k": _apply_every_k,
          "segments": _apply_segments, "selective": _apply_selective,
          "memory-budget": _apply_memory_budget}


def apply_checkpointing(model: nn.Module, policy: str) -> nn.Module:
    """Apply ``policy`` to ``model`` in place, by wrapping its blocks, and return it.

    ``model.layers`` (an ``nn.ModuleList`` of blocks, as in the course's GPT) is replaced by the
    wrapped units; the parameters are the same objects (an optimizer made before still works),
    under longer names (``layers.0.blocks.0.ln1.weight`` for a wrapped block). Apply a policy
    to a freshly built model (`course_utils.models.build_model` does).

    Raises:
        ValueError: an unknown policy, one that does not fit ``len(model.layers)``, a model
            without ``layers``, or a model whose blocks are already wrapped.
    """
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError("apply_checkpointing needs a model with its blocks in an nn.ModuleList "
                         "called 'layers' (the course's GPT); for another model call "
                         "torch.utils.checkpoint.checkpoint in its forward.")
    if any(isinstance(m, (Checkpointed, CompiledUnderBudget)) for m in layers):
        raise ValueError("this model's blocks are already wrapped: build a fresh model "
                         "(build_model(config.replace(checkpoint=...))) to change the policy.")
    p = parse_policy(policy, len(layers))
    model.layers = nn.ModuleList(_APPLY[p.mode](list(layers), p.arg))
    return model
