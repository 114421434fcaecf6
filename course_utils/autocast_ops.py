"""What autocast really runs (lesson 01): `OpDtypeRecorder` records every ATen op with the dtypes
it read and wrote and the module it ran in; `autocast_policy` reads what autocast does to a few
ops. A ``TorchDispatchMode`` sits below autograd and autocast in PyTorch's dispatcher, so it sees
the ops as they run on *this* device, autocast's casts (``_to_copy``) included: CPU and CUDA
autocast follow different op lists (``torch.amp`` docs, "CPU Ops that can autocast to bfloat16"
vs "CUDA Ops that can autocast to float16").
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .hardware import require_device
from .i18n import tr
from .terms import short_dtype

__all__ = ["VIEW_OPS", "OpRecord", "OpDtypeRecorder", "POLICY_PROBES", "autocast_policy"]

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
    """Record in ``records`` every ATen op that runs inside the ``with`` block. With ``model``,
    forward hooks on its submodules name the module each op ran in, and ops that read one of its
    parameters are flagged::

        with OpDtypeRecorder(model) as rec, torch.autocast("cpu", dtype=torch.bfloat16):
            model(x, y)
        rec.table()      # one row per op (views hidden)
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
        """One row per recorded op: ``module``, ``op``, ``inputs``, ``output`` and ``note``
        (``"cast of a weight"`` or ``"cast of an activation"`` for a ``_to_copy``); view ops
        (`VIEW_OPS`) only with ``views``, and only ops whose module name starts with ``module``.
        """
        rows = []
        for r in self.records:
            if (not views and r.op in VIEW_OPS) or (module is not None and not r.module.startswith(module)):
                continue
            note = ""
            if r.op == "_to_copy":
                note = tr("cast of a weight") if r.reads_parameter else tr("cast of an activation")
            rows.append({"module": r.module, "op": r.op, "inputs": ", ".join(r.inputs),
                         "output": ", ".join(r.outputs), "note": note})
        return pd.DataFrame(rows, columns=["module", "op", "inputs", "output", "note"])

    def ops_by_dtype(self, module: str | None = None, exclude: str | None = None) -> dict:
        """``{output dtype: [op, ...]}``: each op once in the order first seen (views and casts
        hidden), by its first output's dtype, for ops whose module name starts with ``module``
        and not with ``exclude`` (``"layers"``: the ops outside the transformer blocks)."""
        out: dict = {}
        for r in self.records:
            if (r.op in VIEW_OPS or r.op == "_to_copy" or not r.outputs
                    or (module is not None and not r.module.startswith(module))
                    or (exclude is not None and r.module.startswith(exclude))):
                continue
            ops = out.setdefault(r.outputs[0], [])
            if r.op not in ops:
                ops.append(r.op)
        return out


def _probe_calls(d: int, device) -> dict:
    """The calls `autocast_policy` tries: name -> function of one (2, 4, d) input (a tensor, or
    the dtype of a step inside a composite op)."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(d, d, generator=g).to(device), torch.randn(d, generator=g).to(device)
    ln_w, ln_b = torch.ones(d, device=device), torch.zeros(d, device=device)
    target = torch.zeros(8, dtype=torch.long, device=device)
    return {
        "linear (matmul)": lambda x: F.linear(x, w, b),
        "scaled_dot_product_attention": lambda x: F.scaled_dot_product_attention(
            x, x, x, is_causal=True),
        "layer_norm": lambda x: F.layer_norm(x, (d,), ln_w, ln_b),
        "softmax": lambda x: x.softmax(-1),
        "gelu": F.gelu,
        "sum": lambda x: x.sum(),
        "cross_entropy (the loss)": lambda x: F.cross_entropy(x.reshape(-1, d), target),
        "log_softmax inside cross_entropy": lambda x: _inner_dtype(
            "_log_softmax", F.cross_entropy, x.reshape(-1, d), target),
    }


def _inner_dtype(op: str, fn, *args) -> str:
    """The output dtype of the first ATen op ``op`` that ``fn(*args)`` runs inside itself."""
    with OpDtypeRecorder() as rec:
        fn(*args)
    return [r.outputs[0] for r in rec.records if r.op == op and r.outputs][0]


#: The calls `autocast_policy` probes, in its table's order.
POLICY_PROBES = ("linear (matmul)", "scaled_dot_product_attention", "layer_norm", "softmax",
                 "gelu", "sum", "cross_entropy (the loss)", "log_softmax inside cross_entropy")


def autocast_policy(device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> pd.DataFrame:
    """What ``torch.autocast(device, dtype)`` does to each call of `POLICY_PROBES` **on this
    device**, run once on an fp32 input and once on one in ``dtype``: one row per call with the
    output dtypes (``fp32 input``, ``<dtype> input``) and ``autocast here``: ``"runs in
    <dtype>"``, ``"runs in fp32"``, ``"follows its input"`` or ``"other"``. ``cross_entropy`` is
    read twice: its output, and that of the ``log_softmax`` inside it, which backward saves.

    Raises:
        ValueError: a device this machine lacks, or a dtype that is not fp16 or bf16.
    """
    require_device(device)
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(tr("autocast_policy takes torch.float16 or torch.bfloat16, got {dtype}.",
                            dtype=dtype))
    low, kind = short_dtype(dtype), torch.device(device).type
    rules = {(low, low): tr("runs in {dtype}", dtype=low), ("fp32", "fp32"): tr("runs in fp32"),
             ("fp32", low): tr("follows its input")}
    rows = {}
    for name, fn in _probe_calls(16, device).items():
        outs = []
        for in_dtype in (torch.float32, dtype):
            x = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(1)).to(device, in_dtype)
            with torch.autocast(kind, dtype=dtype):
                out = fn(x)
                outs.append(out if isinstance(out, str) else short_dtype(out.dtype))
        rows[name] = {"fp32 input": outs[0], f"{low} input": outs[1],
                      "autocast here": rules.get(tuple(outs), tr("other"))}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(f"autocast({kind}, {low})")
