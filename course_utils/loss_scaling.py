"""GradScaler read from what it does (lesson 01 §4-§5): the rule a scale trace shows (claim C12;
``torch.amp.GradScaler`` docs: an inf/NaN step is skipped and the scale multiplied by
``backoff_factor``, ``growth_interval`` clean steps multiply it by ``growth_factor``), and the
size of a parameter update (claim C18: clipping before ``unscale_``).
"""
from __future__ import annotations

import torch

from .i18n import tr

__all__ = ["read_scaler_trace", "snapshot", "update_norm"]


def read_scaler_trace(trace, scaler, init_scale: float) -> dict:
    """What a GradScaler trace shows about its rule, as the inputs of claim C12's verdict.

    Args:
        trace: rows (a DataFrame or dicts), one per step in order: ``injected`` (an inf/NaN was
            put into a gradient), ``scale`` (after ``update()``), ``stepped`` (parameters changed).
        scaler, init_scale: the ``torch.amp.GradScaler`` that made the trace, its first scale.

    Returns:
        ``{"backoffs_ok": [per injected step: skipped and backed off], "growth_after": [clean
        steps before each growth], "growth_interval": the scaler's, "clean_taken": bool}``.

    Raises:
        ValueError: an empty trace, or rows without the three keys.
    """
    rows = trace.to_dict("records") if hasattr(trace, "to_dict") else [dict(r) for r in trace]
    need = {"injected", "scale", "stepped"}
    if not rows or any(need - set(r) for r in rows):
        raise ValueError(tr("read_scaler_trace needs rows with {keys}.", keys=sorted(need)))
    grow, back = scaler.get_growth_factor(), scaler.get_backoff_factor()
    prev, clean, backoffs_ok, growth_after = float(init_scale), 0, [], []
    for r in rows:
        scale = float(r["scale"])
        if r["injected"]:
            backoffs_ok.append(not r["stepped"] and scale == prev * back)
            clean = 0
        else:
            clean += 1
            if scale == prev * grow:
                growth_after.append(clean)
                clean = 0
        prev = scale
    clean_taken = all(bool(r["stepped"]) for r in rows if not r["injected"])
    return {"backoffs_ok": backoffs_ok, "growth_after": growth_after,
            "growth_interval": scaler.get_growth_interval(), "clean_taken": clean_taken}


def snapshot(model: torch.nn.Module) -> list[torch.Tensor]:
    """Detached copies of ``model``'s parameters (to measure an update against)."""
    return [p.detach().clone() for p in model.parameters()]


def update_norm(model: torch.nn.Module, before: list[torch.Tensor]) -> float:
    """The L2 norm, in fp64, of the change of all parameters since ``before`` (`snapshot`).

    Raises:
        ValueError: ``before`` does not match ``model``'s parameters.
    """
    params = list(model.parameters())
    if len(params) != len(before) or any(p.shape != b.shape for p, b in zip(params, before)):
        raise ValueError(tr("update_norm: `before` is not a snapshot of this model's "
                            "parameters."))
    sq = sum(float((p.detach().double() - b.double()).pow(2).sum()) for p, b in zip(params, before))
    return sq ** 0.5
