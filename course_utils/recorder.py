"""What autocast really runs: `OpDtypeRecorder`, a ``TorchDispatchMode`` that records every ATen
op inside it with the dtypes it read and wrote and the module it ran in.

A ``TorchDispatchMode`` sits below autograd and autocast in PyTorch's dispatcher, so it sees the
ops as they run on *this* device: autocast's casts (``_to_copy``) and the low-precision matmuls.
CPU and CUDA autocast follow different op lists (``torch.amp`` docs, "CPU Ops that can autocast
to bfloat16" vs "CUDA Ops that can autocast to float16"): read them from a recording on the
device at hand.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .formats import short_dtype

__all__ = ["VIEW_OPS", "OpRecord", "OpDtypeRecorder"]

VIEW_OPS = frozenset({"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "split",
                      "detach", "expand", "squeeze", "unsqueeze", "slice", "select", "alias",
                      "as_strided", "contiguous", "clone", "arange", "lift_fresh"})


@dataclass(frozen=True)
class OpRecord:
    """One ATen op call: ``module`` (dotted name of the innermost module running, ``""`` outside
    any), ``op`` (e.g. ``"addmm"``), the dtypes of its tensor inputs and outputs, and whether it
    read a parameter (``reads_parameter``)."""

    module: str
    op: str
    inputs: tuple
    outputs: tuple
    reads_parameter: bool


def _storage_ptr(t: torch.Tensor):
    """The data pointer of ``t``'s storage, or None for tensors without one (meta, fake)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


class OpDtypeRecorder(TorchDispatchMode):
    """Record every ATen op that runs inside the ``with`` block, with dtypes and module names.

    A ``TorchDispatchMode`` sits below autograd and autocast in PyTorch's dispatcher, so it sees
    the ops as they really run: autocast's casts (``_to_copy``) and the low-precision matmuls.

    Args:
        model: if given, forward hooks on its submodules name the module each op ran in, and
            ops that read one of its parameters are flagged.

    Usage::

        with OpDtypeRecorder(model) as rec, torch.autocast("cpu", dtype=torch.bfloat16):
            model(x, y)
        rec.table()      # one row per op (views hidden)
        rec.summary()    # per op: how many calls produced each dtype
    """

    def __init__(self, model: torch.nn.Module | None = None):
        super().__init__()
        self.model = model
        self.records: list[OpRecord] = []
        self._stack: list[str] = []
        self._handles: list = []
        self._params: set = set()

    def __enter__(self):
        if self.model is not None:
            self._params = {_storage_ptr(p) for p in self.model.parameters()} - {None}
            for name, mod in self.model.named_modules():
                if not name:
                    continue
                self._handles.append(mod.register_forward_pre_hook(
                    lambda m, a, _n=name: self._stack.append(_n)))
                self._handles.append(mod.register_forward_hook(self._pop))
        return super().__enter__()

    def _pop(self, module, args, out) -> None:
        # A forward hook must return None, or it would replace the module's output.
        if self._stack:
            self._stack.pop()

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._stack.clear()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [a for a in tree_leaves((args, kwargs or {})) if isinstance(a, torch.Tensor)]
        outs = [a for a in tree_leaves(out) if isinstance(a, torch.Tensor)]
        reads_param = bool(self._params) and any(_storage_ptr(a) in self._params for a in ins)
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else str(func)
        self.records.append(OpRecord(self._stack[-1] if self._stack else "", name,
                                     tuple(short_dtype(a.dtype) for a in ins),
                                     tuple(short_dtype(a.dtype) for a in outs), reads_param))
        return out

    def table(self, views: bool = False, module: str | None = None) -> pd.DataFrame:
        """One row per recorded op: ``module``, ``op``, ``inputs``, ``output``, ``note``.

        Args:
            views: include view/alias ops (`VIEW_OPS`); hidden by default.
            module: keep only ops whose module name starts with this prefix.

        The ``note`` column says ``"cast of a weight"`` for an autocast cast of a parameter and
        ``"cast of an activation"`` for other ``_to_copy`` calls.
        """
        rows = []
        for r in self.records:
            if not views and r.op in VIEW_OPS:
                continue
            if module is not None and not r.module.startswith(module):
                continue
            note = ""
            if r.op == "_to_copy":
                note = "cast of a weight" if r.reads_parameter else "cast of an activation"
            rows.append({"module": r.module, "op": r.op, "inputs": ", ".join(r.inputs),
                         "output": ", ".join(r.outputs), "note": note})
        return pd.DataFrame(rows, columns=["module", "op", "inputs", "output", "note"])

    def summary(self) -> pd.DataFrame:
        """Per op (views hidden): calls by the dtype of its first output; one column per dtype."""
        counts: dict = {}
        for r in self.records:
            if r.op in VIEW_OPS or not r.outputs:
                continue
            key = r.op if r.op != "_to_copy" else (
                "_to_copy (weight)" if r.reads_parameter else "_to_copy (other)")
            counts.setdefault(key, Counter())[r.outputs[0]] += 1
        df = pd.DataFrame.from_dict(counts, orient="index").fillna(0).astype(int)
        df.index.name = "op"
        return df
