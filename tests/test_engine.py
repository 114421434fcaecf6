"""The engine: checkpoint policies, the saved-tensor meter vs the analytic estimate, peak memory,
the training loop, and the course-bench command. All at the `smoke` size (seconds)."""
import gc
import json
import subprocess
import sys
import weakref

import pytest
import torch

import course_utils.measure  # noqa: F401 - the module (course_utils.measure is the function)
from course_utils.checkpointing import Checkpointed, apply_checkpointing, segment_bounds
from course_utils.config import config_for
from course_utils.data import corpus_bytes, get_batch
from course_utils.experiments import compare
from course_utils.measure import measure
from course_utils.memory_model import estimate, parameter_count
from course_utils.models import build_model
from course_utils.saved_tensors import measure_saved, saved_by_module, saved_bytes
from course_utils.training import setup, train, train_step

measure_mod = sys.modules["course_utils.measure"]

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
    assert len(grads) == len(ref)  # the same parameters, in the same order (longer names)
    for (name, g), r in zip(grads.items(), ref.values()):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-7, msg=name)


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
    block_inputs = [r for r in meter.records if r["bucket"] == "activations"
                    and r["shape"] == (B, T, d) and r["dtype"] == torch.float32]
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


def test_policies_wrap_blocks_and_the_forward_is_a_plain_loop():
    model = build_model(SMOKE.replace(n_layers=5, checkpoint="segments:2"))
    assert [len(u.blocks) for u in model.layers] == [3, 2] == [b - a for a, b in segment_bounds(5, 2)]
    every = build_model(SMOKE.replace(n_layers=5, checkpoint="every-2"))
    assert [isinstance(u, Checkpointed) for u in every.layers] == [True, False, True, False, True]
    plain = build_model(SMOKE.replace(n_layers=5))
    assert sorted(p.data_ptr() for p in plain.parameters()) != []  # builds
    with pytest.raises(ValueError, match="already wrapped"):
        apply_checkpointing(every, "full")
    with pytest.raises(ValueError, match="Valid policies"):
        apply_checkpointing(plain, "every-0")
    import inspect
    src = inspect.getsource(type(plain).forward)
    assert "for block in self.layers:" in src and "checkpoint" not in src


def test_the_meter_frees_what_it_measures():
    """Issue 9: a pack hook that returned the live tensor kept every forward's graph alive."""
    cfg = SMOKE.replace(n_layers=2)
    model = build_model(cfg)
    x, y = get_batch(cfg.batch_size, cfg.seq_len)
    seen = []
    hook = model.layers[0].ln1.register_forward_hook(lambda m, i, out: seen.append(weakref.ref(out)))
    meter = measure_saved(model, x, y)
    hook.remove()
    assert meter.totals()["activations"] > 0
    gc.collect()
    assert seen and seen[0]() is None, "a saved activation outlived measure_saved"


def live_tensor_bytes() -> int:
    """Bytes of every distinct tensor storage that Python can still reach (the CPU stand-in for
    CUDA's memory_allocated, which the CUDA peak reads)."""
    gc.collect()
    seen = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            try:
                st = obj.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def test_measure_and_compare_leave_no_tensors_behind():
    """Issue 9: with the leak, each measurement left its graph and parameters allocated, so the
    CUDA path's absolute max_memory_allocated would have carried earlier runs into later peaks."""
    cfg = SMOKE.replace(n_layers=2)
    measure(cfg, steps=1)  # first-call caches (corpus, kernels) before the baseline
    base = live_tensor_bytes()
    x, y = get_batch(cfg.batch_size, cfg.seq_len)
    base = live_tensor_bytes()
    def forward_only(policy):  # no backward ever frees these graphs
        model = build_model(cfg.replace(checkpoint=policy))
        measure_saved(model, x, y, "bf16")
        saved_bytes(lambda: model(x, y), model=model)
        saved_by_module(model, lambda: model(x, y))

    for policy in ("none", "full", "selective"):
        forward_only(policy)
        measure(cfg.replace(checkpoint=policy), steps=1)
    compare([cfg, cfg.replace(checkpoint="full")], steps=2, progress=False)
    assert live_tensor_bytes() - base < 64 * 1024  # nothing of a model or graph is left


def test_cpu_peak_is_reported_and_checkpointing_lowers_it():
    none = measure(SMOKE.replace(n_layers=4), timed=False)
    full = measure(SMOKE.replace(n_layers=4, checkpoint="full"), timed=False)
    assert none.peak_allocated is not None and full.peak_allocated is not None
    assert "profiler" in none.peak_method
    assert none.peak_allocated > full.peak_allocated
    # the peak includes what is alive before the step: parameters and AdamW state
    assert none.peak_allocated > none.parameters + none.optimizer_state
    assert none.step_time_s is None and not none.step_times_s  # timed=False: memory only


def test_a_tiny_warm_up_gives_the_same_memory_as_a_full_one():
    """Emulated precisions warm up on one short sequence (a full step there takes seconds); the
    memory step after it must read the same bytes as after a full warm-up step."""
    cfg = config_for("smoke", device="cpu", n_layers=2, batch_size=8)
    full = setup(cfg)
    measure_mod.warm_up(full, 1)
    tiny = setup(cfg)
    measure_mod.warm_up(tiny, 1, tiny=True)
    a, b = measure_mod.memory_step(full), measure_mod.memory_step(tiny)
    for f in ("parameters", "gradients", "optimizer_state", "activations", "logits"):
        assert a[f] == b[f], f
    assert b["peak_allocated"] == pytest.approx(a["peak_allocated"], rel=0.02)


def test_measurement_fields_match_the_estimate_exactly_where_closed_form():
    m = measure(SMOKE, steps=3)
    e = estimate(SMOKE)
    n = parameter_count(SMOKE)
    assert m.parameters == e.parameters == 4 * n
    assert m.gradients == e.gradients
    assert m.optimizer_state == e.optimizer_state  # AdamW: 8 bytes/param + step counters
    assert len(m.step_times_s) == 3 and m.step_time_s > 0 and m.step_time_iqr_s >= 0
    assert m.tokens_per_s == pytest.approx(SMOKE.tokens_per_step / m.step_time_s)
    assert m.peak_allocated == pytest.approx(e.peak_allocated, rel=0.25)


def test_an_emulated_precision_is_timed_with_one_step_and_labelled(monkeypatch):
    from course_utils import hardware
    monkeypatch.setattr(torch.cpu, "get_capabilities",
                        lambda: {"cpu_name": "AVX2 CPU", "avx2": True}, raising=False)
    m = measure(SMOKE.replace(precision="bf16"), budget_s=5)
    assert m.emulated and len(m.step_times_s) == 1 and "emulated" in m.timing
    assert m.activations > 0 and m.peak_allocated > 0  # memory is measured as everywhere
    assert hardware.is_emulated(hardware.detect("cpu"), "bf16")


def test_measure_validates_its_arguments():
    for kw, match in (({"steps": -1}, "steps"), ({"steps": 0}, "steps"), ({"warmup": 0}, "warmup"),
                      ({"budget_s": 0}, "budget_s")):
        with pytest.raises(ValueError, match=match):
            measure(SMOKE, **kw)
    with pytest.raises(ValueError, match="steps"):
        compare([SMOKE], steps=0, progress=False)
    with pytest.raises(ValueError, match="at least one"):
        compare([], progress=False)


def test_out_of_memory_is_reported_not_raised(monkeypatch):
    def boom(config, **kw):
        raise measure_mod.OutOfMemory("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(measure_mod, "setup", boom)
    m = measure(SMOKE, timed=False)
    assert m.oom and "smaller batch" in m.error and "2.00 GiB" in m.error
    assert m.peak_allocated is None
    assert measure(SMOKE.replace(batch_size=1), timed=False).oom is True  # still callable


def test_measure_and_compare_share_one_out_of_memory_message(monkeypatch):
    """The same failure reads the same in `measure` and in `compare` (the core's one message),
    and the CPU allocator's untyped RuntimeError counts as running out of memory."""
    cpu_error = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                             "can't allocate memory: you tried to allocate 1125899906842624 bytes.")

    def boom(config, **kw):
        raise cpu_error
    monkeypatch.setattr(measure_mod, "setup", boom)
    alone = measure(SMOKE, timed=False)
    together = compare([SMOKE], timed=False, progress=False)
    assert alone.oom and together["oom"].tolist() == [True]
    assert alone.error == together["error"][0] == measure_mod.out_of_memory_message(
        SMOKE, alone.device_name, cpu_error)
    assert "at batch 4, seq 32 (fp32)" in alone.error and "can't allocate memory" in alone.error
    assert measure_mod.ran_out_of_memory(cpu_error)
    assert not measure_mod.ran_out_of_memory(RuntimeError("shape mismatch"))

    def other(config, **kw):
        raise RuntimeError("shape mismatch")
    monkeypatch.setattr(measure_mod, "setup", other)
    with pytest.raises(RuntimeError, match="shape mismatch"):  # not memory: it escapes
        measure(SMOKE, timed=False)


def test_course_bench_checks_each_configuration_once(monkeypatch, capsys):
    from course_utils import guard
    from course_utils.cli import main

    checked = []
    real = guard.check_feasible

    def counting(config, hw=None, force=False):
        checked.append(config.label)
        return real(config, hw, force)
    monkeypatch.setattr(measure_mod, "check_feasible", counting)
    assert main(["--size", "smoke", "--steps", "1", "--precisions", "fp32", "--policies",
                 "none,full"]) == 0
    assert sorted(checked) == ["fp32", "fp32+full"]


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


def test_course_bench_smoke_writes_json_with_measured_and_estimated(tmp_path):
    out = tmp_path / "bench"
    r = subprocess.run([sys.executable, "-m", "course_utils.cli", "--size", "smoke",
                        "--device", "cpu", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads((out / "bench.json").read_text())
    rows = {row["label"]: row for row in data["rows"]}
    assert rows and list(rows)[0] == "fp32"
    full = next(label for label in rows if label.endswith("+full"))
    for row in rows.values():
        for field in ("activations", "peak_allocated", "parameters"):
            assert row["measured"][field] > 0 and row["estimated"][field] > 0
        assert row["measured"]["step_time_s"] > 0
        # at smoke size no time comparison is decided (fixed per-step overheads dominate)
        assert row["time_verdict"] in ("reference", "inconclusive at this size", "emulated")
    plain = next(label for label in rows if rows[label]["config"]["checkpoint"] == "none"
                 and rows[label]["config"]["precision"] == rows[full]["config"]["precision"])
    assert rows[full]["measured"]["activations"] < rows[plain]["measured"]["activations"]
    assert (out / "bench.png").stat().st_size > 10_000
    from course_utils.experiments import plain_label
    assert "est saved MiB" in r.stdout and plain_label(full) in r.stdout


def test_course_bench_refuses_bad_input_before_measuring(capsys, tmp_path, monkeypatch):
    from course_utils.cli import main
    monkeypatch.setattr(torch.cpu, "get_capabilities",
                        lambda: {"cpu_name": "AVX2 CPU", "avx2": True}, raising=False)
    for argv, words in (
            (["--size", "cpu", "--device", "cpu", "--precisions", "fp16"], "emulated"),
            (["--size", "smoke", "--policies", "every-7"], "does not fit"),
            (["--size", "smoke", "--device", "cuda:3"], "cuda"),
            (["--size", "smoke", "--out", str(tmp_path / "no" / "such")], "does not exist"),
            (["--size", "smoke", "--batch-size", "100000000"], "estimated peak")):
        assert main(argv) == 2, argv
        assert words in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["--size", "smoke", "--out", str(tmp_path / "file")]) == 2
    assert "existing file" in capsys.readouterr().err
    for bad in (["--precisions", "fp8"], ["--batch-size", "0"], ["--seq-len", "0"],
                ["--steps", "-1"]):
        with pytest.raises(SystemExit):
            main(bad)
        err = capsys.readouterr().err
        assert "expected" in err or "unknown" in err, err


def test_compare_survives_running_out_of_memory_while_timing(monkeypatch):
    """On a GPU, every configuration's model is alive while they are timed in alternation; an
    out-of-memory error there keeps the memory measured and says what to do."""
    def boom(*args, **kwargs):
        raise measure_mod.OutOfMemory("CUDA out of memory. Tried to allocate 1.00 GiB")
    monkeypatch.setattr(measure_mod, "interleaved", boom)
    df = compare([SMOKE, SMOKE.replace(checkpoint="full")], progress=False)
    assert (df["peak_allocated"] > 0).all() and df["step_time_s"].isna().all()
    assert df["error"].str.contains("compare fewer").all()
    assert set(df["time_verdict"]) <= {"reference", "not timed"}
