"""Gradients of one backward, collected for histograms: parameter gradients and the gradients
that flow between layers (activation gradients), optionally sampled to bound memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["GradientCapture", "capture_gradients"]

@dataclass
class GradientCapture:
    """Gradients collected by `capture_gradients`, as flat fp32 tensors.

    Attributes:
        parameters: every parameter's ``.grad`` concatenated (elements), read at the end of the
            ``with`` block.
        activations: the gradient of every submodule output (the tensors that flow between
            layers in backward: these are the ones an fp16 backward holds in fp16).
        by_module: ``{module name: gradient tensor}`` of the activation gradients.

    The tensors stay on the model's device. With ``max_per_tensor`` each one is a uniform
    random sample of its gradient (see `capture_gradients`).
    """

    parameters: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    activations: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    by_module: dict = field(default_factory=dict)

    def groups(self) -> dict:
        """``{"parameter gradients": ..., "activation gradients": ...}`` for the tables/charts."""
        return {"parameter gradients": self.parameters, "activation gradients": self.activations}


class capture_gradients:  # noqa: N801 - used like a function: ``with capture_gradients(m) as g``
    """Context manager: collect a model's parameter and activation gradients of one backward.

    Run the forward and ``loss.backward()`` inside the block. Each submodule's floating-point
    output gets a tensor hook (``Tensor.register_hook``) that stores the gradient flowing into it
    (each output tensor once, so a module whose output *is* its child's is not counted twice).
    At exit, parameter ``.grad`` tensors are read too (existing ``.grad`` is included: zero them
    first).

    Args:
        model: the module whose gradients to collect.
        max_per_tensor: keep at most this many elements of each gradient tensor, drawn
            uniformly at random with replacement (seeded by ``seed``), so that fractions and
            histograms stay unbiased while memory stays bounded on large size profiles.
            ``None`` keeps every element.
        seed: seed of the sampling generator.

    Returns (from ``__enter__``):
        a `GradientCapture` (fp32 tensors on the gradients' device), filled when the block ends.

    Raises:
        ValueError: ``max_per_tensor`` < 1, or no gradients were recorded (no backward ran
            inside the block).
    """

    def __init__(self, model: torch.nn.Module, max_per_tensor: int | None = None, seed: int = 0):
        if max_per_tensor is not None and (isinstance(max_per_tensor, bool) or max_per_tensor < 1):
            raise ValueError(f"max_per_tensor must be a positive integer or None, got "
                             f"{max_per_tensor!r}.")
        self.model = model
        self.max_per_tensor = max_per_tensor
        self._gen: dict = {}
        self.seed = seed
        self.result = GradientCapture()
        self._handles: list = []
        self._alive: list = []  # outputs already hooked (kept alive so that ids stay unique)
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

    def _keep(self, g: torch.Tensor) -> torch.Tensor:
        flat = g.detach().flatten()
        if self.max_per_tensor is not None and flat.numel() > self.max_per_tensor:
            dev = flat.device
            if dev not in self._gen:
                self._gen[dev] = torch.Generator(device=dev).manual_seed(self.seed)
            idx = torch.randint(0, flat.numel(), (self.max_per_tensor,), device=dev,
                                generator=self._gen[dev])
            flat = flat[idx]
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
        params = [self._keep(p.grad) for p in self.model.parameters() if p.grad is not None]
        if not params and not self._grads:
            raise ValueError("capture_gradients recorded no gradients: run the forward and "
                             "loss.backward() inside the with-block.")
        self.result.parameters = torch.cat(params) if params else torch.empty(0)
        self.result.by_module = dict(self._grads)
        self.result.activations = (torch.cat(list(self._grads.values())) if self._grads
                                   else torch.empty(0))
        return False
