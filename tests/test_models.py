"""course_utils.models: the course's GPT (a plain loop over its blocks), built seeded on the
config's device, with the parameter count the memory model uses."""
import pytest
import torch

from course_utils.config import config_for
from course_utils.data import get_batch
from course_utils.memory_model import parameter_count
from course_utils.models import GPT, build_model

SMOKE = config_for("smoke", device="cpu")


def test_build_model_is_seeded_and_counts_its_parameters():
    a, b = build_model(SMOKE), build_model(SMOKE)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    other = build_model(SMOKE.replace(seed=1))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), other.parameters()))
    assert sum(p.numel() for p in a.parameters()) == SMOKE.shape.n_parameters == parameter_count(SMOKE)
    assert all(p.dtype == torch.float32 for p in a.parameters())  # autocast casts per op


def test_forward_gives_logits_and_the_loss_and_refuses_a_long_sequence():
    model = build_model(SMOKE)
    x, y = get_batch(SMOKE.batch_size, SMOKE.seq_len)
    logits, loss = model(x, y)
    assert logits.shape == (SMOKE.batch_size, SMOKE.seq_len, SMOKE.vocab_size)
    assert loss.ndim == 0 and 4.0 < loss.item() < 7.0  # about ln(256) before training
    assert model(x)[1] is None
    with pytest.raises(ValueError, match="longer than the model's seq_len"):
        model(torch.zeros(1, SMOKE.seq_len + 1, dtype=torch.long))


def test_a_device_this_machine_lacks_is_refused_before_building(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        build_model(SMOKE.replace(device="cuda"))
    assert isinstance(build_model(SMOKE), GPT)
