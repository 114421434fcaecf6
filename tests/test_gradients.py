"""course_utils.gradients: capturing every gradient of a backward, sampled or whole."""
import pytest
import torch
from helpers import Tiny

from course_utils.config import config_for
from course_utils.data import get_batch
from course_utils.gradients import capture_gradients
from course_utils.models import build_model


def test_capture_gradients_matches_autograd():
    torch.manual_seed(0)
    m, x = Tiny(), torch.randn(5, 8)
    with capture_gradients(m) as g:
        out = m(x)
        (out * 3.0).sum().backward()
    assert g.parameters.numel() == sum(p.numel() for p in m.parameters())
    # d(sum(3 * out)) / d out = 3 everywhere: the hooked output gradient of fc.
    assert torch.equal(g.by_module["fc"], torch.full((20,), 3.0))
    assert set(g.by_module) == {"ln", "fc"}
    assert g.activations.numel() == 5 * 8 + 5 * 4
    assert set(g.groups()) == {"parameter gradients", "activation gradients"}
    assert not m.fc._forward_hooks                 # removed at exit


def test_capture_gradients_course_model_counts_each_output_once():
    cfg = config_for("smoke")
    model = build_model(cfg)
    x, y = get_batch(cfg.batch_size, cfg.seq_len)
    with capture_gradients(model) as g:
        _, loss = model(x, y)
        loss.backward()
    # The MLP's output *is* fc2's output: only one of the two names is kept.
    assert ("layers.0.mlp" in g.by_module) != ("layers.0.mlp.fc2" in g.by_module)
    assert "head" in g.by_module and g.by_module["head"].numel() == x.numel() * 256
    assert g.activations.numel() == sum(v.numel() for v in g.by_module.values())


def test_capture_gradients_sampling_caps_each_tensor():
    torch.manual_seed(0)
    m, x = Tiny(), torch.randn(50, 8)
    with capture_gradients(m, max_per_tensor=16) as g:
        (m(x) * 3.0).sum().backward()
    assert torch.equal(g.by_module["fc"], torch.full((16,), 3.0))
    assert g.by_module["ln"].numel() == 16
    # fc.weight (32), ln.weight (8), ln.bias (8), fc.bias (4): capped at 16 each.
    assert g.parameters.numel() == 16 + 8 + 8 + 4
    for bad in (0, -3, True):
        with pytest.raises(ValueError, match="max_per_tensor"):
            capture_gradients(m, max_per_tensor=bad)


def test_capture_gradients_without_backward_raises():
    m = Tiny()
    for p in m.parameters():
        p.grad = None
    with pytest.raises(ValueError, match="no gradients"):
        with capture_gradients(m):
            m(torch.randn(2, 8))


def test_capture_gradients_max_values_pools_without_bias():
    """Every element kept with one probability: a small tensor is not weighted like a large one
    (max_per_tensor's flaw), so pooled fractions match the full capture's."""
    torch.manual_seed(0)

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.small, self.big = torch.nn.Linear(8, 8), torch.nn.Linear(8, 512)

        def forward(self, x):  # output gradients: 3.0 for small's 64 x 8, 1.0 for big's 64 x 512
            return self.small(x).sum(-1) * 3.0 + self.big(x).sum(-1)

    m, x = Two(), torch.randn(64, 8)

    def capture(**kw):
        m.zero_grad(set_to_none=True)
        with capture_gradients(m, **kw) as g:
            m(x).sum().backward()
        return g

    full = capture()
    share = (full.activations == 3.0).float().mean().item()       # the small module's share
    sampled = capture(max_values=4096, seed=1)
    assert 4096 // 4 <= sampled.activations.numel() <= 2 * 4096
    assert (sampled.activations == 3.0).float().mean().item() == pytest.approx(share, abs=0.03)
    capped = capture(max_per_tensor=64)                          # the biased alternative
    assert (capped.activations == 3.0).float().mean().item() > share + 0.2
    assert sampled.parameters.numel() <= 4096 + 200
    with pytest.raises(ValueError, match="max_values"):
        capture_gradients(m, max_values=0)
