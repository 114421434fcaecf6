"""course_utils.formats' scaled low-precision formats (lesson 04 §4): rounding to a format, FP8
with a scale per tensor or per row, MXFP8 (OCP MX v1.0) and NVFP4, checked against hand-computed
cases and against torch's own casts."""
import math

import pytest
import torch

from course_utils.formats import (
    RECIPES,
    SPEC_FORMATS,
    fake_quantize,
    format_info,
    layout_table,
    mx_scale_exponents,
    quantization_error,
    quantization_table,
    round_to_format,
)


def test_round_to_format_equals_torchs_saturated_casts():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(20_000, generator=g) * 10, torch.randn(2_000, generator=g) * 1e-3,
                   torch.randn(2_000, generator=g) * 1e-6,
                   torch.tensor([0.0, -0.0, 2.0 ** -10, 3 * 2.0 ** -11, 447.0, 449.0, 1e9])])
    for fmt, dtype in (("fp8 e4m3", torch.float8_e4m3fn), ("fp8 e5m2", torch.float8_e5m2),
                       ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        top = format_info(fmt).max
        expected = x.clamp(-top, top).to(dtype).float()
        assert torch.equal(round_to_format(x, fmt), expected), fmt


def test_e2m1_rounds_to_nearest_even_and_saturates():
    """The E2M1 grid is 0, 0.5, 1, 1.5, 2, 3, 4, 6 (OCP MX v1.0 section 5.3.3); a tie goes to
    the value whose mantissa bit is 0."""
    x = torch.tensor([0.25, 0.3, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, -0.7, 0.2])
    want = [0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -0.5, 0.0]
    assert round_to_format(x, "fp4 e2m1").tolist() == want


def test_the_spec_formats_and_the_layout_table():
    e8m0, e2m1 = SPEC_FORMATS["e8m0"], SPEC_FORMATS["fp4 e2m1"]
    assert (e8m0.sign_bits, e8m0.exponent_bits, e8m0.mantissa_bits) == (0, 8, 0)
    assert (e8m0.max, e8m0.smallest_normal) == (2.0 ** 127, 2.0 ** -127)
    if e8m0.dtype is not None:           # torch's own E8M0 dtype agrees with the spec
        fi = torch.finfo(e8m0.dtype)
        assert (fi.max, fi.smallest_normal) == (e8m0.max, e8m0.smallest_normal)
    assert e2m1.sign_bits + e2m1.exponent_bits + e2m1.mantissa_bits == e2m1.bits == 4
    t = layout_table(["bf16", "fp8 e4m3", "fp8 e5m2", "e8m0", "fp4 e2m1"])
    assert len(t.columns) <= 6
    assert list(t["max"]) == ["3.4e+38", "448", "57,344", "1.7e+38", "6"]
    assert list(t["smallest normal"]) == ["2^-126", "2^-6", "2^-14", "2^-127", "2^0"]
    assert list(t["eps"]) == ["2^-7", "2^-3", "2^-2", "2^0", "2^-1"]
    with pytest.raises(ValueError, match="scale format"):
        round_to_format(torch.ones(2), "e8m0")


def one_block_with_an_outlier():
    """32 values: an outlier 1000, ten of 0.001, ten of 0.003 and eleven of 1.0."""
    return torch.tensor([1000.0] + [0.001] * 10 + [0.003] * 10 + [1.0] * 11)


def test_mxfp8_one_block_with_an_outlier_by_hand():
    """amax 1000: floor(log2 1000) = 9, E4M3's largest power of two is 2^8, so the shared scale
    is X = 2^(9 - 8) = 2. Then 1000 / 2 = 500 saturates to 448 (read back 896); 0.001 / 2 is
    below 2^-10, half of E4M3's smallest subnormal 2^-9, and flushes to 0; 0.003 / 2 = 0.0015
    rounds to 2^-9 (read back 2^-8); 1.0 / 2 is exact."""
    block = one_block_with_an_outlier()
    assert mx_scale_exponents(block).tolist() == [1]
    q = fake_quantize(block, "MXFP8")
    assert q[0].item() == 896.0
    assert q[1:11].eq(0).all() and q[11:21].eq(2.0 ** -8).all() and q[21:].eq(1.0).all()
    assert quantization_error(block, "MXFP8")["flushed"] == pytest.approx(10 / 32)


def test_an_outlier_spoils_only_its_own_block():
    """The same values twice: block 1 with the outlier, block 2 without. MXFP8 gives block 2
    its own scale (amax 1.0: X = 2^-8) and keeps its small values; one scale for the whole
    tensor (448 / 1000) flushes the 0.001s of both blocks."""
    block = one_block_with_an_outlier()
    two = torch.stack([block, torch.cat([torch.tensor([1.0]), block[1:]])])
    assert mx_scale_exponents(two).flatten().tolist() == [1, -8]
    mx, whole = fake_quantize(two, "MXFP8"), fake_quantize(two, "e4m3 tensorwise")
    assert mx[1, 1:11].ne(0).all() and mx[0, 1:11].eq(0).all()
    assert whole[:, 1:11].eq(0).all()
    rowwise = fake_quantize(two, "e4m3 rowwise")   # one power-of-two scale per row: 448 / 1 -> 256
    assert rowwise[1, 1:11].ne(0).all() and rowwise[0, 1:11].eq(0).all()


def test_mx_scales_of_zero_and_tiny_blocks_stay_in_e8m0s_range():
    x = torch.zeros(2, 32)
    x[1, 0] = 2.0 ** -140
    assert mx_scale_exponents(x).flatten().tolist() == [-127, -127]
    assert fake_quantize(x, "MXFP8")[0].eq(0).all()


def test_nvfp4_two_level_scales_by_hand():
    """Tensor amax 6: the per-tensor scale is 6 / (448 x 6) = 1/448. Block 1 (amax 6): block
    scale 6 / 6 / (1/448) = 448, exact in E4M3, so values are divided by 1 and rounded to E2M1.
    Block 2 (amax 0.6): 0.6 / 6 x 448 = 44.8 rounds to 44 in E4M3 (steps of 4 in [32, 64)), so
    the scale is 44/448 and 0.6 / (44/448) = 6.11 saturates to 6."""
    b1 = torch.tensor([6.0, 3.0, 1.0, 0.1, 0.3, 0.75, 5.0, 2.5] + [0.0] * 8)
    b2 = torch.tensor([0.6] + [0.0] * 15)
    q = fake_quantize(torch.cat([b1, b2]), "NVFP4")
    assert q[:8].tolist() == [6.0, 3.0, 1.0, 0.0, 0.5, 1.0, 4.0, 2.0]
    assert q[16].item() == pytest.approx(6 * 44 / 448)
    assert fake_quantize(torch.zeros(16), "NVFP4").eq(0).all()


def test_without_a_scale_small_gradients_flush_and_a_scale_rescues_them():
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(64, 256, generator=g) * 1e-5          # all far below 2^-10
    assert quantization_error(grad, "e4m3 unscaled") == {"relative_error": 1.0, "flushed": 1.0}
    for name in ("e4m3 tensorwise", "e4m3 rowwise", "MXFP8"):
        err = quantization_error(grad, name)
        assert err["flushed"] < 0.01 and err["relative_error"] < 0.05, name
    bf16 = quantization_error(grad, "bf16")["relative_error"]
    assert bf16 < quantization_error(grad, "e4m3 tensorwise")["relative_error"]


def test_quantization_table_layout_and_bad_input():
    x = {"a": torch.randn(4, 32), "b": torch.randn(8, 64)}
    t = quantization_table(x)
    assert list(t.index.names) == ["recipe", "tensor"]
    assert list(t.columns) == ["bits per value", "relative error", "flushed to 0 (%)"]
    assert len(t) == 2 * len(RECIPES)
    assert t.loc[("MXFP8", "a"), "bits per value"] == 8.25
    assert t.loc[("NVFP4", "b"), "bits per value"] == 4.5
    with pytest.raises(ValueError, match="divisible by 32"):
        fake_quantize(torch.randn(4, 48), "MXFP8")
    with pytest.raises(ValueError, match="unknown recipe"):
        fake_quantize(torch.randn(4, 32), "int8")
    with pytest.raises(ValueError, match="inf or NaN"):
        fake_quantize(torch.tensor([math.inf] * 32), "MXFP8")
    with pytest.raises(ValueError, match="floating-point tensor"):
        fake_quantize(torch.ones(32, dtype=torch.int64), "MXFP8")
    with pytest.raises(ValueError, match="at least one tensor"):
        quantization_table({})
