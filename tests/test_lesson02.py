"""Tests of what lesson 02 (activation checkpointing) adds to course_utils: the memory timeline,
peak and kept-bytes helpers, per-module saved tensors, the lesson's charts, the PyTorch /
Hugging Face behaviours the lesson teaches (all on CPU); that the lesson's checkpointing code is
the library's, text for text; exercise 02's given helpers (course_utils.exercise02); and the
lesson notebook's own rules (verdicts from the engine, charts as a cell's last expression)."""
import ast
import functools
import inspect
import json
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    checkpoint_sequential,
    create_selective_checkpoint_contexts,
)

import course_utils.checkpointing as ck
from course_utils import exercise02, plots, timeline
from course_utils.config import config_for
from course_utils.data import get_batch
from course_utils.memory_model import block_bytes_per_token
from course_utils.models import build_model
from course_utils.saved_tensors import SavedTensorMeter, measure_saved, saved_by_module, saved_bytes
from course_utils.timeline import Phase, Timeline, allocated_after, memory_timeline, peak_bytes, phase

MB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "notebooks" / "02_gradient_checkpointing.ipynb"


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
    where, elapsed = tl.peak_moment()  # a and b alive together: inside "make", after both allocations
    assert where == "make" and 0 < elapsed <= 1
    assert Timeline(device="cpu", method="test").peak_moment() == (None, None)
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

    seq = saved_bytes(checkpoint_sequential, layers, 2, x, use_reentrant=False, model=layers)
    mine = saved_bytes(ck.checkpoint_every_segment, layers, x, 2, model=layers)
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



def test_gpt2_saves_what_the_course_model_saves_without_dropout_and_tanh_gelu(cfg):
    """Lesson 02 §8's explanation, checked: dropout and GPT-2's tanh GELU are the whole difference
    between GPT-2's saved tensors and the course model's of the same shape."""
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    shape = dict(vocab_size=256, n_positions=cfg.seq_len, n_embd=cfg.d_model, n_layer=2,
                 n_head=cfg.n_heads, bos_token_id=0, eos_token_id=0)
    x, y = get_batch(cfg.batch_size, cfg.seq_len)

    def gpt2_saved(**changes):
        torch.manual_seed(0)
        m = transformers.GPT2LMHeadModel(transformers.GPT2Config(**shape, **changes)).train()
        return saved_bytes(lambda: m(input_ids=x, labels=x, use_cache=False).loss, model=m)

    no_dropout = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    as_built, plain = gpt2_saved(), gpt2_saved(**no_dropout)
    exact = gpt2_saved(**no_dropout, activation_function="gelu")
    course = sum(measure_saved(build_model(cfg.replace(n_layers=2)), x, y).totals().values())
    assert as_built > plain > exact
    assert exact == course


def test_recomputing_the_attention_core_keeps_no_seq_by_seq_tensor(cfg):
    """Lesson 02 §7: with naive attention, keeping only the linear layers' outputs removes the
    seq x seq matrices from what the forward keeps, and recomputes fewer FLOPs than full."""
    from torch.utils.flop_counter import FlopCounterMode
    aten = torch.ops.aten
    torch.manual_seed(0)
    c = cfg.replace(seq_len=4 * cfg.seq_len, attention="naive", n_layers=2)
    layers = build_model(c).layers
    x = torch.randn(1, c.seq_len, c.d_model, requires_grad=True)

    def keep_linear_outputs(ctx, op, *args, **kwargs):
        linear = op in (aten.mm.default, aten.addmm.default)
        return CheckpointPolicy.MUST_SAVE if linear else CheckpointPolicy.PREFER_RECOMPUTE

    runs = {"none": lambda: exercise02.forward_plain(layers, x),
            "full": lambda: exercise02.forward_full(layers, x),
            "core": lambda: exercise02.forward_selective(layers, x, keep_linear_outputs)}
    kept, flops = {}, {}
    for name, run in runs.items():
        out, kept[name] = allocated_after(run)
        del out
        with FlopCounterMode(display=False) as counter:
            run().sum().backward()
        flops[name] = counter.get_total_flops()
    heads = c.n_heads
    square = heads * c.seq_len * c.seq_len * 4            # one block's fp32 softmax output
    linear = 9 * c.seq_len * c.d_model * 4                # qkv 3, proj 1, fc1 4, fc2 1 (per block)
    assert kept["none"] - kept["core"] >= 2 * square      # both blocks' seq x seq matrices gone
    assert kept["core"] == pytest.approx(2 * linear + x.numel() * 4 * 2, rel=0.05)
    assert flops["none"] < flops["core"] < flops["full"]


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
    fig = plots.segments_chart(seg, n_layers=8)
    assert len(fig.axes) == 2
    # equal peaks of two methods stay visible: a thin line with small markers over a thick one
    thick, thin = [line for line in fig.axes[1].lines if "(measured)" in line.get_label()]
    assert thick.get_linewidth() > 2 * thin.get_linewidth()
    assert thick.get_markersize() > 2 * thin.get_markersize() and thin.get_zorder() > thick.get_zorder()
    assert fig.legends and "loop (model)" in [t.get_text() for t in fig.legends[0].get_texts()]
    with pytest.raises(ValueError):
        plots.segments_chart(seg.iloc[:0], n_layers=8)

    table = pd.DataFrame({"label": ["a", "b", "c"], "step_time_s": [1.0, 1.2, 2.0],
                          "step_time_iqr_s": [0.1, 0.1, None],
                          "peak_allocated": [100 * MB, 50 * MB, 80 * MB]})
    ax = plots.pareto_chart(table).axes[0]
    from matplotlib.colors import same_color
    front = sorted({float(v) for line in ax.lines if same_color(line.get_color(), "#DD8452")
                    for v in line.get_xdata()})
    assert front == [1000.0, 1200.0]  # the front joins a and b; c is dominated by b
    with pytest.raises(ValueError):
        plots.pareto_chart(table.assign(step_time_s=None))

    att = pd.DataFrame([dict(attention=a, seq_len=t, saved_bytes=t * (t if a == "naive" else 1))
                        for a in ("naive", "sdpa") for t in (8, 16, 32)])
    labels = [line.get_label() for line in plots.attention_memory_chart(att).axes[0].lines]
    assert any("slope 2.00" in label for label in labels)
    assert any("slope 1.00" in label for label in labels)
    # an estimate equal to its measurement is drawn over it, not hidden under it
    lines = {line.get_label(): line for line in
             plots.attention_memory_chart(att.assign(est_bytes=att.saved_bytes), size="smoke").axes[0].lines}
    assert lines["naive: estimate"].get_zorder() > lines["naive: measured (slope 2.00)"].get_zorder()
    assert lines["naive: measured (slope 2.00)"].get_markerfacecolor() == "white"

    tl = memory_timeline(lambda: torch.ones(1000))
    assert len(plots.memory_timeline_chart({"a": tl, "b": tl}).axes) == 2
    with pytest.raises(ValueError):
        plots.memory_timeline_chart({})


# ------------------------------------------------- the library is the lesson's code (issue 13)

def _cell_source(cell_id: str, path: Path = LESSON) -> str:
    nb = json.loads(path.read_text())
    cells = [c for c in nb["cells"] if c.get("id") == cell_id]
    assert len(cells) == 1, f"{path.name} should have exactly one cell with id {cell_id!r}"
    return "".join(cells[0]["source"])


def _definitions(source: str) -> dict:
    """Top-level ``def`` and ``NAME = ...`` statements of ``source``: name -> their exact text."""
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = ast.get_source_segment(source, node)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.get_source_segment(source, node)
    return out


LIBRARY = _definitions(inspect.getsource(ck))


@pytest.mark.parametrize("cell_id, names", [
    ("segments-loop", ["run_blocks", "checkpoint_every_segment"]),
    ("sac-policy", ["aten", "SAVE", "save_matmuls_and_attention"]),
])
def test_lesson_cells_are_the_library_code_text_for_text(cell_id, names):
    cell = _definitions(_cell_source(cell_id))
    for name in names:
        assert name in cell, f"lesson 02 cell {cell_id!r} no longer defines {name}"
        assert cell[name] == LIBRARY[name], (
            f"lesson 02 cell {cell_id!r} shows a {name} that differs from "
            f"course_utils.checkpointing.{name}: make them the same text (the lesson shows the "
            "library's code)")
    if "checkpoint_every_segment" in names:
        fn = ck.checkpoint_every_segment
        assert textwrap.dedent(inspect.getsource(fn)).rstrip() == cell["checkpoint_every_segment"]
        assert "segment_bounds(" in cell["checkpoint_every_segment"]  # the library's one rule


def test_the_comparison_sees_a_drifted_cell():
    # The comparison itself can fail: the drift lesson 02 once had (an extra baddbmm) is caught.
    drifted = LIBRARY["SAVE"].replace("aten.bmm.default,", "aten.bmm.default, aten.baddbmm.default,")
    assert _definitions(drifted)["SAVE"] != LIBRARY["SAVE"]
    assert _definitions(LIBRARY["SAVE"])["SAVE"] == LIBRARY["SAVE"]


def test_checkpoint_every_segment_splits_with_segment_bounds(cfg):
    torch.manual_seed(0)
    blocks = build_model(cfg.replace(n_layers=5)).layers
    x = _x(cfg)
    order = []
    hooks = [b.register_forward_pre_hook(lambda *_, i=i: order.append(i)) for i, b in enumerate(blocks)]
    try:
        out = ck.checkpoint_every_segment(blocks, x, 2)
        forward = list(order)
        out.sum().backward()
    finally:
        for h in hooks:
            h.remove()
    recomputed = order[len(forward):]
    # segment_bounds(5, 2) == [(0, 3), (3, 5)]: backward recomputes the last segment (3, 4) first
    assert forward == [0, 1, 2, 3, 4]
    assert recomputed == [3, 4, 0, 1, 2], recomputed
    unit = x.numel() * x.element_size()
    assert saved_bytes(ck.checkpoint_every_segment, blocks, x, 2, model=blocks) == 2 * unit
    # what policy 'segments:2' keeps in the model: the same two segment inputs (+ the token ids)
    xb, yb = get_batch(cfg.batch_size, cfg.seq_len)
    model = build_model(cfg.replace(n_layers=5, checkpoint="segments:2"))
    ids = xb.numel() * xb.element_size() + cfg.seq_len * 8
    assert measure_saved(model, xb, yb).totals()["activations"] == 2 * unit + ids
    with pytest.raises(ValueError, match="n_segments"):
        ck.checkpoint_every_segment(blocks, x, 6)


def test_library_selective_policy_keeps_matmuls_and_recomputes_no_matmul(cfg):
    from torch.utils.flop_counter import FlopCounterMode
    torch.manual_seed(0)
    layers = build_model(cfg.replace(n_layers=2)).layers
    x = _x(cfg)
    kept, flops = {}, {}
    for name, fwd in (("none", exercise02.forward_plain), ("full", exercise02.forward_full),
                      ("sac", lambda b, t: exercise02.forward_selective(
                          b, t, ck.save_matmuls_and_attention))):
        kept[name] = exercise02.kept_after_forward(fwd, layers, x)
        with FlopCounterMode(display=False) as counter:
            fwd(layers, x).sum().backward()
        flops[name] = counter.get_total_flops()
    assert kept["full"] < kept["sac"] < kept["none"]
    assert flops["sac"] == flops["none"] < flops["full"]


def test_memory_budget_modes_do_not_share_a_compiled_graph(cfg, monkeypatch):
    # Two budgets in one process: each keeps its own graph (a shared dynamo cache entry made the
    # second budget silently reuse the first one's graph). Inductor's code generation is swapped
    # for AOT autograd with the same min-cut partitioner (the part that reads the budget), which
    # keeps the test to seconds.
    import torch._inductor.compile_fx as compile_fx_module
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    def partition_only(gm, example_inputs, **_):
        return aot_module_simplified(gm, example_inputs,
                                     fw_compiler=lambda g, _: make_boxed_func(g.forward),
                                     bw_compiler=lambda g, _: make_boxed_func(g.forward),
                                     partition_fn=min_cut_rematerialization_partition)

    monkeypatch.setattr(compile_fx_module, "compile_fx", partition_only)
    c = cfg.replace(n_layers=1)
    xb, yb = get_batch(c.batch_size, c.seq_len)
    keep_all = build_model(c.replace(checkpoint="memory-budget:1.0"))
    keep_least = build_model(c.replace(checkpoint="memory-budget:0.0"))
    saved_all = measure_saved(keep_all, xb, yb).totals()["activations"]
    saved_least = measure_saved(keep_least, xb, yb).totals()["activations"]
    plain = measure_saved(build_model(c), xb, yb).totals()["activations"]
    assert saved_least < saved_all / 4, (saved_least, saved_all)
    assert saved_all >= plain / 2
    assert measure_saved(keep_all, xb, yb).totals()["activations"] == saved_all  # still its own
    _, loss = keep_least(xb, yb)
    loss.backward()  # the recomputing graph trains
    assert all(p.grad is not None for p in keep_least.parameters())


# ------------------------------------------------------------- exercise 02's given helpers

def test_exercise02_helpers_count_calls_gradients_memory_and_flops(cfg):
    torch.manual_seed(0)
    blocks = build_model(cfg.replace(n_layers=3)).layers
    x = _x(cfg)
    assert exercise02.forward_calls(exercise02.forward_plain, blocks, x) == [1, 1, 1]
    assert exercise02.forward_calls(exercise02.forward_full, blocks, x) == [2, 2, 2]
    assert exercise02.forward_calls(exercise02.checkpoint_every_segment, blocks, x, 3) == [2, 2, 2]
    plain = exercise02.gradients(exercise02.forward_plain, blocks, x)
    full = exercise02.gradients(exercise02.forward_full, blocks, x)
    assert len(plain) == len(list(blocks.parameters())) + 1 and plain[-1].shape == x.shape
    for a, b in zip(plain, full):
        torch.testing.assert_close(a, b)
    assert exercise02.kept_after_forward(exercise02.forward_full, blocks, x) \
        < exercise02.kept_after_forward(exercise02.forward_plain, blocks, x)
    mm_plain = exercise02.matmul_flops(exercise02.forward_plain, blocks, x)
    mm_full = exercise02.matmul_flops(exercise02.forward_full, blocks, x)
    assert 0 < mm_plain < mm_full
    with pytest.raises(ValueError, match="require grad"):
        exercise02.gradients(exercise02.forward_plain, blocks, x.detach())
    with pytest.raises(TypeError, match="nn.ModuleList"):
        exercise02.forward_calls(exercise02.forward_plain, list(blocks), x)


# ------------------------------------------------------------------ the lesson notebook's rules

def _code_cells(path: Path = LESSON):
    nb = json.loads(path.read_text())
    return [(c["id"], "".join(c["source"])) for c in nb["cells"] if c["cell_type"] == "code"]


def test_lesson02_verdicts_come_from_the_engine_one_call_per_claim():
    calls = {}
    for cell_id, src in _code_cells():
        assert "Verdict(" not in src, f"cell {cell_id!r} builds a Verdict by hand: call verdict()"
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "verdict":
                claim = node.args[0].value
                calls.setdefault(claim, []).append(cell_id)
    assert sorted(calls) == sorted(["C4", "C5", "C6", "C7", "C8", "C14", "C15"]), calls
    assert all(len(v) == 1 for v in calls.values()), calls


def test_lesson02_chart_cells_end_with_the_chart_and_setup_plans_the_machine():
    charts = 0
    for cell_id, src in _code_cells():
        body = ast.parse(src).body
        for i, node in enumerate(body):
            call = node.value if isinstance(node, ast.Expr) else None
            func = getattr(call, "func", None)
            if isinstance(func, ast.Attribute) and getattr(func.value, "id", None) == "plots":
                charts += 1
                assert i == len(body) - 1, f"cell {cell_id!r}: a chart must be the cell's last expression"
                assert not src.rstrip().endswith(";"), f"cell {cell_id!r} hides its chart with ';'"
                if func.attr != "styled_claims":
                    assert any(k.arg == "size" for k in call.keywords), f"cell {cell_id!r}: pass size="
    assert charts >= 8
    setup = dict(_code_cells())["setup"]
    assert setup.count("use_threads()") == 1
    assert "precision=recipe.precision" in setup


def test_hugging_face_cells_run_without_transformers(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    namespace = {"torch": torch}
    for cell_id in ("hf", "hf-keeps", "hf-cache"):
        exec(compile(_cell_source(cell_id), cell_id, "exec"), namespace)
    out = capsys.readouterr().out
    assert "pip install transformers" in out and namespace["transformers"] is None
    assert namespace["cache_bytes"](None) == 0


def test_lesson02_has_one_measuring_box_and_teaches_the_segment_rule_as_its_formula():
    import nbformat
    from test_telling import machinery_share  # the issue-18 checker of lessons 03/04, the same rule
    nb = nbformat.read(LESSON, 4)
    boxes = [c for c in nb.cells if c.get("id") == "how-measured"]
    assert len(boxes) == 1 and "How this lesson measures" in boxes[0].source
    assert machinery_share(nb) <= 0.05, f"{machinery_share(nb):.1%} machinery words"
    prose = " ".join(c.source for c in nb.cells if c.cell_type == "markdown")
    # the segment rule as §4's formula gives it: sqrt(cN), one block per segment only when N <= c
    assert "√(cN)" in prose and "N ≤ c" in prose
    assert "for transformer blocks, checkpoint every block" not in prose.lower()
    assert "cannot fix" not in prose
    assert "MUST_CPU_OFFLOAD" in prose or "CPU-offload" in prose or "CPU offload" in prose


def test_the_attention_cell_says_where_its_sequence_lengths_stop():
    """§7 said the lengths stop where one block's seq x seq matrices pass 1 GiB; at the cpu size
    they stop at 8T (128 MiB), and only the h100 size is cut by that cap."""
    import contextlib
    import io
    from types import SimpleNamespace
    body = ast.parse(_cell_source("attention")).body
    head = ast.Module([n for n in body[:3]], [])  # candidates, lengths, the sentence
    for size, capped in (("cpu", False), ("h100", True)):
        c = config_for(size)
        ns = {"T": c.seq_len, "B": c.batch_size, "cfg": SimpleNamespace(n_heads=c.n_heads)}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(head, "attention", "exec"), ns)
        lengths = ns["lengths"]
        assert all(c.batch_size * c.n_heads * L * L * 4 <= 2**30 for L in lengths)
        assert (len(lengths) < len(ns["candidates"])) == capped, size
        assert f"{lengths[0]} to {lengths[-1]}" in out.getvalue()
        assert ("would pass 1 GiB" in out.getvalue()) == capped, out.getvalue()
    md = next(c for c in json.loads(LESSON.read_text())["cells"] if c.get("id") == "s7")
    assert "stop where one block's seq × seq matrices would pass 1 GiB" not in "".join(md["source"])


def test_the_reentrant_cell_comments_a_will_raise_that_did_not_happen(cfg, capsys):
    import warnings
    ns = {"torch": torch, "checkpoint": torch.utils.checkpoint.checkpoint, "warnings": warnings,
          "build_model": build_model, "cfg": cfg, "B": cfg.batch_size, "T": cfg.seq_len,
          "d": cfg.d_model, "device": "cpu"}
    exec(compile(_cell_source("reentrant-default"), "reentrant-default", "exec"), ns)
    out = capsys.readouterr().out
    promised = any("will raise" in str(w.message) for w in ns["caught"])
    ran = ns["outcome"].startswith("ran")
    assert ("has not happened in torch" in out) == (promised and ran), out
