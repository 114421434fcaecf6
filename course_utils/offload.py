"""Activation offloading: the tensors autograd saves for backward moved to CPU memory.

The third tool for activation memory beside checkpointing and lower precision. PyTorch ships it
as ``torch.autograd.graph.save_on_cpu(pin_memory=...)``: a saved-tensor hook pair whose pack hook
copies each tensor an op saves to (pinned) host memory and whose unpack hook copies it back to
its device when backward needs it (PyTorch docs, "Hooks for saved tensors"; torchtune's
``OffloadActivations`` and torchtitan build on the same hooks). Two policies of
`course_utils.profiling.profile` use it, block by block:

=========================  ==============================================================
``offload``                each block runs under ``save_on_cpu``: everything it saves goes to
                           host memory (`OffloadedBlock`).
``offload+checkpoint``     each block checkpointed (non-reentrant) *and* run under
                           ``save_on_cpu``: the one tensor a checkpointed block keeps, its
                           input, goes to host memory (`OffloadedBlock` with ``checkpointed``).
=========================  ==============================================================

On CUDA the copies cross the PCIe (or NVLink-C2C) link twice per step: to the host in forward, back
in backward; `OffloadedBlock` counts the bytes (``bytes_to_host``). On a CPU ``save_on_cpu``
moves nothing (device and host are the same memory): the bytes it *would* move are counted all
the same, and `transfer_time_estimate` turns them into seconds at a stated link bandwidth,
labelled as an estimate.
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
    """``torch.autograd.graph.save_on_cpu`` that also counts what it moves.

    ``save_on_cpu`` copies every tensor an op saves, one copy per saved tensor: views of one
    storage are copied once each, and the weights that matmuls save (``weight.t()``, a view of
    a parameter) are copied too, since a hook cannot tell them from activations.

    Args:
        pin_memory: copy into page-locked host memory (needed for asynchronous copies back to
            the GPU; only meaningful where CUDA is available).
        counter: a two-element list ``[bytes, of which parameter bytes]``: the bytes of every
            tensor packed (``numel x element_size``) are added to ``counter[0]``, those whose
            storage is one of ``parameters``' to ``counter[1]`` as well.
        parameters: the parameters whose saved views count as weights (default: none).
    """

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
    """A block whose saved tensors go to CPU memory (``save_on_cpu``), optionally checkpointed.

    Args:
        block: the block (any ``nn.Module``; its forward may take keyword arguments).
        checkpointed: also checkpoint the block (non-reentrant): then the only tensor saved is
            the block's input, and that is what moves to the host.

    Attributes:
        bytes_to_host: ``[bytes, of which weights]`` packed to the host since the last reset
            (`CountingSaveOnCpu`); backward brings the same bytes back.
    """

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
    """Seconds to move ``bytes_to_host`` to the host and back once each, at ``gbps`` GB/s
    (10^9 bytes/s) per direction, copies not overlapped with compute: ``2 x bytes / (gbps x
    1e9)``. An **estimate** (`PCIE_GBPS` says where the default comes from); on a GPU the
    profile measures the step time instead.

    Raises:
        ValueError: negative bytes or a non-positive bandwidth.
    """
    if bytes_to_host < 0 or not gbps > 0:
        raise ValueError(tr("bytes must be >= 0 and gbps > 0, got {bytes!r}, {gbps!r}.",
                            bytes=bytes_to_host, gbps=gbps))
    return 2 * bytes_to_host / (gbps * 1e9)
