"""course_utils.offload: saved tensors moved to CPU memory keep the gradients equal; the transfer
time estimate."""
from __future__ import annotations

import pytest
import torch
from helpers import zoo

from course_utils.offload import OffloadedBlock, transfer_time_estimate
from course_utils.profiling import (
    ModelSpec,
)


@pytest.mark.parametrize("kind", ["gpt", "cnn"])
@pytest.mark.parametrize("policy", ["offload", "offload+checkpoint"])
def test_offloading_gives_equal_gradients_on_cpu(kind, policy):
    z = zoo(kind)
    spec = ModelSpec.create(z.build, z.make_batch, z.loss_fn, forward=z.forward, device="cpu")
    batch = spec.batch(2)
    grads = []
    for p in ("none", policy):
        model = spec.fresh(p)
        spec.loss_fn(spec.forward(model, batch), batch).backward()
        grads.append([q.grad for q in model.parameters()])
    if policy == "offload":
        assert any(isinstance(m, OffloadedBlock) for m in model.modules())
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_transfer_time_estimate():
    assert transfer_time_estimate(25 * 10**9, gbps=25.0) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        transfer_time_estimate(1, gbps=0)
