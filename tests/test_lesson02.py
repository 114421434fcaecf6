"""Tests of what lesson 02 (activation checkpointing) adds to course_utils: the memory timeline,
peak and kept-bytes helpers, per-module saved tensors, the lesson's charts, and the PyTorch /
Hugging Face behaviours the lesson teaches (all on CPU)."""
import functools

import pandas as pd
import pytest
import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

from course_utils import plots, timeline
from course_utils.config import config_for
from course_utils.measure import SavedTensorMeter, saved_by_module, saved_bytes
from course_utils.memory_model import block_bytes_per_token
from course_utils.models import build_model
from course_utils.timeline import Phase, Timeline, allocated_after, memory_timeline, peak_bytes, phase

MB = 1 << 20


@pytest.fixture(scope="module")
def cfg():
    return config_for("smoke", device="cpu")


@pytest.fixture(scope="module")
def block(cfg):
    torch.manual_seed(0)
    return build_model(cfg).layers[0]


def _x(cfg, requires_grad=True):
    return torch.randn(cfg.batch_size, cfg.seq_len, cfg.d_model, requires_grad=requires_grad)


# ------------------------------------------------------------------------------ timeline (CPU)

def test_memory_timeline_sees_an_allocation_and_its_free():
    def fn():
        with phase("make"):
            a = torch.ones(MB // 4)  # 1 MiB of fp32
            b = torch.ones(MB // 2)  # 2 MiB, freed before returning
            del b
        with phase("keep"):
            return a * 2  # 1 MiB more, returned

    tl = memory_timeline(fn)
    assert tl.device == "cpu" and "profiler" in tl.method
    assert len(tl.t_ms) == len(tl.allocated) > 0
    assert tl.t_ms == sorted(tl.t_ms)
    assert tl.peak_bytes >= 3 * MB  # a and b alive together
    assert tl.final_bytes == MB  # only the result: b was deleted, a went with fn's frame
    assert isinstance(tl.result, torch.Tensor) and tl.result.numel() == MB // 4
    assert [p.name for p in tl.phases] == ["make", "keep"]
    make, keep = tl.phases
    assert make.start_ms <= make.end_ms <= keep.start_ms <= keep.end_ms
    assert tl.phase_peak("make") >= 3 * MB
    frame = tl.to_frame()
    assert list(frame.columns) == ["t_ms", "allocated_bytes"] and len(frame) == len(tl.t_ms)


def test_timeline_errors_and_no_op_phase():
    tl = memory_timeline(lambda: torch.zeros(10))
    with pytest.raises(ValueError, match="no phase 'backward'"):
        tl.phase_peak("backward")
    with pytest.raises(ValueError, match="non-empty string"):
        with phase(""):
            pass
    with phase("outside a timeline"):  # only a profiler annotation: must not fail
        torch.zeros(3)
    with pytest.raises(ValueError, match="no memory events"):
        memory_timeline(lambda: None, "meta")
    empty = Timeline(device="cpu", method="test")
    assert empty.peak_bytes == 0 and empty.final_bytes == 0


def test_peak_bytes_and_allocated_after_on_cpu():
    def temporary():
        t = torch.ones(MB)  # 4 MiB, gone when the function returns
        return float(t.sum())

    assert peak_bytes(temporary) >= 4 * MB
    assert peak_bytes(lambda: None) == 0
    out, kept = allocated_after(lambda: torch.ones(MB // 4))
    assert kept == MB and out.numel() == MB // 4
    out, kept = allocated_after(temporary)
    assert kept == 0 and out == MB
    # Devices without an event source answer None rather than a made-up number.
    assert peak_bytes(lambda: None, "meta") is None
    assert allocated_after(lambda: 5, "meta") == (5, None)


def test_trace_timeline_parses_allocator_history():
    # The CUDA path's parser, on a hand-written trace (no GPU needed).
    trace = [
        {"action": "segment_alloc", "size": 4096, "time_us": 100},
        {"action": "alloc", "size": 1000, "time_us": 100},
        {"action": "alloc", "size": 500, "time_us": 150},
        {"action": "free_requested", "size": 1000, "time_us": 180},
        {"action": "free_completed", "size": 1000, "time_us": 200},
        {"action": "alloc", "size": 200, "time_us": 300},
    ]
    tl = timeline._trace_timeline(trace, [("forward", 0, 3), ("backward", 3, 6)], "cuda:0", "test")
    assert tl.allocated == [1000, 1500, 500, 700]
    assert tl.t_ms == [0.0, 0.05, 0.1, 0.2]
    assert tl.peak_bytes == 1500 and tl.final_bytes == 700
    assert tl.phases == [Phase("forward", 0.0, 0.05), Phase("backward", 0.08, 0.2)]


# ------------------------------------------------------------------------- saved tensors by module

def test_saved_by_module_matches_the_meter_and_the_estimate(cfg, block):
    x = _x(cfg)
    table = saved_by_module(block, lambda: block(x))
    assert list(table.columns) == ["module", "module_type", "shape", "dtype", "nbytes", "grad_fn"]
    with SavedTensorMeter(block) as meter:
        block(x)
    assert table.nbytes.sum() == sum(meter.totals().values())
    assert table.nbytes.sum() == block_bytes_per_token(cfg) * cfg.batch_size * cfg.seq_len
    # forward order, innermost module: LayerNorm 1 first (the block input), GELU saves fc1's output
    assert table.module.iloc[0] == "ln1" and table["shape"].iloc[0] == tuple(x.shape)
    assert list(dict.fromkeys(table.module)) == ["ln1", "attn.qkv", "attn", "ln2", "mlp.fc1",
                                                 "mlp.act", "mlp.fc2"]
    gelu = table[table.module == "mlp.act"]
    assert gelu["shape"].iloc[0] == (cfg.batch_size, cfg.seq_len, 4 * cfg.d_model)
    # parameters are never listed
    param_shapes = {tuple(p.shape) for p in block.parameters() if p.dim() == 2}
    assert not param_shapes & set(table["shape"])
    # the module's hooks are removed afterwards
    assert not block._forward_hooks and not block._forward_pre_hooks


def test_saved_by_module_of_a_checkpointed_block_keeps_only_its_input(cfg, block):
    x = _x(cfg)
    table = saved_by_module(block, lambda: checkpoint(block, x, use_reentrant=False))
    assert len(table) == 1
    assert table.nbytes.iloc[0] == x.numel() * x.element_size()
    assert table.module.iloc[0] == "" and table.module_type.iloc[0] == "Block"
    with pytest.raises(TypeError, match="torch.nn.Module"):
        saved_by_module(lambda t: t, lambda: None)


# -------------------------------------------------------------- PyTorch behaviours the lesson uses

def test_checkpoint_recomputes_once_and_keeps_gradients(cfg, block):
    x = _x(cfg)
    calls = []
    hook = block.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        block.zero_grad(set_to_none=True)
        block(x).pow(2).mean().backward()
        plain = [p.grad.clone() for p in block.parameters()]
        n_plain = len(calls)
        block.zero_grad(set_to_none=True)
        checkpoint(block, x, use_reentrant=False).pow(2).mean().backward()
        n_ckpt = len(calls) - n_plain
    finally:
        hook.remove()
    assert (n_plain, n_ckpt) == (1, 2)
    for a, b in zip(plain, (p.grad for p in block.parameters())):
        torch.testing.assert_close(a, b)


def test_checkpoint_sequential_leaves_its_last_segment_plain(cfg):
    torch.manual_seed(0)
    layers = build_model(cfg.replace(n_layers=4)).layers
    x = _x(cfg)
    unit = x.numel() * x.element_size()
    plain_block = block_bytes_per_token(cfg) * cfg.batch_size * cfg.seq_len

    def run(segment, t):
        for layer in segment:
            t = layer(t)
        return t

    def every_segment(layers, x, n):
        step = len(layers) // n
        for i in range(0, len(layers), step):
            x = checkpoint(run, layers[i:i + step], x, use_reentrant=False)
        return x

    seq = saved_bytes(checkpoint_sequential, layers, 2, x, use_reentrant=False, model=layers)
    mine = saved_bytes(every_segment, layers, x, 2, model=layers)
    assert mine == 2 * unit
    assert seq == unit + 2 * plain_block  # one checkpointed segment input + 2 plain blocks


def test_reentrant_checkpoint_loses_gradients_when_no_input_requires_grad(cfg, block):
    x = _x(cfg, requires_grad=False)
    head = torch.nn.Linear(cfg.d_model, 3)
    for reentrant, expect_grads in ((True, False), (False, True)):
        block.zero_grad(set_to_none=True)
        with pytest.warns(UserWarning) if reentrant else _nothing():
            loss = head(checkpoint(block, x, use_reentrant=reentrant)).pow(2).mean()
        loss.backward()
        assert all((p.grad is not None) == expect_grads for p in block.parameters())


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_selective_policy_keeps_less_than_none_and_recomputes_no_matmul(cfg):
    from torch.utils.flop_counter import FlopCounterMode
    torch.manual_seed(0)
    layers = build_model(cfg.replace(n_layers=2)).layers
    x = _x(cfg)
    mm = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in mm else CheckpointPolicy.PREFER_RECOMPUTE

    def run(mode):
        h = x
        for b in layers:
            if mode == "none":
                h = b(h)
            elif mode == "full":
                h = checkpoint(b, h, use_reentrant=False)
            else:
                h = checkpoint(b, h, use_reentrant=False, context_fn=functools.partial(
                    create_selective_checkpoint_contexts, policy))
        return h

    kept, flops = {}, {}
    for mode in ("none", "full", "sac"):
        out, kept[mode] = allocated_after(lambda mode=mode: run(mode))
        del out
        with FlopCounterMode(display=False) as counter:
            run(mode).sum().backward()
        flops[mode] = counter.get_total_flops()
    assert kept["full"] < kept["sac"] < 0.8 * kept["none"]
    assert flops["sac"] == flops["none"] < flops["full"]
    # the saved-tensor hook cannot see what SAC caches: it reports the block inputs only
    assert saved_bytes(lambda: run("sac"), model=layers) == saved_bytes(lambda: run("full"),
                                                                        model=layers)


def test_hugging_face_gpt2_checkpointing_keeps_gradients_and_saves_less(cfg):
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    config = transformers.GPT2Config(vocab_size=256, n_positions=cfg.seq_len, n_embd=cfg.d_model,
                                     n_layer=2, n_head=cfg.n_heads, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).train()  # dropout on: RNG must be replayed
    ids = torch.randint(0, 256, (cfg.batch_size, cfg.seq_len))

    def grads_and_saved():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        with SavedTensorMeter(model) as meter:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return [p.grad.clone() for p in model.parameters()], sum(meter.totals().values())

    plain_grads, plain_saved = grads_and_saved()
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ckpt_grads, ckpt_saved = grads_and_saved()
    for a, b in zip(plain_grads, ckpt_grads):
        torch.testing.assert_close(a, b)
    assert ckpt_saved < plain_saved / 4


# ------------------------------------------------------------------------------------------ charts

def test_lesson_charts_draw_and_reject_bad_input(cfg, block):
    x = _x(cfg)
    plain = saved_by_module(block, lambda: block(x))
    ckpt = saved_by_module(block, lambda: checkpoint(block, x, use_reentrant=False))
    fig = plots.saved_tensors_chart({"plain": plain, "checkpoint": ckpt})
    assert len(fig.axes) == 1 and len(fig.axes[0].patches) == plain.module.nunique() * 2 + 2
    with pytest.raises(ValueError):
        plots.saved_tensors_chart({})

    growth = pd.DataFrame([dict(sweep=s, batch_size=b, seq_len=t, saved=b * t, est_saved=b * t,
                                static=float("nan"), est_static=100.0)
                           for s, b, t in (("batch_size", 1, 8), ("batch_size", 2, 8),
                                           ("seq_len", 1, 8), ("seq_len", 1, 16))])
    assert len(plots.memory_growth_chart(growth).axes) == 2
    with pytest.raises(ValueError):
        plots.memory_growth_chart(growth.drop(columns="est_static"))

    seg = pd.DataFrame([dict(method=m, segments=s, saved_bytes=s * MB, peak_bytes=(s + 8 / s) * MB,
                             est_saved=s * MB, est_peak=(s + 8 / s) * MB)
                        for m in ("loop", "checkpoint_sequential") for s in (1, 2, 4, 8)])
    assert len(plots.segments_chart(seg, n_layers=8).axes) == 2
    with pytest.raises(ValueError):
        plots.segments_chart(seg.iloc[:0], n_layers=8)

    table = pd.DataFrame({"label": ["a", "b", "c"], "step_time_s": [1.0, 1.2, 2.0],
                          "step_time_iqr_s": [0.1, 0.1, None],
                          "peak_allocated": [100 * MB, 50 * MB, 80 * MB]})
    ax = plots.pareto_chart(table).axes[0]
    front = [line for line in ax.lines if line.get_label() == "Pareto front"][0]
    assert list(front.get_xdata()) == [1000.0, 1200.0]  # c is dominated by b
    with pytest.raises(ValueError):
        plots.pareto_chart(table.assign(step_time_s=None))

    att = pd.DataFrame([dict(attention=a, seq_len=t, saved_bytes=t * (t if a == "naive" else 1))
                        for a in ("naive", "sdpa") for t in (8, 16, 32)])
    labels = [line.get_label() for line in plots.attention_memory_chart(att).axes[0].lines]
    assert any("slope 2.00" in label for label in labels)
    assert any("slope 1.00" in label for label in labels)

    tl = memory_timeline(lambda: torch.ones(1000))
    assert len(plots.memory_timeline_chart({"a": tl, "b": tl}).axes) == 2
    with pytest.raises(ValueError):
        plots.memory_timeline_chart({})
