"""course_utils.formats: what fp32, fp16, bf16 and FP8 represent (read from torch.finfo), bit
layouts, casts, log2 histograms and underflow statistics, and the fp32 matmul settings."""
import math

import pytest
import torch

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


# ---------------------------------------------------------------- gradients


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


def test_underflow_table_names_the_loss_scale_in_korean_and_keeps_its_numbers(monkeypatch):
    """Issue 28: the row a Korean learner reads says 손실 (loss) in Korean; the counts and the
    columns the code reads are the English run's."""
    groups = {"a": torch.tensor([FP16_SUB / 4, 1.0])}
    cases = [("fp16", 1), ("fp16", 2.0 ** 16), ("fp16", 1000.0)]
    english = underflow_table(groups, cases)
    monkeypatch.setenv("COURSE_LANG", "ko")
    korean = underflow_table(groups, cases)
    assert list(korean.index.get_level_values("stored as")) == [
        "fp16", "fp16, 손실 x 2^16", "fp16, 손실 x 1000"]
    assert list(korean.columns) == list(english.columns)
    assert (korean.to_numpy() == english.to_numpy()).all()
    with pytest.raises(ValueError, match="^log2_histogram에는 0이 아닌 유한한 값이"):
        log2_histogram(torch.zeros(3))
