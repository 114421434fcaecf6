"""Colours and small helpers shared by the charts (no state, nothing drawn here).
"""
from __future__ import annotations

import numpy as np

from ..config import MiB

_COLORS = {"activations": "#4C72B0", "autocast_weight_copies": "#DD8452", "logits": "#55A868",
           "parameters": "#8172B3", "gradients": "#937860", "optimizer_state": "#DA8BC3"}


_SERIES = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860")


_FORMAT_COLORS = {"fp32": "#4C72B0", "fp16": "#DD8452", "bf16": "#55A868", "fp8 e4m3": "#C44E52",
                  "fp8 e5m2": "#8172B3"}


def _nan(v):
    return np.nan if v is None else float(v)


def _mib(values):
    return np.array([_nan(v) / MiB for v in values], dtype=float)
