"""Gradients of one backward, collected for lesson 01's histograms: parameter gradients and the
gradients that flow between layers (activation gradients), optionally sampled to bound memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .i18n import tr
from .terms import check_positive_int

__all__ = ["GradientCapture", "capture_gradients"]


@dataclass
class GradientCapture:
    """Gradients collected by `capture_gradients`, as flat fp32 tensors on the model's device.

    Attributes:
        parameters: every parameter's ``.grad`` concatenated, read at the end of the block.
        activations: the gradient of every submodule output (what an fp16 backward holds in fp16).
        by_module: ``{module name: gradient tensor}`` of the activation gradients.
    """

    parameters: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    activations: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    by_module: dict = field(default_factory=dict)

    def groups(self) -> dict:
        """``{"parameter gradients": ..., "activation gradients": ...}`` for tables and charts."""
        return {"parameter gradients": self.parameters, "activation gradients": self.activations}


class capture_gradients:  # noqa: N801 - used like a function: ``with capture_gradients(m) as g``
    """Context manager: collect a model's parameter and activation gradients of one backward
    (run the forward and ``loss.backward()`` inside the block; zero existing ``.grad`` first).
    ``__enter__`` returns a `GradientCapture`, filled when the block ends.

    Args:
        max_values: keep about this many elements in all (at most twice as many), every
            gradient sampled at one rate (seeded by ``seed``), which halves, the kept samples
            thinned alike, whenever the total exceeds twice the budget: pooled fractions stay
            unbiased and memory bounded.
        max_per_tensor: keep at most this many elements of each gradient (drawn with
            replacement): pooled statistics then weight a small tensor like a large one.
            ``None`` (both) keeps every element.

    Raises:
        ValueError: ``max_values`` or ``max_per_tensor`` < 1, or no gradients were recorded (no
            backward ran inside the block).
    """

    def __init__(self, model: torch.nn.Module, max_per_tensor: int | None = None, seed: int = 0,
                 max_values: int | None = None):
        for name, v in (("max_per_tensor", max_per_tensor), ("max_values", max_values)):
            check_positive_int(name, v, allow_none=True)
        self.model = model
        self.max_per_tensor = max_per_tensor
        self.max_values = max_values
        self.rate = 1.0  # the probability of keeping an element (max_values)
        self._kept = 0
        self._gen: dict = {}
        self.seed = seed
        self.result = GradientCapture()
        self._handles: list = []
        self._alive: list = []  # outputs already hooked
        self._grads: dict = {}

    def _hook_output(self, name):
        def hook(module, args, out):
            if isinstance(out, tuple):
                out = out[0]
            if (isinstance(out, torch.Tensor) and out.requires_grad and out.is_floating_point()
                    and not any(out is t for t in self._alive)):
                self._alive.append(out)
                out.register_hook(lambda g, _n=name: self._grads.__setitem__(_n, self._keep(g)))
        return hook

    def _generator(self, dev) -> torch.Generator:
        if dev not in self._gen:
            self._gen[dev] = torch.Generator(device=dev).manual_seed(self.seed)
        return self._gen[dev]

    def _sample(self, flat: torch.Tensor, p: float) -> torch.Tensor:
        """A uniform sample of ``flat``, with replacement, of ``numel x p`` elements stochastically
        rounded (a small tensor is not dropped)."""
        if p >= 1.0:
            return flat
        gen = self._generator(flat.device)
        expected = flat.numel() * p
        k = int(expected) + int(torch.rand(1, generator=gen, device=flat.device).item()
                                < expected - int(expected))
        idx = torch.randint(0, flat.numel(), (k,), device=flat.device, generator=gen)
        return flat[idx]

    def _keep(self, g: torch.Tensor) -> torch.Tensor:
        flat = g.detach().flatten()
        if self.max_per_tensor is not None and flat.numel() > self.max_per_tensor:
            idx = torch.randint(0, flat.numel(), (self.max_per_tensor,), device=flat.device,
                                generator=self._generator(flat.device))
            flat = flat[idx]
        if self.max_values is not None:
            flat = self._sample(flat, self.rate)
            self._kept += flat.numel()
            while self._kept > 2 * self.max_values:  # halve the rate, thin what is kept alike
                self.rate /= 2
                for name, kept in self._grads.items():
                    self._grads[name] = self._sample(kept, 0.5)
                flat = self._sample(flat, 0.5)
                self._kept = flat.numel() + sum(v.numel() for v in self._grads.values())
        return flat.float()

    def __enter__(self) -> GradientCapture:
        for name, mod in self.model.named_modules():
            if name:
                self._handles.append(mod.register_forward_hook(self._hook_output(name)))
        return self.result

    def __exit__(self, exc_type, exc, tb):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._alive.clear()
        if exc_type is not None:
            return False
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        budget, self.max_values = self.max_values, None     # parameters: one rate of their own
        rate = 1.0 if budget is None else min(1.0, budget / max(1, sum(g.numel() for g in grads)))
        params = [self._sample(self._keep(g), rate) for g in grads]
        self.max_values = budget
        if not params and not self._grads:
            raise ValueError(tr("capture_gradients recorded no gradients: run the forward and "
                                "loss.backward() inside the with-block."))
        self.result.parameters = torch.cat(params) if params else torch.empty(0)
        self.result.by_module = dict(self._grads)
        self.result.activations = (torch.cat(list(self._grads.values())) if self._grads
                                   else torch.empty(0))
        return False
