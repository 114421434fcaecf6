"""course_utils.training: the course's step lowers the loss, uses GradScaler for fp16, divides the
loss over micro-batches, and train() refuses what would take minutes."""
import pytest
import torch

from course_utils.config import config_for
from course_utils.data import get_batch
from course_utils.models import build_model
from course_utils.training import compile_blocks, setup, train, train_step

SMOKE = config_for("smoke", device="cpu")


def test_training_lowers_the_loss_and_fp16_uses_the_scaler():
    hist = train(SMOKE.replace(precision="bf16"), steps=30, eval_every=30, progress=False)
    assert hist.val_loss[-1] < hist.val_loss[0] - 0.3  # from ~ln(256)=5.5 downwards
    fp16 = train(SMOKE.replace(precision="fp16"), steps=3, eval_every=3, progress=False)
    assert len(fp16.scales) == 3  # GradScaler is used (only) for fp16
    assert not train(SMOKE, steps=2, eval_every=2, progress=False).scales


def test_train_refuses_what_would_take_minutes(monkeypatch):
    monkeypatch.setattr(torch.cpu, "get_capabilities",
                        lambda: {"cpu_name": "AVX2 CPU", "avx2": True}, raising=False)
    with pytest.raises(ValueError, match="emulated"):
        train(config_for("cpu", device="cpu", precision="fp16"), steps=5, progress=False)
    with pytest.raises(ValueError, match="steps"):
        train(SMOKE, steps=0, progress=False)


def test_accumulation_divides_the_loss():
    cfg = SMOKE
    x, y = get_batch(8, cfg.seq_len, seed=7)
    grads = []
    for chunks in (1, 4):
        model = build_model(cfg)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        batches = list(zip(x.chunk(chunks), y.chunk(chunks)))
        # lr=0 keeps the weights; capture the gradients just before zero_grad
        captured = {}

        def capture(set_to_none=True, model=model, captured=captured):
            captured.update({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.zero_grad = capture
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        train_step(model, opt, scaler, batches, None, max_grad_norm=1e9)
        grads.append(captured)
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6)


def test_compile_compiles_each_block_in_place_not_the_model():
    """Regional compilation (lesson 03 §3): ``compile=True`` compiles every unit of
    ``model.layers`` in place, so one compiled graph serves the identical blocks; nothing is
    compiled until a step runs, so this test compiles nothing."""
    state = setup(config_for("smoke", device="cpu").replace(compile=True, checkpoint="full"))
    assert state.model is state.module                       # the model itself, not a wrapper
    assert all(u._compiled_call_impl is not None for u in state.module.layers)
    assert state.module._compiled_call_impl is None          # the embeddings and head stay eager
    plain = setup(config_for("smoke", device="cpu"))
    assert all(u._compiled_call_impl is None for u in plain.module.layers)
    budget = build_model(config_for("smoke", device="cpu").replace(checkpoint="memory-budget:0.5"))
    compile_blocks(budget)                                    # a unit that compiles itself is left alone
    assert all(u._compiled_call_impl is None for u in budget.layers)
    with pytest.raises(ValueError, match="layers"):
        compile_blocks(torch.nn.Linear(2, 2))
