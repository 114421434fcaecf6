"""course_utils.learner_checks: exercise 02's helpers (forward calls, gradients, bytes kept, matmul
FLOPs) and exercise 03's step probe (what a step hands its optimizer)."""
import math

import pytest
import torch
from helpers import TINY, x_like

from course_utils import learner_checks
from course_utils.data import get_batch
from course_utils.memory_model import estimate
from course_utils.models import build_model
from course_utils.training import train_step


def test_exercise02_helpers_count_calls_gradients_memory_and_flops(cfg):
    torch.manual_seed(0)
    blocks = build_model(cfg.replace(n_layers=3)).layers
    x = x_like(cfg)
    assert learner_checks.forward_calls(learner_checks.forward_plain, blocks, x) == [1, 1, 1]
    assert learner_checks.forward_calls(learner_checks.forward_full, blocks, x) == [2, 2, 2]
    assert learner_checks.forward_calls(learner_checks.checkpoint_every_segment, blocks, x, 3) == [2, 2, 2]
    plain = learner_checks.gradients(learner_checks.forward_plain, blocks, x)
    full = learner_checks.gradients(learner_checks.forward_full, blocks, x)
    assert len(plain) == len(list(blocks.parameters())) + 1 and plain[-1].shape == x.shape
    for a, b in zip(plain, full):
        torch.testing.assert_close(a, b)
    assert learner_checks.kept_after_forward(learner_checks.forward_full, blocks, x) \
        < learner_checks.kept_after_forward(learner_checks.forward_plain, blocks, x)
    mm_plain = learner_checks.matmul_flops(learner_checks.forward_plain, blocks, x)
    mm_full = learner_checks.matmul_flops(learner_checks.forward_full, blocks, x)
    assert 0 < mm_plain < mm_full
    with pytest.raises(ValueError, match="require grad"):
        learner_checks.gradients(learner_checks.forward_plain, blocks, x.detach())
    with pytest.raises(TypeError, match="nn.ModuleList"):
        learner_checks.forward_calls(learner_checks.forward_plain, list(blocks), x)


def test_the_checks_tell_a_korean_learner_what_to_pass_in_korean(monkeypatch):
    """Issue 28: an exercise's check refuses bad input in the learner's language."""
    monkeypatch.setenv("COURSE_LANG", "ko")
    blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
    with pytest.raises(TypeError) as info:
        learner_checks.forward_calls(learner_checks.forward_plain, list(blocks), torch.ones(1, 4))
    assert str(info.value) == ("blocks는 블록들의 nn.ModuleList(또는 nn.Sequential)여야 합니다. "
                               "받은 것: list.")
    with pytest.raises(ValueError, match=r"^x는 requires_grad가 켜져 있어야 합니다"):
        learner_checks.gradients(learner_checks.forward_plain, blocks, torch.ones(1, 4))


def _manual_grads(cfg, micro):
    model = build_model(cfg)
    for x, y in micro:
        _, loss = model(x, y)
        (loss / len(micro)).backward()
    return [p.grad for p in model.parameters()]


def test_step_gradients_sees_what_the_optimizer_receives():
    micro = [get_batch(2, TINY.seq_len, step=i) for i in range(2)]
    got = learner_checks.step_gradients(train_step, build_model(TINY), micro)
    assert got["steps"] == 1 and got["zeroed"] and got["saved"] is None
    assert learner_checks.relative_error(got["grads"], _manual_grads(TINY, micro)) < 1e-6
    assert got["loss"] == pytest.approx(sum(build_model(TINY)(x, y)[1].item() for x, y in micro) / 2,
                                        rel=1e-5)
    full = learner_checks.step_gradients(train_step, build_model(TINY.replace(checkpoint="full")), micro[:1],
                                   meter=True)
    assert sum(full["saved"].values()) == estimate(TINY.replace(checkpoint="full", batch_size=2)).saved_total


def _step_without_unscale(model, optimizer, scaler, micro_batches, dtype=None, max_grad_norm=1.0):
    for x, y in micro_batches:
        _, loss = model(x, y)
        scaler.scale(loss / len(micro_batches)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss


def test_a_step_without_unscale_is_caught_only_with_an_enabled_scaler():
    micro = [get_batch(TINY.batch_size, TINY.seq_len, step=1)]

    def run(step_fn, enabled):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, enabled=enabled)
        return learner_checks.step_gradients(step_fn, build_model(TINY), micro, scaler=scaler,
                                       max_grad_norm=0.01)["grads"]
    assert learner_checks.relative_error(run(_step_without_unscale, False), run(train_step, False)) < 1e-6
    assert learner_checks.relative_error(run(_step_without_unscale, True), run(train_step, True)) > 0.9


def test_relative_error_refuses_mismatches():
    a = [torch.ones(3)]
    assert learner_checks.relative_error(a, [torch.ones(3)]) == 0
    assert learner_checks.relative_error(a, [torch.ones(4)]) == math.inf
    assert learner_checks.relative_error([], a) == math.inf
    assert learner_checks.relative_error([None], a) == math.inf
