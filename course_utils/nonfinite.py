"""Inf and NaN in a training step (lesson 01 §6): two faults to inject into a real step
(`nan_in_weight`, `overflow`), and the guards that catch them (`GUARDS`, run by `guarded_step`):

* ``"skip"``: `course_utils.training.train_step`'s default, no ``optimizer.step()`` when the
  gradient norm is inf or NaN (GradScaler's rule, ``torch.amp.GradScaler.step``);
* ``"error_if_nonfinite"``: ``clip_grad_norm_(..., error_if_nonfinite=True)`` raises;
* ``"detect_anomaly"``: ``torch.autograd.detect_anomaly()`` raises in backward at the first NaN,
  with the forward op's traceback (PyTorch docs: it checks for NaN, not inf);
* ``"forward hooks"``: `FirstNonFinite` names the first module whose output is not finite.
"""
from __future__ import annotations

import functools
import os
import re
import warnings
from contextlib import contextmanager

import torch
from torch.utils._pytree import tree_leaves

from .i18n import tr
from .training import DEFAULT_MAX_GRAD_NORM, StepCounter, train_step

__all__ = ["GUARDS", "nan_in_weight", "overflow", "FirstNonFinite", "nonfinite_parameters",
           "changed_parameters", "anomaly_forward_line", "guarded_step"]

#: The guards `guarded_step` runs, "none" (no guard) first.
GUARDS = ("none", "skip", "error_if_nonfinite", "detect_anomaly", "forward hooks")


def _named(items, name: str, what: str):
    found = dict(items)
    if name not in found:
        names = ", ".join(list(found)[:6])
        raise ValueError(
            tr("the model has no parameter {name!r}; it has {names}, ...", name=name, names=names)
            if what == "parameter" else
            tr("the model has no submodule {name!r}; it has {names}, ...", name=name, names=names))
    return found[name]


def nan_in_weight(model: torch.nn.Module, name: str, index: int = 0) -> None:
    """Set entry ``index`` (of the flattened parameter) of parameter ``name`` to NaN, in place.

    Raises:
        ValueError: ``model`` has no parameter ``name``, or ``index`` is out of its range.
    """
    param = _named(model.named_parameters(), name, "parameter")
    if not 0 <= index < param.numel():
        raise ValueError(tr("index {index} is outside {name}, which has {n} entries.",
                            index=index, name=name, n=param.numel()))
    with torch.no_grad():
        param.view(-1)[index] = float("nan")


@contextmanager
def overflow(model: torch.nn.Module, module: str):
    """Within the block, the output of submodule ``module`` is multiplied so that its largest
    magnitude is twice its dtype's largest finite value: inf. The hook runs before the module's
    other forward hooks (``prepend=True``), so a guard's hooks see the overflow.

    Raises:
        ValueError: ``model`` has no submodule ``module``.
        TypeError: (in the forward) the module's output is not a floating-point tensor.
    """
    target = _named(model.named_modules(), module, "submodule")

    def blow_up(_mod, _inputs, out):
        if not (torch.is_tensor(out) and out.is_floating_point()):
            raise TypeError(tr("overflow: {module}'s output is not a floating-point tensor.",
                               module=module))
        largest = out.detach().abs().max().item()
        return out * (2 * torch.finfo(out.dtype).max / largest if largest > 0 else float("inf"))

    with target.register_forward_hook(blow_up, prepend=True):
        yield


class FirstNonFinite:
    """Forward hooks on every submodule of ``model`` (the model included): after the ``with``
    block, `module` is the dotted name of the first module, in the order their forward passes
    finished, whose output held an inf or a NaN (None if none did; ``""`` is the model itself).
    The hooks keep device-side flags, read once: one host sync, not one per module.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._flags: list[tuple[str, torch.Tensor]] = []
        self._handles: list = []

    def __enter__(self) -> "FirstNonFinite":
        self._flags = []
        self.__dict__.pop("module", None)  # forget a previous block's answer
        for name, mod in self.model.named_modules():
            self._handles.append(mod.register_forward_hook(self._hook(name)))
        return self

    def _hook(self, name: str):
        def check(_mod, _inputs, out):
            outs = [t for t in tree_leaves(out) if torch.is_tensor(t) and t.is_floating_point()]
            if outs:
                self._flags.append((name, torch.stack([t.isfinite().all() for t in outs]).all()))
        return check

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    @functools.cached_property
    def module(self) -> str | None:
        """The first module with a non-finite output, or None."""
        finite = torch.stack([f for _, f in self._flags]).tolist() if self._flags else []
        return next((n for (n, _), ok in zip(self._flags, finite) if not ok), None)


def nonfinite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters of ``model`` that hold an inf or a NaN."""
    return [n for n, p in model.named_parameters() if not bool(p.detach().isfinite().all())]


def changed_parameters(model: torch.nn.Module, before: list[torch.Tensor]) -> int:
    """How many parameters of ``model`` differ from ``before`` (`loss_scaling.snapshot`), a NaN
    equal to a NaN in the same place.

    Raises:
        ValueError: ``before`` is not a snapshot of ``model``'s parameters.
    """
    params = list(model.parameters())
    if len(params) != len(before) or any(p.shape != b.shape for p, b in zip(params, before)):
        raise ValueError(tr("changed_parameters: `before` is not a snapshot of this model's "
                            "parameters."))
    return sum(not torch.equal(p.detach().nan_to_num(), b.nan_to_num())
               or not torch.equal(p.detach().isnan(), b.isnan())
               for p, b in zip(params, before))


def anomaly_forward_line(warned: list) -> str:
    """The last frame outside torch of the forward traceback that ``detect_anomaly`` warns with
    (``"models.py:131 loss = F.cross_entropy(...)"``), or ``""``."""
    torch_dir = os.path.dirname(torch.__file__)
    found = ""
    for w in warned:
        for m in re.finditer(r'File "([^"]+)", line (\d+), in \w+\n\s*(.+)', str(w.message)):
            if not m.group(1).startswith(torch_dir):
                found = f"{os.path.basename(m.group(1))}:{m.group(2)} {m.group(3).strip()}"
    return found


def guarded_step(guard, model, optimizer, micro_batches, dtype=None,
                 max_grad_norm=DEFAULT_MAX_GRAD_NORM):
    """One `train_step` without a scaler (fp32 or bf16) under ``guard``, one of `GUARDS`.

    Returns what the guard reported: ``""`` (nothing), ``"skipped the step"``, the first
    sentence of the error it raised (for ``detect_anomaly``, with the forward line of the op
    whose backward returned NaN), or ``"first non-finite output: <module>"``. The UserWarnings of the
    step are recorded, not shown (``detect_anomaly`` warns with the whole forward traceback).

    Raises:
        ValueError: an unknown guard, or an fp16 ``dtype`` (fp16 takes GradScaler, whose own
            skip is the guard).
    """
    if guard not in GUARDS:
        raise ValueError(f"unknown guard {guard!r}: expected one of {GUARDS}.")
    if dtype == torch.float16:
        raise ValueError("guarded_step runs without a scaler: fp16 takes GradScaler, which skips "
                         "an inf/NaN step itself.")
    scaler = torch.amp.GradScaler(micro_batches[0][0].device.type, enabled=False)
    args = (model, optimizer, scaler, micro_batches, dtype, max_grad_norm)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", UserWarning)  # detect_anomaly's forward traceback
        try:
            if guard == "skip":                       # train_step's default
                with StepCounter(optimizer) as steps:
                    train_step(*args, nonfinite="skip")
                return "" if steps.taken else tr("skipped the step")
            if guard == "error_if_nonfinite":         # clip_grad_norm_(..., error_if_nonfinite=True)
                train_step(*args, nonfinite="raise")
            elif guard == "detect_anomaly":           # raises in backward at the first NaN
                with torch.autograd.detect_anomaly():
                    train_step(*args, nonfinite="step")
            elif guard == "forward hooks":            # names the first inf/NaN output
                with FirstNonFinite(model) as first:
                    train_step(*args, nonfinite="step")
                return ("" if first.module is None else
                        tr("first non-finite output: {module}", module=first.module))
            else:                                     # "none": no guard at all
                train_step(*args, nonfinite="step")
        except RuntimeError as e:
            optimizer.zero_grad(set_to_none=True)
            first = str(e).strip().split(". ")[0].rstrip(".")   # the error's first sentence
            where = anomaly_forward_line(warned)
            return first + (f" (forward: {where})" if where else "")
    return ""
