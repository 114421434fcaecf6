"""Lesson 05's estimate for a model `course_utils.memory_model.estimate` does not know: measure
small, extrapolate, check.

1. Per policy, one step at two small batches ``b1 < b2``: the forward + backward peak is a line
   ``P0 + s b`` and the optimizer step's peak ``O`` does not grow, so ``peak(b) = max(P0 + s b, O)``.
2. From the ``none`` run's saved tensors by module: a block's ``C + S b``, a block input's ``I b``
   and ``out`` outside the blocks; with ``L`` blocks ``none`` saves ``out + L (C + S b)``, ``full``
   ``out + L I b``, ``every-K`` ``out + c I b + (L - c)(C + S b)`` (``c = ceil(L / K)``),
   offloading ``out``.
3. `check_prediction` runs one real step at the largest batch predicted to fit a budget.

Assumes the peak is linear in the batch at a fixed sequence length; on the course's GPT the
prediction at 4x the larger batch is within 5 % of the analytic estimate (tests/test_extrapolate.py).
"""
from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd
import torch

from .experiments import size_text
from .guard import available_memory_bytes, cuda_memory_cap
from .hardware import detect
from .i18n import tr
from .profiling import (
    ModelSpec,
    ProfileConfig,
    _batch_info,
    block_of,
    find_blocks,
    measure_config,
    parse_model_policy,
)
from .terms import MiB, check_positive_int, device_kind

__all__ = ["RAM_FRACTION", "CUDA_PLANNING_SHARE", "ALLOC_CONF_HINT", "PolicyFit", "Extrapolation",
           "PredictionCheck", "extrapolate", "check_prediction", "block_input_bytes"]


@dataclass(frozen=True)
class PolicyFit:
    """One policy's peak as a line in the batch (bytes): forward + backward ``peaks`` at ``batches``,
    ``per_sample`` ``s``, ``intercept`` ``P0``, ``optimizer_peak`` ``O``, ``measured_peak`` at b2."""

    policy: str
    batches: tuple
    peaks: tuple
    per_sample: float
    intercept: float
    optimizer_peak: int
    measured_peak: int

    def peak(self, batch: int) -> int:
        """Predicted peak bytes of one step at ``batch``: ``max(P0 + s b, O)``."""
        return int(max(self.intercept + self.per_sample * batch, self.optimizer_peak))

    def largest_batch(self, budget_bytes: int, cap: int = 1 << 20) -> int:
        """The largest batch predicted to fit ``budget_bytes`` (0 if not even 1; at most ``cap``)."""
        if self.peak(1) > budget_bytes:
            return 0
        if self.per_sample <= 0:
            return cap
        return int(min(cap, math.floor((budget_bytes - self.intercept) / self.per_sample)))


@dataclass
class Extrapolation:
    """What `extrapolate` measured and predicts, in the module docstring's symbols: ``n_blocks``
    ``L``, ``block_saved`` ``S``, ``block_input`` ``I``, ``block_const`` ``C``, ``outside``
    ``(intercept, per sample)``; ``fits``, a `PolicyFit` per policy."""

    name: str
    precision: str
    device: str
    unit: str
    items_per_sample: int
    n_blocks: int
    block_saved: float
    block_input: float
    outside: tuple
    block_const: float = 0.0
    fits: dict = field(default_factory=dict)
    measurements: list = field(default_factory=list)
    spec: Any = field(default=None, repr=False)

    def _fit(self, policy: str) -> PolicyFit:
        if policy not in self.fits:
            raise KeyError(tr("policy {policy!r} was not measured: measured {measured}.",
                              policy=policy, measured=sorted(self.fits)))
        return self.fits[policy]

    def peak(self, batch: int, policy: str = "none") -> int:
        """Predicted peak bytes of one step at ``batch`` with ``policy`` (KeyError: not measured)."""
        return self._fit(policy).peak(batch)

    def largest_batch(self, budget_bytes: int, policy: str = "none") -> int:
        """The largest batch predicted to fit ``budget_bytes`` with ``policy`` (0 if none)."""
        return self._fit(policy).largest_batch(budget_bytes)

    def saved(self, batch: int, policy: str = "none") -> int | None:
        """Saved-tensor bytes on the device predicted from one block; None for a policy the block
        model cannot predict (``selective``, ``hf``); ValueError for an unknown policy."""
        mode, k = parse_model_policy(policy, self.n_blocks)
        if mode not in ("none", "full", "every-k", "offload", "offload+checkpoint"):
            return None
        L, S, In, C = self.n_blocks, self.block_saved, self.block_input, self.block_const
        ckpt = L if mode == "full" else math.ceil(L / k) if mode == "every-k" else 0
        plain = 0 if mode.startswith("offload") else L - ckpt
        out = self.outside[0] + self.outside[1] * batch
        return int(round(out + plain * (C + S * batch) + ckpt * In * batch))

    def table(self, batches) -> pd.DataFrame:
        """Predicted peak MiB per batch (rows) and policy (columns)."""
        return pd.DataFrame({p: [f.peak(b) / MiB for b in batches] for p, f in self.fits.items()},
                            index=pd.Index(list(batches), name="batch")).round(2).rename_axis(
                                columns="predicted peak MiB")


@dataclass(frozen=True)
class PredictionCheck:
    """One real step at the batch the prediction picked (`check_prediction`); bytes, None where
    not measured; ``error``: ``(predicted - measured) / measured``."""

    policy: str
    batch_size: int
    budget_bytes: int
    predicted_peak: int
    measured_peak: int | None
    error: float | None
    fits: bool
    oom: bool
    note: str
    measured_saved: int | None = None


#: On a CPU, `check_prediction` does not run a step predicted to need more than this share of the
#: RAM free now (nothing would stop it short of the kernel's out-of-memory killer).
RAM_FRACTION = 0.8

#: On CUDA, the share of a budget a predicted (allocated) peak may fill: the budget caps the
#: allocator's *reserved* memory, which also holds freed blocks it cannot hand out whole: on an
#: H100 a plan at 99.9 % of 70.8 GiB ran out of memory with 0.45 GiB held that way
#: (``results/NVIDIA-H100-80GB-HBM3-2026-11-26/profile-gpt2.txt``).
CUDA_PLANNING_SHARE = 0.9

#: What to try when reserved-but-unallocated memory runs a step out of memory (PyTorch's CUDA
#: memory-management notes; ``PYTORCH_CUDA_ALLOC_CONF``, the older name, is still read).
ALLOC_CONF_HINT = ("if much memory is reserved but unallocated, PYTORCH_ALLOC_CONF="
                   "expandable_segments:True lets the allocator grow blocks instead of "
                   "fragmenting them")


def _oom_gist(error: str | None) -> str:
    """What the step asked for, from an out-of-memory message, or ""."""
    ours = re.search(r"(the step asked for .*?)(?:;|\. |\.?$)", error or "")
    if ours:
        return f" ({ours.group(1).rstrip('.')})"
    found = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", error or "")
    return " " + tr("(the step asked for {size} more)", size=found.group(1)) if found else ""


def block_input_bytes(spec: ModelSpec, batch_size: int, precision: str = "fp32") -> int:
    """Storage bytes of block 0's first tensor argument in one forward at ``batch_size`` under
    ``precision``'s autocast."""
    model = spec.fresh("none")
    _, container = find_blocks(model, spec.blocks)
    seen = []

    def hook(module, args, kwargs):
        ts = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if ts and not seen:
            seen.append(ts[0].untyped_storage().nbytes())
    h = container[0].register_forward_pre_hook(hook, with_kwargs=True)
    cfg = ProfileConfig(spec.name, precision, device=spec.device)
    try:
        with torch.no_grad(), cfg.autocast():
            spec.forward(model, spec.batch(batch_size))
    finally:
        h.remove()
    if not seen:
        raise ValueError(tr("the first block received no tensor argument: cannot measure its "
                            "input."))
    return seen[0]


def extrapolate(model, make_batch: Callable[[int], Any], loss_fn: Callable | None = None, *,
                precision: str = "fp32", policies=("none", "full"), batches=(2, 4),
                device: str | None = None, blocks=None, forward: Callable | None = None,
                seed: int = 0, lr: float = 1e-3, name: str | None = None) -> Extrapolation:
    """One step at each of ``batches`` ``(b1, b2)`` per policy (``none`` always) in ``precision``:
    the `Extrapolation` that predicts the peak at any batch. The rest as `profiling.profile`.

    Raises:
        ValueError: ``batches`` not two increasing positive integers, an unknown precision or
            policy, an out-of-memory error at a measured batch; and what `profile` raises.
    """
    b = tuple(batches)
    try:
        for v in b:
            check_positive_int("a batch", v)
        if len(b) != 2 or b[0] >= b[1]:
            raise ValueError("not two increasing batches")
    except ValueError:
        raise ValueError(tr("batches must be two increasing positive integers (b1, b2), got "
                            "{batches!r}.", batches=batches)) from None
    spec = ModelSpec.create(model, make_batch, loss_fn, forward=forward, blocks=blocks,
                            device=device, seed=seed, name=name)
    _, container = find_blocks(spec.skeleton(), spec.blocks)
    L = len(container)
    policies = list(dict.fromkeys(["none", *policies]))
    for p in policies:
        parse_model_policy(p, L)
    _, unit, per = _batch_info(spec.batch(b[0]))
    ex = Extrapolation(spec.name, precision, spec.device, unit, per, L, 0.0, 0.0, (0.0, 0.0),
                       spec=spec)
    for policy in policies:
        ms = []
        for n in b:
            cfg = ProfileConfig(spec.name, precision, policy, n, spec.device, unit, per, seed=seed)
            m, _, _ = measure_config(spec, cfg, lr=lr)
            if m.oom:
                raise ValueError(tr("{config} ran out of memory at batch {batch}, one of the small "
                                    "batches measured: {error}", config=cfg.label, batch=n,
                                    error=m.error))
            if m.peak_forward_backward is None:
                raise ValueError(tr("no peak-memory counter on {device}: nothing to extrapolate "
                                    "from.", device=spec.device))
            ms.append(m)
        ex.measurements += ms
        (p1, p2) = (ms[0].peak_forward_backward, ms[1].peak_forward_backward)
        s = (p2 - p1) / (b[1] - b[0])
        ex.fits[policy] = PolicyFit(policy, b, (p1, p2), s, p1 - s * b[0],
                                    max(ms[0].peak_optimizer, ms[1].peak_optimizer),
                                    ms[1].peak_allocated)
        if policy == "none":
            per_block, outside = [], []
            for m in ms:
                df = m.saved_modules
                inside = df["module"].map(lambda name: block_of(name, spec.blocks) is not None)
                per_block.append(df.loc[inside, "nbytes"].sum() / L)
                outside.append(df.loc[~inside, "nbytes"].sum())
            ex.block_saved = (per_block[1] - per_block[0]) / (b[1] - b[0])
            ex.block_const = max(0.0, per_block[0] - ex.block_saved * b[0])
            slope = (outside[1] - outside[0]) / (b[1] - b[0])
            ex.outside = (outside[0] - slope * b[0], slope)
    ex.block_input = block_input_bytes(spec, b[1], precision) / b[1]
    return ex


def check_prediction(ex: Extrapolation, budget_bytes: int, policy: str = "none",
                     batch_size: int | None = None) -> PredictionCheck:
    """One real step at ``batch_size`` or the largest batch ``ex`` predicts to fit
    ``budget_bytes`` with ``policy`` (on CUDA: `CUDA_PLANNING_SHARE` of it, enforced by
    `course_utils.guard.cuda_memory_cap`; on a CPU not run above `RAM_FRACTION` of the free RAM).

    Raises:
        ValueError: a non-positive budget, or one not even batch 1 is predicted to fit.
        KeyError: ``policy`` was not measured by ``ex``.
    """
    if not budget_bytes or budget_bytes <= 0:
        raise ValueError(tr("budget_bytes must be a positive number of bytes, got {budget!r}.",
                            budget=budget_bytes))
    on_cuda = device_kind(ex.spec.device) == "cuda"
    plan = int(budget_bytes * CUDA_PLANNING_SHARE) if on_cuda else budget_bytes
    b = batch_size or ex.largest_batch(plan, policy)
    if b < 1:
        raise ValueError(tr("not even batch 1 fits {budget} with {policy}: its predicted peak is "
                            "{peak}.", budget=size_text(plan), policy=policy,
                            peak=size_text(ex.peak(1, policy))))
    predicted = ex.peak(b, policy)
    spec = ex.spec
    if device_kind(spec.device) == "cpu":
        free = available_memory_bytes(detect("cpu"))
        if free and predicted > RAM_FRACTION * free:
            return PredictionCheck(policy, b, budget_bytes, predicted, None, None, False, False,
                                   tr("batch {batch} with {policy} not run: its predicted peak, "
                                      "{peak}, is more than {share:.0%} of the {free} of RAM free "
                                      "now.", batch=b, policy=policy, peak=size_text(predicted),
                                      share=RAM_FRACTION, free=size_text(free)))
    cfg = ProfileConfig(spec.name, ex.precision, policy, b, spec.device, ex.unit,
                        ex.items_per_sample, seed=spec.seed)
    cap = cuda_memory_cap(spec.device, budget_bytes) if on_cuda else contextlib.nullcontext()
    with cap:
        m, _, _ = measure_config(spec, cfg)
    if m.oom:
        return PredictionCheck(policy, b, budget_bytes, predicted, None, None, False, True,
                               tr("batch {batch} with {policy} ran out of memory under the "
                                  "{budget} budget{gist}, with {predicted} predicted: the budget "
                                  "caps the memory the allocator reserves, more than the peak it "
                                  "allocates; {hint}.", batch=b, policy=policy,
                                  budget=size_text(budget_bytes), gist=_oom_gist(m.error),
                                  predicted=size_text(predicted), hint=tr(ALLOC_CONF_HINT)))
    measured = m.peak_allocated
    err = (predicted - measured) / measured
    fits = measured <= budget_bytes
    planned = "" if batch_size else " " + (
        tr("(the largest predicted to fit {share:.0%} of the budget)", share=CUDA_PLANNING_SHARE)
        if on_cuda else tr("(the largest predicted to fit the budget)"))
    note = tr("batch {batch}{planned} with {policy}: predicted {predicted}, measured {measured} "
              "({error:+.1%}); ", batch=b, planned=planned, policy=policy,
              predicted=size_text(predicted), measured=size_text(measured), error=err) + (
        tr("within the budget.") if fits else
        tr("over the {budget} budget by {excess}: the prediction was too low.",
           budget=size_text(budget_bytes), excess=size_text(measured - budget_bytes)))
    return PredictionCheck(policy, b, budget_bytes, predicted, measured, err, fits, False, note,
                           m.saved_total)
