"""The saved-tensor meter: what autograd keeps for backward, in bytes, split by kind.

`SavedTensorMeter` (the course's one meter) wraps a forward in
``torch.autograd.graph.saved_tensors_hooks``, deduplicates what is saved by storage (q, k and v
are views of one ``qkv`` storage) and leaves parameters out; autocast's low-precision weight
copies (a tensor whose autograd history is a chain of single-input nodes ending at a
parameter's ``AccumulateGrad``) go to ``autocast_weight_copies``; tensors saved from the final
LayerNorm on (head, loss) go to ``logits``. Tensors kept by selective checkpointing live in
SAC's own cache, out of the hooks' sight; the meter reads that cache through the model's
`course_utils.checkpointing.SelectiveContexts` (on any torch the course supports; where the cache
cannot be read, ``unmeasured`` says why and the totals must not be used).

The pack hook returns ``t.detach()`` and the meter keeps no tensor: a hook that returned ``t``
itself would close a reference cycle through autograd's C++ graph for every tensor an op saves
as its own output, which ``gc.collect()`` cannot break, and the whole graph would leak (PyTorch
docs, "Hooks for saved tensors"). `course_utils.measure` uses the meter for a `Measurement`'s
memory fields; lessons 01 and 02 call `measure_saved`, `saved_bytes` and `saved_by_module`.
"""
from __future__ import annotations

import contextlib
import math

import pandas as pd
import torch

from .checkpointing import sac_kept, selective_contexts
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


def _is_weight_copy(t: torch.Tensor, max_depth: int = 6) -> bool:
    """True if ``t`` comes from a parameter through single-input ops only (cast, transpose)."""
    node = t.grad_fn
    for _ in range(max_depth):
        if node is None:
            return False
        nexts = [n for n, _ in node.next_functions if n is not None]
        if len(nexts) != 1:
            return False
        if type(nexts[0]).__name__ == "AccumulateGrad":
            return True
        node = nexts[0]
    return False


class SavedTensorMeter:
    """Context manager that records the tensors autograd saves for backward, by storage.

    Args:
        model: its parameters are excluded; if it has ``ln_f`` (the course's GPT), tensors saved
            from its final LayerNorm on go to the ``logits`` bucket; tensors kept by its
            selective-checkpointing regions are counted as activations.
        by_module: also record, for each tensor, the innermost submodule of ``model`` whose
            forward was running when it was saved (`saved_by_module`).

    After the ``with`` block, ``totals()`` gives bytes per bucket (``activations``,
    ``autocast_weight_copies``, ``logits``) and ``records`` one dict per storage (``nbytes``,
    ``bucket``, ``shape``, ``dtype``, ``grad_fn``, ``module``, ``module_type``). The meter holds
    no tensor: what it measured is freed as soon as the caller drops it.
    """

    def __init__(self, model: torch.nn.Module | None = None, by_module: bool = False):
        self.model = model
        self.by_module = by_module
        self._params = set()
        if model is not None:
            self._params = {(str(p.device), p.untyped_storage().data_ptr())
                            for p in model.parameters()}
        self._seen: dict = {}
        self._stack: list = []
        self._sac: list = []
        self.unmeasured: str | None = None
        self.region = "activations"
        self._exit = contextlib.ExitStack()

    def _record(self, key, nbytes, bucket, shape, dtype, grad_fn) -> None:
        if key in self._params or key in self._seen:
            return
        name, kind = (self._stack[-1] if self._stack
                      else ("", type(self.model).__name__ if self.model is not None else ""))
        self._seen[key] = {"nbytes": nbytes, "bucket": bucket, "shape": shape, "dtype": dtype,
                           "grad_fn": grad_fn, "module": name, "module_type": kind}

    def _pack(self, t):
        if not isinstance(t, torch.Tensor):
            return t
        st = t.untyped_storage()
        bucket = "autocast_weight_copies" if _is_weight_copy(t) else self.region
        self._record((str(t.device), st.data_ptr()), st.nbytes(), bucket, tuple(t.shape),
                     t.dtype, type(t.grad_fn).__name__ if t.grad_fn is not None else None)
        return t.detach()  # no reference cycle: autograd restores the saved tensor from it

    def _enter_module(self, name: str, module: torch.nn.Module):
        label = (name, type(module).__name__)

        def hook(*_):  # returns None: the module's input is left unchanged
            self._stack.append(label)
        return hook

    def _leave_module(self, *_) -> None:  # returns None: the module's output is left unchanged
        if self._stack:
            self._stack.pop()

    def __enter__(self):
        self._seen.clear()
        self.unmeasured = None
        self.region = "activations"
        if self.model is not None:
            ln_f = getattr(self.model, "ln_f", None)
            if isinstance(ln_f, torch.nn.Module):
                h = ln_f.register_forward_pre_hook(lambda *_: setattr(self, "region", "logits"))
                self._exit.callback(h.remove)
            self._sac = selective_contexts(self.model)
            for c in self._sac:
                c.recording = []
            if self.by_module:
                for name, sub in self.model.named_modules():
                    h1 = sub.register_forward_pre_hook(self._enter_module(name, sub))
                    h2 = sub.register_forward_hook(self._leave_module)
                    self._exit.callback(h1.remove)
                    self._exit.callback(h2.remove)
        self._exit.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack,
                                                                           lambda t: t))
        return self

    def __exit__(self, *exc):
        try:
            return self._exit.__exit__(*exc)
        finally:
            for c in self._sac:
                kept = sac_kept(c.recording or ())
                if kept is None:
                    self.unmeasured = (f"this torch ({torch.__version__}) keeps selective "
                                       "checkpointing's tensors where the meter cannot read them")
                for t in kept or ():
                    st = t.untyped_storage()
                    self._record((str(t.device), st.data_ptr()), st.nbytes(), "activations",
                                 tuple(t.shape), t.dtype, "SAC cache")
                c.recording = None
            self._sac = []
            self._stack.clear()

    @property
    def records(self) -> list[dict]:
        """One dict per distinct storage saved, in the order they were saved."""
        return list(self._seen.values())

    def totals(self) -> dict:
        """Bytes per bucket: ``activations``, ``autocast_weight_copies``, ``logits``."""
        out = {"activations": 0, "autocast_weight_copies": 0, "logits": 0}
        for r in self._seen.values():
            out[r["bucket"]] += r["nbytes"]
        return out

    def by_dtype(self) -> pd.DataFrame:
        """Saved bytes by bucket and dtype: rows ``(bucket, dtype)`` with ``bytes``, ``MiB``
        (2^20 bytes) and ``tensors`` (distinct storages), largest first within a bucket.

        Raises:
            ValueError: the meter recorded nothing.
        """
        if not self._seen:
            raise ValueError("the meter recorded no saved tensors: run a forward inside it first.")
        df = pd.DataFrame([{"bucket": r["bucket"], "dtype": short_dtype(r["dtype"]),
                            "bytes": r["nbytes"]} for r in self._seen.values()])
        out = df.groupby(["bucket", "dtype"]).agg(bytes=("bytes", "sum"),
                                                  tensors=("bytes", "size"))
        out["MiB"] = out["bytes"] / MiB
        return out.sort_values(["bucket", "bytes"], ascending=[True, False])[
            ["bytes", "MiB", "tensors"]]


def saved_bytes(fn, *args, model: torch.nn.Module | None = None, **kwargs) -> int:
    """Saved-tensor bytes (deduplicated, parameters of ``model`` excluded) of ``fn(*args)``.

    For any callable, e.g. ``saved_bytes(checkpoint_sequential, layers, 3, x,
    use_reentrant=False, model=layers)``. The output is discarded after counting.
    """
    with SavedTensorMeter(model) as meter:
        out = fn(*args, **kwargs)
    del out
    return sum(meter.totals().values())


def measure_saved(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                  precision: str = "fp32") -> SavedTensorMeter:
    """Run one forward of the course's GPT under ``precision``'s autocast; return the filled
    meter. The forward's graph is freed before returning (no backward is run).

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
    """The tensors autograd saves for backward while ``fn()`` runs, one row per storage.

    Args:
        module: its parameters are excluded; each saved tensor is attributed to the innermost
            of its submodules (names as in ``module.named_modules()``, ``""`` for ``module``
            itself) whose forward was running.
        fn: a function of no arguments that runs a forward through ``module``.

    Returns:
        A DataFrame in the order the tensors were saved, columns ``module``, ``module_type``,
        ``shape``, ``dtype`` (str), ``nbytes`` (bytes of the storage), ``grad_fn`` (the node
        that made the tensor, ``None`` for a leaf). The forward's graph is freed on return.
        Tensors of no elements hold no memory and are left out: non-reentrant ``checkpoint``
        saves an empty placeholder in torch 2.7-2.11 (not in 2.13), which the support matrix's
        older stacks showed as a 0-byte row.

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module``.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"saved_by_module needs a torch.nn.Module, got {type(module).__name__}.")
    with SavedTensorMeter(module, by_module=True) as meter:
        out = fn()
    del out
    cols = ["module", "module_type", "shape", "dtype", "nbytes", "grad_fn"]
    rows = [{**{c: r[c] for c in cols}, "dtype": str(r["dtype"]).replace("torch.", "")}
            for r in meter.records if r["nbytes"] or math.prod(r["shape"])]
    return pd.DataFrame(rows, columns=cols)
