"""Activation offloading: the tensors autograd saves moved to CPU memory by
``torch.autograd.graph.save_on_cpu`` (PyTorch docs, "Hooks for saved tensors"), one block at a
time (`OffloadedBlock`: the policies ``offload`` and ``offload+checkpoint`` of
`course_utils.profiling.profile`). On a CPU nothing moves, but the bytes that would are counted
all the same, and `transfer_time_estimate` estimates their seconds.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.autograd.graph import save_on_cpu
from torch.utils.checkpoint import checkpoint

from .i18n import tr

__all__ = ["PCIE_GBPS", "CountingSaveOnCpu", "OffloadedBlock", "offloaded_bytes",
           "transfer_time_estimate"]

#: Bandwidth (GB/s, 10^9 bytes/s, one direction) assumed by `transfer_time_estimate`: PCIe 4.0
#: x16 carries 31.5 GB/s per direction by its specification (PCI-SIG, 16 GT/s x 16 lanes,
#: 128b/130b coding); pinned-memory copies reach about 25 GB/s of it in practice (NVIDIA's
#: ``bandwidthTest`` on A100 PCIe systems). An assumption, not a measurement: pass your own.
PCIE_GBPS = 25.0


class CountingSaveOnCpu(save_on_cpu):
    """``torch.autograd.graph.save_on_cpu`` that also counts what it moves: one copy per saved
    tensor, so views of one storage count once each, and the weights matmuls save
    (``weight.t()``) count too. ``counter``: ``[bytes, of which parameter bytes]``, added to as
    each tensor is packed (``numel x element_size``); a view of one of ``parameters`` counts as a
    weight. ``pin_memory`` applies only where CUDA is available."""

    def __init__(self, pin_memory: bool = False, counter: list | None = None, parameters=()):
        super().__init__(pin_memory=pin_memory and torch.cuda.is_available())
        self.counter = counter if counter is not None else [0, 0]
        weights = {p.untyped_storage().data_ptr() for p in parameters}
        pack = self.pack_hook

        def counting_pack(t):
            n = t.numel() * t.element_size()
            self.counter[0] += n
            if t.untyped_storage().data_ptr() in weights:
                self.counter[1] += n
            return pack(t)
        self.pack_hook = counting_pack


class OffloadedBlock(nn.Module):
    """A block whose saved tensors go to CPU memory, optionally checkpointed (non-reentrant:
    then only its input is saved, and moved). ``bytes_to_host``: ``[bytes, of which weights]``
    packed since the last reset (`CountingSaveOnCpu`); backward brings them back."""

    def __init__(self, block: nn.Module, checkpointed: bool = False):
        super().__init__()
        self.block = block
        self.checkpointed = checkpointed
        self.bytes_to_host = [0, 0]

    def forward(self, *args, **kwargs):
        with CountingSaveOnCpu(pin_memory=True, counter=self.bytes_to_host,
                               parameters=list(self.block.parameters())):
            if self.checkpointed:
                return checkpoint(self.block, *args, use_reentrant=False, **kwargs)
            return self.block(*args, **kwargs)


def offloaded_bytes(model: nn.Module, reset: bool = False) -> tuple[int, int]:
    """``(bytes, of which weights)`` the `OffloadedBlock` modules of ``model`` packed to the
    host since the last reset; ``reset=True`` sets their counters to 0 after reading."""
    total, weights = 0, 0
    for m in model.modules():
        if isinstance(m, OffloadedBlock):
            total += m.bytes_to_host[0]
            weights += m.bytes_to_host[1]
            if reset:
                m.bytes_to_host[:] = [0, 0]
    return total, weights


def transfer_time_estimate(bytes_to_host: int, gbps: float = PCIE_GBPS) -> float:
    """Seconds to move ``bytes_to_host`` to the host and back at ``gbps`` GB/s (10^9 bytes/s)
    per direction, not overlapped with compute: ``2 x bytes / (gbps x 1e9)``. An estimate;
    ValueError for negative bytes or a non-positive bandwidth."""
    if bytes_to_host < 0 or not gbps > 0:
        raise ValueError(tr("bytes must be >= 0 and gbps > 0, got {bytes!r}, {gbps!r}.",
                            bytes=bytes_to_host, gbps=gbps))
    return 2 * bytes_to_host / (gbps * 1e9)
