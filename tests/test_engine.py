"""The engine: checkpoint policies, the saved-tensor meter vs the analytic estimate, peak memory,
the training loop, and the course-bench command. All at the `smoke` size (seconds)."""
import json
import subprocess
import sys

import pytest
import torch
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from course_utils import measure as measure_mod
from course_utils.config import RunConfig, config_for
from course_utils.data import corpus_bytes, get_batch
from course_utils.measure import measure, measure_saved, saved_bytes
from course_utils.memory_model import estimate, parameter_count
from course_utils.models import build_model
from course_utils.training import train

SMOKE = config_for("smoke", device="cpu")
POLICIES = ["none", "full", "every-2", "segments:1", "segments:2", "selective"]


def loss_and_grads(config):
    model = build_model(config)
    x, y = get_batch(config.batch_size, config.seq_len, seed=1)
    _, loss = model(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("policy", POLICIES[1:])
def test_checkpointing_gives_the_same_loss_and_gradients(policy):
    cfg = SMOKE.replace(n_layers=4, checkpoint="none")
    ref_loss, ref = loss_and_grads(cfg)
    loss, grads = loss_and_grads(cfg.replace(checkpoint=policy))
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-6)
    for name in ref:
        torch.testing.assert_close(grads[name], ref[name], rtol=1e-5, atol=1e-7, msg=name)


def metered(config):
    model = build_model(config)
    x, y = get_batch(config.batch_size, config.seq_len)
    return measure_saved(model, x, y, config.precision)


@pytest.mark.parametrize("policy", ["none", "full", "every-2", "segments:2", "selective"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_meter_matches_estimate(policy, precision):
    cfg = SMOKE.replace(n_layers=4, checkpoint=policy, precision=precision)
    got = metered(cfg).totals()
    est = estimate(cfg)
    for field in ("activations", "autocast_weight_copies", "logits"):
        assert got[field] == pytest.approx(getattr(est, field), rel=0.02), field


def test_full_keeps_exactly_the_block_inputs():
    cfg = SMOKE.replace(n_layers=4, checkpoint="full")
    meter = metered(cfg)
    B, T, d = cfg.batch_size, cfg.seq_len, cfg.d_model
    block_inputs = [r for r in meter.records
                    if r[1] == "activations" and r[2] == (B, T, d) and r[3] == torch.float32]
    assert len(block_inputs) == cfg.n_layers
    indices = 8 * B * T + 8 * T  # token indices and positions kept by the embeddings
    assert meter.totals()["activations"] == cfg.n_layers * B * T * d * 4 + indices


def test_bf16_saves_less_by_the_estimated_factor():
    fp32 = SMOKE.replace(n_layers=4, d_model=128, n_heads=4)
    bf16 = fp32.replace(precision="bf16")
    measured = metered(bf16).totals()["activations"] / metered(fp32).totals()["activations"]
    predicted = estimate(bf16).activations / estimate(fp32).activations
    assert measured < 0.7  # a real saving ...
    assert measured == pytest.approx(predicted, rel=0.05)  # ... of the predicted size
    assert measured > 0.5  # and not the "50%" of claim C2: the residual stream stays fp32


def test_autocast_weight_copies_have_their_own_field():
    fp32 = metered(SMOKE).totals()
    bf16 = metered(SMOKE.replace(precision="bf16")).totals()
    assert fp32["autocast_weight_copies"] == 0
    d, L = SMOKE.d_model, SMOKE.n_layers
    # every Linear weight of every block (12 d^2 elements) and the head (256 d), in bf16
    assert bf16["autocast_weight_copies"] == 2 * (L * 12 * d * d + 256 * d)


def test_checkpoint_sequential_leaves_its_last_segment_plain():
    cfg = SMOKE.replace(n_layers=4)
    model = build_model(cfg)
    x = torch.randn(cfg.batch_size, cfg.seq_len, cfg.d_model, requires_grad=True)
    layers = model.layers
    plain = saved_bytes(lambda: layers[1](layers[0](x)), model=layers)
    seq = saved_bytes(checkpoint_sequential, layers, 2, x, use_reentrant=False, model=layers)

    def every_segment(x):
        for seg in (layers[:2], layers[2:]):
            x = checkpoint(lambda t, s=seg: s[1](s[0](t)), x, use_reentrant=False)
        return x
    ours = saved_bytes(every_segment, x, model=layers)
    block_in = x.numel() * 4
    assert ours == 2 * block_in  # every segment checkpointed: only the 2 segment inputs
    # checkpoint_sequential: segment 1 keeps its input, the last segment keeps everything
    assert seq == block_in + plain
    assert seq > 5 * ours


def test_cpu_peak_is_reported_and_checkpointing_lowers_it():
    none = measure(SMOKE.replace(n_layers=4), min_run_time=0)
    full = measure(SMOKE.replace(n_layers=4, checkpoint="full"), min_run_time=0)
    assert none.peak_allocated is not None and full.peak_allocated is not None
    assert "profiler" in none.peak_method
    assert none.peak_allocated > full.peak_allocated
    # the peak includes what is alive before the step: parameters and AdamW state
    assert none.peak_allocated > none.parameters + none.optimizer_state


def test_measurement_fields_match_the_estimate_exactly_where_closed_form():
    m = measure(SMOKE, min_run_time=0, steps=3)
    e = estimate(SMOKE)
    n = parameter_count(SMOKE)
    assert m.parameters == e.parameters == 4 * n
    assert m.gradients == e.gradients
    assert m.optimizer_state == e.optimizer_state  # AdamW: 8 bytes/param + step counters
    assert m.step_time_s > 0 and m.step_time_iqr_s >= 0
    assert m.tokens_per_s == pytest.approx(SMOKE.tokens_per_step / m.step_time_s)
    assert m.peak_allocated == pytest.approx(e.peak_allocated, rel=0.25)


def test_out_of_memory_is_reported_not_raised(monkeypatch):
    def boom(config, **kw):
        raise measure_mod.OutOfMemory("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(measure_mod, "setup", boom)
    m = measure(SMOKE, min_run_time=0)
    assert m.oom and "smaller batch" in m.error and "2.00 GiB" in m.error
    assert m.peak_allocated is None
    assert measure(SMOKE.replace(batch_size=1), min_run_time=0).oom is True  # still callable


def test_data_is_real_text_and_deterministic():
    text = corpus_bytes()
    assert len(text) > 300_000 and b"the" in text
    x1, y1 = get_batch(4, 16, seed=3, step=5)
    x2, y2 = get_batch(4, 16, seed=3, step=5)
    assert torch.equal(x1, x2) and torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(x1, get_batch(4, 16, seed=3, step=6)[0])
    xv, _ = get_batch(4, 16, split="val")
    assert xv.dtype == torch.int64 and xv.shape == (4, 16)
    with pytest.raises(ValueError):
        get_batch(0, 16)
    with pytest.raises(ValueError):
        get_batch(2, 16, split="test")


def test_training_lowers_the_loss_and_accumulation_matches_a_big_batch():
    hist = train(SMOKE.replace(precision="bf16"), steps=30, eval_every=30, progress=False)
    assert hist.val_loss[-1] < hist.val_loss[0] - 0.3  # from ~ln(256)=5.5 downwards
    fp16 = train(SMOKE.replace(precision="fp16"), steps=3, eval_every=3, progress=False)
    assert len(fp16.scales) == 3  # GradScaler is used (only) for fp16


def test_accumulation_divides_the_loss():
    from course_utils.training import train_step
    cfg = SMOKE
    x, y = get_batch(8, cfg.seq_len, seed=7)
    grads = []
    for chunks in (1, 4):
        model = build_model(cfg)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        batches = list(zip(x.chunk(chunks), y.chunk(chunks)))
        # lr=0 keeps the weights; capture the gradients just before zero_grad
        captured = {}
        opt.zero_grad = lambda set_to_none=True: captured.update(
            {n: p.grad.clone() for n, p in model.named_parameters()})
        train_step(model, opt, batches, "fp32", max_grad_norm=None)
        grads.append(captured)
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6)


def test_course_bench_smoke_writes_json_with_measured_and_estimated(tmp_path):
    out = tmp_path / "bench"
    r = subprocess.run([sys.executable, "-m", "course_utils.experiments", "--size", "smoke",
                        "--device", "cpu", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads((out / "bench.json").read_text())
    rows = {row["label"]: row for row in data["rows"]}
    for label in ("fp32", "bf16", "bf16+full"):
        assert label in rows
        for field in ("activations", "peak_allocated", "parameters"):
            assert rows[label]["measured"][field] > 0
            assert rows[label]["estimated"][field] > 0
        assert rows[label]["measured"]["step_time_s"] > 0
    assert rows["bf16+full"]["measured"]["activations"] < rows["bf16"]["measured"]["activations"]
    assert (out / "bench.png").stat().st_size > 10_000
    assert "est saved" in r.stdout and "bf16+full" in r.stdout


def test_course_bench_refuses_bad_input(capsys):
    from course_utils.experiments import main
    assert main(["--size", "cpu", "--device", "cpu", "--precisions", "fp16"]) == 2
    assert "200x slower" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--precisions", "fp8"])
    assert "unknown precision" in capsys.readouterr().err
    assert main(["--size", "smoke", "--policies", "every-7"]) == 2
    assert "does not fit" in capsys.readouterr().err
