"""The saved-tensor meter: what autograd keeps for backward, in bytes, split by kind.

`SavedTensorMeter` (the course's one meter, docs/method.md#memory) wraps a forward in
``torch.autograd.graph.saved_tensors_hooks`` and counts, once per storage and parameters left
out, what autograd still holds for backward when the forward ends (the model's return, the first
read of a saved tensor in backward, or the meter's exit); over several forwards (gradient
accumulation) the largest counts. Buckets: ``autocast_weight_copies`` (a parameter cast to
another dtype, through casts and views only), ``logits`` (saved from the model's ``ln_f`` on),
``activations``. Selective checkpointing keeps its tensors in its own cache, which the meter
reads (`course_utils.checkpointing.sac_kept`; where it cannot, ``unmeasured`` says why).
`course_utils.measure` uses the meter; lessons 01 and 02 call `measure_saved`, `saved_bytes` and
`saved_by_module`.
"""
from __future__ import annotations

import contextlib
import math
import weakref

import pandas as pd
import torch

from .checkpointing import sac_kept, selective_contexts
from .i18n import tr
from .terms import MiB, autocast_dtype, short_dtype

__all__ = ["SavedTensorMeter", "measure_saved", "saved_bytes", "saved_by_module", "storage_bytes"]


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views counted once)."""
    seen = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[(str(t.device), st.data_ptr())] = st.nbytes()
    return sum(seen.values())


# What may lie between a parameter and autocast's copy of it: the cast, and views of the copy
# (``t()`` for a matmul, a reshape); any other op makes the tensor an activation.
_CAST = "ToCopyBackward0"
_VIEWS = frozenset({"TBackward0", "TransposeBackward0", "TransposeBackward1", "PermuteBackward0",
                    "ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0",
                    "ExpandBackward0", "AliasBackward0", "UnsqueezeBackward0",
                    "SqueezeBackward0", "SqueezeBackward1"})


def _is_weight_copy(t: torch.Tensor, max_depth: int = 6) -> bool:
    """True if ``t`` is a copy of a parameter in another dtype (what autocast makes): its
    history back to the parameter is casts and views only, with a cast among them."""
    node, cast = t.grad_fn, False
    for _ in range(max_depth):
        if node is None:
            return False
        name = type(node).__name__
        if name == "AccumulateGrad":
            param = getattr(node, "variable", None)
            return cast and isinstance(param, torch.Tensor) and param.dtype != t.dtype
        if name == _CAST:
            cast = True
        elif name not in _VIEWS:
            return False
        nexts = [n for n, _ in node.next_functions if n is not None]
        if len(nexts) != 1:
            return False
        node = nexts[0]
    return False


class _Packed:
    """What the pack hook hands autograd: the saved tensor, detached. The meter holds a weak
    reference to it, alive while autograd keeps the tensor; a hook that returned ``t`` itself
    would close a cycle through autograd's C++ graph that ``gc`` cannot break (PyTorch docs,
    "Hooks for saved tensors")."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class SavedTensorMeter:
    """Context manager that records the tensors autograd saves for backward, by storage, for
    ``model`` (see the module docstring); ``by_module``: also record the innermost submodule
    running when each tensor was saved. After the ``with`` block, ``totals()`` gives bytes per
    bucket and ``records`` one dict per storage (``nbytes``, ``bucket``, ``shape``, ``dtype``,
    ``grad_fn``, ``module``, ``module_type``). The meter holds no tensor.
    """

    def __init__(self, model: torch.nn.Module | None = None, by_module: bool = False):
        self.model = model
        self.by_module = by_module
        self._params = set() if model is None else {
            (str(p.device), p.untyped_storage().data_ptr()) for p in model.parameters()}
        self._seen: dict = {}
        # entries: [weak ref to the _Packed, key, record, forward number, alive]
        self._entries, self._pending, self._stack, self._sac = [], [], [], []
        self._forward, self._in_backward, self._active = 0, False, False
        self.unmeasured: str | None = None
        self.region = "activations"
        self._exit = contextlib.ExitStack()

    def _record(self, nbytes, bucket, shape, dtype, grad_fn) -> dict:
        name, kind = (self._stack[-1] if self._stack
                      else ("", type(self.model).__name__ if self.model is not None else ""))
        return {"nbytes": nbytes, "bucket": bucket, "shape": shape, "dtype": dtype,
                "grad_fn": grad_fn, "module": name, "module_type": kind}

    def _pack(self, t):
        if not isinstance(t, torch.Tensor):
            return t
        st = t.untyped_storage()
        key = (str(t.device), st.data_ptr())
        if key in self._params:
            return t.detach()
        if self._in_backward:  # a forward after a backward (accumulation): a new forward
            self._forward, self._in_backward = self._forward + 1, False
        packed = _Packed(t.detach())  # no reference cycle: autograd restores the tensor from it
        bucket = "autocast_weight_copies" if _is_weight_copy(t) else self.region
        record = self._record(st.nbytes(), bucket, tuple(t.shape), t.dtype,
                              type(t.grad_fn).__name__ if t.grad_fn is not None else None)
        entry = [weakref.ref(packed), key, record, self._forward, None]
        self._entries.append(entry)
        self._pending.append(entry)
        return packed

    def _unpack(self, packed):
        if not isinstance(packed, _Packed):
            return packed
        if self._active and not self._in_backward:  # backward starts: the forward has ended
            self._judge()
            self._in_backward = True
        return packed.tensor

    def _judge(self, *_) -> None:
        """The end of a forward: what autograd still holds of what was saved since counts."""
        for entry in self._pending:
            entry[4] = entry[0]() is not None
        self._pending = []

    def _enter_module(self, name: str, module: torch.nn.Module):
        label = (name, type(module).__name__)

        def hook(*_):
            self._stack.append(label)
        return hook

    def _leave_module(self, *_) -> None:
        if self._stack:
            self._stack.pop()

    def _largest_forward(self) -> dict:
        """The records alive at the end of the forward with the most bytes, one per storage."""
        forwards: dict = {}
        for _, key, record, forward, alive in self._entries:
            if alive:
                forwards.setdefault(forward, {}).setdefault(key, record)
        return max(forwards.values(), key=lambda f: sum(r["nbytes"] for r in f.values()),
                   default={})

    def __enter__(self):
        self._seen.clear()
        self._entries, self._pending = [], []
        self._forward, self._in_backward, self._active = 0, False, True
        self.unmeasured = None
        self.region = "activations"
        if self.model is not None:
            # the hooks return None: the model's inputs and outputs are left unchanged
            self._exit.callback(self.model.register_forward_hook(self._judge).remove)
            ln_f = getattr(self.model, "ln_f", None)
            if isinstance(ln_f, torch.nn.Module):
                self._exit.callback(ln_f.register_forward_pre_hook(
                    lambda *_: setattr(self, "region", "logits")).remove)
            self._sac = selective_contexts(self.model)
            for c in self._sac:
                c.recording = []
            if self.by_module:
                for name, sub in self.model.named_modules():
                    for h in (sub.register_forward_pre_hook(self._enter_module(name, sub)),
                              sub.register_forward_hook(self._leave_module)):
                        self._exit.callback(h.remove)
        self._exit.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack,
                                                                           self._unpack))
        return self

    def __exit__(self, *exc):
        try:
            return self._exit.__exit__(*exc)
        finally:
            self._judge()
            self._active = False
            self._seen = self._largest_forward()
            self._entries, self._pending = [], []
            for c in self._sac:
                kept = sac_kept(c.recording or ())
                if kept is None:
                    self.unmeasured = tr("this torch ({torch}) keeps selective checkpointing's "
                                         "tensors where the meter cannot read them",
                                         torch=torch.__version__)
                for t in kept or ():
                    st = t.untyped_storage()
                    key = (str(t.device), st.data_ptr())
                    if key not in self._params and key not in self._seen:
                        self._seen[key] = self._record(st.nbytes(), "activations",
                                                       tuple(t.shape), t.dtype, "SAC cache")
                c.recording = None
            self._sac = []
            self._stack.clear()

    def _current(self) -> dict:
        if not self._active:
            return self._seen
        self._judge()  # read inside the ``with`` block: what is alive now ends the forward
        return self._largest_forward()

    @property
    def records(self) -> list[dict]:
        """One dict per storage alive for backward at the end of the forward, in saving order."""
        return list(self._current().values())

    def totals(self) -> dict:
        """Bytes per bucket: ``activations``, ``autocast_weight_copies``, ``logits``."""
        out = {"activations": 0, "autocast_weight_copies": 0, "logits": 0}
        for r in self._current().values():
            out[r["bucket"]] += r["nbytes"]
        return out

    def by_dtype(self) -> pd.DataFrame:
        """Saved bytes by ``(bucket, dtype)``: ``bytes``, ``MiB`` and ``tensors`` (storages).

        Raises:
            ValueError: the meter recorded nothing.
        """
        seen = self._current()
        if not seen:
            raise ValueError(tr("the meter recorded no saved tensors: run a forward inside it "
                                "first."))
        df = pd.DataFrame([{"bucket": r["bucket"], "dtype": short_dtype(r["dtype"]),
                            "bytes": r["nbytes"]} for r in seen.values()])
        out = df.groupby(["bucket", "dtype"]).agg(bytes=("bytes", "sum"),
                                                  tensors=("bytes", "size"))
        out["MiB"] = out["bytes"] / MiB
        return out.sort_values(["bucket", "bytes"], ascending=[True, False])[
            ["bytes", "MiB", "tensors"]]


def saved_bytes(fn, *args, model: torch.nn.Module | None = None, **kwargs) -> int:
    """Saved-tensor bytes (deduplicated, parameters of ``model`` excluded) of any callable's
    ``fn(*args, **kwargs)``; the output is discarded after counting."""
    with SavedTensorMeter(model) as meter:
        out = fn(*args, **kwargs)
    del out
    return sum(meter.totals().values())


def measure_saved(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                  precision: str = "fp32") -> SavedTensorMeter:
    """The filled meter of one forward of the course's GPT under ``precision``'s autocast (its
    graph freed, no backward run).

    Raises:
        ValueError: an unknown precision.
    """
    dtype = autocast_dtype(precision)
    with SavedTensorMeter(model) as meter:
        with torch.autocast(x.device.type, dtype=dtype, enabled=dtype is not None):
            _, loss = model(x, y)
    del loss
    return meter


def saved_by_module(module: torch.nn.Module, fn) -> pd.DataFrame:
    """The tensors autograd saves while ``fn()`` (a forward through ``module``) runs, one row
    per storage, parameters excluded, in saving order: ``module`` (the innermost submodule
    running), ``module_type``, ``shape``, ``dtype`` (str), ``nbytes``, ``grad_fn``; empty
    tensors (non-reentrant ``checkpoint`` saves one in torch 2.7-2.11) are left out.

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module``.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(tr("saved_by_module needs a torch.nn.Module, got {kind}.",
                           kind=type(module).__name__))
    with SavedTensorMeter(module, by_module=True) as meter:
        out = fn()
    del out
    cols = ["module", "module_type", "shape", "dtype", "nbytes", "grad_fn"]
    rows = [{**{c: r[c] for c in cols}, "dtype": str(r["dtype"]).replace("torch.", "")}
            for r in meter.records if r["nbytes"] or math.prod(r["shape"])]
    return pd.DataFrame(rows, columns=cols)
