"""Unit tests of lesson 01's tools: number formats (course_utils.formats), the op dtype recorder
(course_utils.autocast_ops), gradient capture (course_utils.gradients), and lesson 01's charts."""
import math

import pandas as pd
import pytest
import torch

from course_utils import plots
from course_utils.autocast_ops import OpDtypeRecorder
from course_utils.config import config_for
from course_utils.data import get_batch
from course_utils.formats import (
    FORMATS,
    bits,
    cast_table,
    format_info,
    format_table,
    log2_histogram,
    resolve_dtype,
    underflow_stats,
    underflow_table,
)
from course_utils.gradients import capture_gradients
from course_utils.models import build_model
from course_utils.saved_tensors import SavedTensorMeter, measure_saved
from course_utils.terms import short_dtype

FP16_SUB = 2.0 ** -24          # fp16's smallest subnormal (IEEE 754 binary16)


# ---------------------------------------------------------------- number formats

def test_format_table_matches_ieee_layouts():
    t = format_table()
    assert list(t.index) == list(FORMATS)
    expect = {"fp32": (8, 23), "fp16": (5, 10), "bf16": (8, 7)}
    if "fp8 e4m3" in FORMATS:
        expect.update({"fp8 e4m3": (4, 3), "fp8 e5m2": (5, 2)})
    for name, (e, m) in expect.items():
        assert (t.loc[name, "exponent bits"], t.loc[name, "mantissa bits"]) == (e, m), name
    full = format_table(detail=True)
    for name in expect:
        assert full.loc[name, "sign"] + full.loc[name, "exponent bits"] \
            + full.loc[name, "mantissa bits"] == full.loc[name, "bits"]
    assert len(t.columns) <= 7 < len(full.columns)
    assert t.loc["fp16", "max"] == 65504.0
    assert t.loc["fp16", "smallest normal"] == 2.0 ** -14
    assert t.loc["fp16", "smallest subnormal"] == FP16_SUB
    assert t.loc["bf16", "smallest normal"] == t.loc["fp32", "smallest normal"]
    if "fp8 e4m3" in FORMATS:
        assert t.loc["fp8 e4m3", "max"] == 448.0
        assert t.loc["fp8 e5m2", "max"] == 57344.0
    assert t.loc["fp32", "decimal digits"] == pytest.approx(24 * math.log10(2))


@pytest.mark.parametrize("name", list(FORMATS))
def test_smallest_subnormal_is_the_real_limit(name):
    info = format_info(name)
    sub = torch.tensor([info.smallest_subnormal], dtype=torch.float64)
    assert sub.to(info.dtype).double().item() == info.smallest_subnormal
    # Half of it is a tie that rounds to even, i.e. to 0; a quarter surely does.
    assert (sub / 4).to(info.dtype).double().item() == 0.0
    assert torch.tensor([info.max]).to(info.dtype).float().item() == info.max


def test_resolve_dtype_and_errors():
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype("half") is torch.float16
    assert resolve_dtype(torch.float32) is torch.float32
    with pytest.raises(ValueError, match="unknown number format"):
        resolve_dtype("fp12")
    with pytest.raises(ValueError, match="not a floating-point"):
        resolve_dtype(torch.int32)
    with pytest.raises(ValueError):
        format_table(["fp16", "int8"])
    assert short_dtype(torch.bfloat16) == "bf16" and short_dtype(torch.int64) == "int64"


def test_bits_layouts():
    assert bits(1.0, "fp16") == "0 01111 0000000000"
    assert bits(-2.0, "bf16") == "1 10000000 0000000"
    assert bits(1.0, "fp32") == "0 01111111 " + "0" * 23
    assert bits(70000, "fp16") == "0 11111 0000000000"          # inf
    assert bits(FP16_SUB, "fp16") == "0 00000 0000000001"       # smallest subnormal
    assert bits(1 + 2 ** -10, "fp16").endswith("0000000001")
    assert bits(1 + 2 ** -10, "bf16") == bits(1.0, "bf16")       # below bf16's eps
    if "fp8 e4m3" in FORMATS:
        assert bits(448, "fp8 e4m3") == "0 1111 110"


def test_cast_table_rounds_like_torch():
    t = cast_table([257, 70000, 1e-8], formats=["fp16", "bf16"])
    assert list(t.columns) == ["fp16", "fp16 bits", "bf16", "bf16 bits"]
    assert t.loc["257", "fp16"] == "257" and t.loc["257", "bf16"] == "256"
    assert t.loc["70000", "fp16"] == "inf"
    assert t.loc["1e-08", "fp16"] == "0"
    assert float(t.loc["1e-08", "bf16"]) == pytest.approx(1e-8, rel=1e-2)


# ---------------------------------------------------------------- op dtypes under autocast

class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.ln(x))


def test_recorder_sees_autocast_dtypes_and_modules():
    torch.manual_seed(0)
    m, x = _Tiny(), torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = m(x)
    with OpDtypeRecorder(m) as rec, torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(x)
    assert torch.equal(out, expected)            # the hooks do not change outputs
    t = rec.table()
    ln = t[t["op"] == "native_layer_norm"]
    assert list(ln["module"]) == ["ln"] and ln["output"].iloc[0].startswith("fp32")
    mm = t[t["op"] == "addmm"]
    assert list(mm["module"]) == ["fc"] and list(mm["output"]) == ["bf16"]
    casts = t[t["op"] == "_to_copy"]
    assert sorted(casts["note"]) == ["cast of a weight", "cast of a weight",
                                     "cast of an activation"]   # weight, bias, LN output
    assert "view" not in set(t["op"]) and "t" not in set(t["op"])
    assert "t" in set(rec.table(views=True)["op"])
    s = rec.summary()
    assert s.loc["addmm", "bf16"] == 1 and s.loc["_to_copy (weight)", "bf16"] == 2
    # After the with-block the hooks are gone: nothing more is recorded.
    n = len(rec.records)
    m(x)
    assert len(rec.records) == n and not m._forward_hooks and not m.fc._forward_pre_hooks


def test_recorder_weight_cast_cache_on_the_course_model():
    cfg = config_for("smoke")
    model = build_model(cfg)
    x, y = get_batch(cfg.batch_size, cfg.seq_len)
    n_linear = sum(isinstance(mod, torch.nn.Linear) for mod in model.modules())
    n_bias = sum(isinstance(mod, torch.nn.Linear) and mod.bias is not None
                 for mod in model.modules())

    def casts(two_regions):
        with OpDtypeRecorder(model) as rec:
            for _ in range(2):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    model(x, y)
                if not two_regions:
                    break
        return sum(r.op == "_to_copy" and r.reads_parameter for r in rec.records)

    assert casts(False) == n_linear + n_bias
    assert casts(True) == 2 * (n_linear + n_bias)


def test_recorder_without_model():
    a = torch.ones(2, dtype=torch.float16)
    with OpDtypeRecorder() as rec:
        a + 1
    t = rec.table()
    assert list(t["op"]) == ["add"] and t["module"].iloc[0] == "" and t["output"].iloc[0] == "fp16"


# ---------------------------------------------------------------- gradients

def test_capture_gradients_matches_autograd():
    torch.manual_seed(0)
    m, x = _Tiny(), torch.randn(5, 8)
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
    m, x = _Tiny(), torch.randn(50, 8)
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
    m = _Tiny()
    for p in m.parameters():
        p.grad = None
    with pytest.raises(ValueError, match="no gradients"):
        with capture_gradients(m):
            m(torch.randn(2, 8))


def test_log2_histogram_bins_exactly():
    v = torch.tensor([1.0, 1.5, 0.999, 2.0, -3.0, 0.0, 0.0, 2.0 ** -149, float("inf")])
    h = log2_histogram(v)
    assert h.attrs["zeros"] == 2
    assert h.loc[0] == 2 and h.loc[-1] == 1 and h.loc[1] == 2 and h.loc[-149] == 1
    assert int(h.sum()) == 6                    # inf and zeros are not binned
    clipped = log2_histogram(v, lo=-2, hi=0)
    assert list(clipped.index) == [-2, -1, 0]
    assert clipped.loc[-2] == 1 and clipped.loc[0] == 4   # ends collect the out-of-range values
    with pytest.raises(ValueError):
        log2_histogram(torch.zeros(3))
    with pytest.raises(ValueError):
        log2_histogram(v, lo=2, hi=1)


def test_underflow_stats_counts_flush_subnormal_overflow():
    v = torch.tensor([FP16_SUB, FP16_SUB / 4, 1e-3, 1e5, 0.0])
    st = underflow_stats(v, "fp16")
    assert st["n"] == 5 and st["nonzero"] == 4
    assert st["flushed"] == 0.25 and st["subnormal"] == 0.25 and st["overflow"] == 0.25
    scaled = underflow_stats(v, "fp16", scale=2.0 ** 10)
    assert scaled["flushed"] == 0.0 and scaled["overflow"] == 0.25
    assert underflow_stats(v, "bf16")["flushed"] == 0.0
    assert underflow_stats(torch.zeros(3), "fp16")["flushed"] == 0.0
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError):
            underflow_stats(v, "fp16", scale=bad)


def test_underflow_table_layout():
    groups = {"a": torch.tensor([FP16_SUB / 4, 1.0]), "b": torch.tensor([1.0])}
    t = underflow_table(groups, [("fp16", 1), ("fp16", 2.0 ** 16), ("bf16", 1)])
    assert len(t) == 6
    assert list(t.columns) == ["nonzero values", "flushed to 0 (%)", "subnormal (%)",
                               "overflow (%)"]
    assert list(dict.fromkeys(t.index.get_level_values("stored as"))) == [
        "fp16", "fp16, loss x 2^16", "bf16"]
    assert t.loc[("fp16", "a"), "flushed to 0 (%)"] == 50.0
    assert t.loc[("fp16, loss x 2^16", "b"), "overflow (%)"] == 100.0   # 65536 > fp16's max
    assert t.loc[("fp16", "a"), "nonzero values"] == 2
    assert underflow_table(groups, [("fp16", 1000.0)]).index[0][0] == "fp16, loss x 1000"
    with pytest.raises(ValueError):
        underflow_table({}, [("fp16", 1)])
    with pytest.raises(ValueError):
        underflow_table(groups, [])


def test_saved_bytes_by_dtype_add_up_to_the_meter():
    cfg = config_for("smoke")
    model = build_model(cfg)
    x, y = get_batch(cfg.batch_size, cfg.seq_len)
    meter = measure_saved(model, x, y, "bf16")
    t = meter.by_dtype()
    totals = meter.totals()
    for bucket, n in totals.items():
        assert t.loc[bucket, "bytes"].sum() == n
    acts = t.loc["activations"]
    # bf16 autocast leaves part of the saved activations in fp32 (residual stream, LayerNorm).
    assert acts.loc["bf16", "bytes"] > 0 and acts.loc["fp32", "bytes"] > 0
    assert set(t.loc["autocast_weight_copies"].index) == {"bf16"}
    with pytest.raises(ValueError):
        SavedTensorMeter(model).by_dtype()


# ---------------------------------------------------------------- lesson 01 charts

def _axes(fig):
    return [ax for ax in fig.axes if ax.get_visible()]


def test_format_range_chart_one_bar_pair_per_format():
    fig = plots.format_range_chart(format_table())
    ax = _axes(fig)[0]
    assert len(ax.patches) == 2 * len(FORMATS)
    assert [t.get_text() for t in ax.get_yticklabels()] == list(FORMATS)[::-1]
    with pytest.raises(ValueError):
        plots.format_range_chart(pd.DataFrame({"max": [1.0]}))


def test_log2_histogram_chart_panels_and_errors():
    h = {"g": log2_histogram(torch.tensor([1e-9, 1e-5, 1e-3]))}
    fig = plots.log2_histogram_chart(h, "fp16", scale=2.0 ** 16)
    assert len(_axes(fig)) == 1
    two = plots.log2_histogram_chart({"a": h["g"], "b": h["g"]})
    assert len(_axes(two)) == 2
    with pytest.raises(ValueError):
        plots.log2_histogram_chart({})
    with pytest.raises(ValueError):
        plots.log2_histogram_chart(h, scale=-1.0)


def test_scaler_trace_chart_accepts_series_and_checks_lengths():
    steps = pd.Series([1, 2, 3])
    fig = plots.scaler_trace_chart(steps, [4.0, 2.0, 2.0], skipped=steps[steps == 2],
                                   injected=[2])
    assert _axes(fig)[0].get_yscale() == "log"
    with pytest.raises(ValueError):
        plots.scaler_trace_chart([1, 2], [1.0])


def test_memory_breakdown_and_loss_charts():
    row = {"label": "fp32", "peak_allocated": 100 * 2**20}
    for k in ("parameters", "gradients", "optimizer_state", "activations",
              "autocast_weight_copies", "logits"):
        row[k] = row["est_" + k] = 10 * 2**20
    fig = plots.memory_breakdown_chart(pd.DataFrame([row, dict(row, label="bf16")]))
    assert len(_axes(fig)[0].patches) == 2 * 2 * 6     # 2 configs x (measured, estimate) x 6 parts
    with pytest.raises(ValueError):
        plots.memory_breakdown_chart(pd.DataFrame())
    fig = plots.loss_curves_chart({"a": ([0, 10, 20], [5.0, 3.0, 2.5])})
    assert len(_axes(fig)) == 2
    with pytest.raises(ValueError):
        plots.loss_curves_chart({"a": ([0, 1], [5.0])})
    with pytest.raises(ValueError):
        plots.loss_curves_chart({})


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


def test_fp32_matmul_settings_and_tf32_probe_off_ampere():
    from course_utils.formats import fp32_matmul_settings, tf32_probe
    s = fp32_matmul_settings()
    assert set(s) == {"float32_matmul_precision", "cuda_matmul_tf32", "cudnn_tf32"}
    assert s["float32_matmul_precision"] in ("highest", "high", "medium")
    assert tf32_probe("cpu") is None          # TF32 is an Ampere+ GPU feature
    with pytest.raises(ValueError):
        tf32_probe("cpu", n=0)
    assert torch.get_float32_matmul_precision() == s["float32_matmul_precision"]
