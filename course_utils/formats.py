"""Number formats (lessons 01 and 04): what each format can represent (from ``torch.finfo``),
what storing values in it does, with or without a loss scale, and FP8 training's scaled formats
emulated in plain torch (`RECIPES`, `fake_quantize`).

A value is ``(-1)^s x 2^(e - bias) x 1.m`` (normal) or ``(-1)^s x 2^(1 - bias) x 0.m``
(subnormal); with ``p`` mantissa bits, eps is ``2^-p`` and the smallest subnormal is
``smallest_normal x 2^-p`` (IEEE 754-2019 section 3.3). Sources: Micikevicius et al. 2022, "FP8
Formats for Deep Learning" (arXiv 2209.05433); torchao's float8 training recipes; the OCP
Microscaling Formats (MX) Specification v1.0; NVIDIA's NVFP4.

Over 400 lines because it is one concern, number formats, from a plain cast (lesson 01) to the
scaled formats (lesson 04), on one rounding rule (`round_to_format`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch

from .fp32_matmul import tf32_probe  # lesson 03 imports it from here
from .i18n import tr
from .terms import PRECISION_DTYPES, short_dtype

__all__ = ["FORMATS", "SPEC_FORMATS", "FormatInfo", "resolve_dtype", "format_info", "format_table",
           "layout_table", "bits", "cast_table", "log2_histogram", "underflow_stats", "underflow_table",
           "tf32_probe", "Recipe", "RECIPES", "round_to_format", "mx_scale_exponents", "fake_quantize",
           "quantization_error", "quantization_table"]

#: The formats lesson 01 compares, by the course's short name (FP8 only where torch has it).
FORMATS: dict[str, torch.dtype] = {p: PRECISION_DTYPES[p] for p in ("fp32", "fp16", "bf16")} | {
    name: getattr(torch, dt) for name, dt in (("fp8 e4m3", "float8_e4m3fn"), ("fp8 e5m2", "float8_e5m2"))
    if hasattr(torch, dt)}

_ALIASES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16,
            "half": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
            "fp64": torch.float64}


def resolve_dtype(fmt) -> torch.dtype:
    """A floating-point ``torch.dtype`` from a dtype or a name (``"fp16"``, ``"float16"``, ...).

    Raises:
        ValueError: an unknown name, or a dtype that is not floating point.
    """
    names = FORMATS | _ALIASES
    dt = fmt if isinstance(fmt, torch.dtype) else names.get(fmt) if isinstance(fmt, str) else None
    if dt is None:
        raise ValueError(tr("unknown number format {fmt!r}: expected a floating torch.dtype or "
                            "one of {names}.", fmt=fmt, names=", ".join(names)))
    if not dt.is_floating_point:
        raise ValueError(tr("{dtype} is not a floating-point dtype.", dtype=dt))
    return dt


@dataclass(frozen=True)
class FormatInfo:
    """What one floating-point format can represent: its short ``name``, ``dtype`` (None for
    E2M1), bit counts (``mantissa_bits``: stored fraction bits), ``eps``, the largest finite
    ``max``, ``smallest_normal``, ``smallest_subnormal`` and ``decimal_digits``
    (``(mantissa_bits + 1) x log10(2)``)."""

    name: str
    dtype: torch.dtype | None
    bits: int
    sign_bits: int
    exponent_bits: int
    mantissa_bits: int
    eps: float
    max: float
    smallest_normal: float
    smallest_subnormal: float
    decimal_digits: float


#: The MX spec v1.0 formats ``torch.finfo`` does not describe: E8M0, the block scale (no sign or
#: mantissa, bias 127: 2^-127 to 2^127; section 5.4.1), and E2M1, the FP4 element of MXFP4 and
#: NVFP4 (bias 1: 0, 0.5, 1, 1.5, 2, 3, 4, 6; no inf or NaN; section 5.3.3).
SPEC_FORMATS: dict[str, FormatInfo] = {
    "e8m0": FormatInfo(name="e8m0", dtype=getattr(torch, "float8_e8m0fnu", None), bits=8,
                       sign_bits=0, exponent_bits=8, mantissa_bits=0, eps=1.0, max=2.0 ** 127,
                       smallest_normal=2.0 ** -127, smallest_subnormal=2.0 ** -127,
                       decimal_digits=math.log10(2)),
    "fp4 e2m1": FormatInfo(name="fp4 e2m1", dtype=None, bits=4, sign_bits=1, exponent_bits=2,
                           mantissa_bits=1, eps=0.5, max=6.0, smallest_normal=1.0,
                           smallest_subnormal=0.5, decimal_digits=2 * math.log10(2)),
}


def format_info(fmt) -> FormatInfo:
    """The `FormatInfo` of a format name or floating dtype (``torch.finfo``, or `SPEC_FORMATS`).

    Raises:
        ValueError: not a floating-point format (see `resolve_dtype`).
    """
    if isinstance(fmt, str) and fmt in SPEC_FORMATS:
        return SPEC_FORMATS[fmt]
    dt = resolve_dtype(fmt)
    fi = torch.finfo(dt)
    mant = int(round(-math.log2(fi.eps)))
    name = next((n for n, d in FORMATS.items() if d == dt), short_dtype(dt))
    return FormatInfo(name=name, dtype=dt, bits=fi.bits, sign_bits=1,
                      exponent_bits=fi.bits - 1 - mant, mantissa_bits=mant, eps=float(fi.eps),
                      max=float(fi.max), smallest_normal=float(fi.smallest_normal),
                      smallest_subnormal=float(fi.smallest_normal) * float(fi.eps),
                      decimal_digits=(mant + 1) * math.log10(2))


def format_table(formats=None, detail: bool = False) -> pd.DataFrame:
    """One row per format (default: all of `FORMATS`), indexed by name: the `FormatInfo` fields
    from ``exponent bits`` to ``decimal digits``; ``detail=True`` adds ``dtype``, ``bits``, ``sign``.

    Raises:
        ValueError: a name that is not a floating-point format.
    """
    infos = [format_info(f) for f in (formats if formats is not None else FORMATS)]
    rows = [{"format": i.name,
             **({"dtype": str(i.dtype).replace("torch.", ""), "bits": i.bits, "sign": i.sign_bits}
                if detail else {}),
             "exponent bits": i.exponent_bits, "mantissa bits": i.mantissa_bits, "eps": i.eps,
             "max": i.max, "smallest normal": i.smallest_normal,
             "smallest subnormal": i.smallest_subnormal, "decimal digits": i.decimal_digits}
            for i in infos]
    return pd.DataFrame(rows).set_index("format")


def layout_table(formats) -> pd.DataFrame:
    """The formats side by side, one row each in the order given: ``bits``, ``exponent bits``,
    ``mantissa bits``, ``max`` (``65,504``; two figures from a million), ``smallest normal`` and
    ``eps`` as powers of two (``"2^-6"``).

    Raises:
        ValueError: a name that is not a format (`format_info`).
    """
    rows = {i.name: {"bits": i.bits, "exponent bits": i.exponent_bits,
                     "mantissa bits": i.mantissa_bits,
                     "max": f"{i.max:,.0f}" if i.max < 1e6 else f"{i.max:.2g}",
                     "smallest normal": f"2^{round(math.log2(i.smallest_normal))}",
                     "eps": f"2^{round(math.log2(i.eps))}"}
            for i in [format_info(f) for f in formats]}
    return pd.DataFrame.from_dict(rows, orient="index")


_INT_OF_WIDTH = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


def bits(x: float, fmt) -> str:
    """The bit pattern of ``x`` cast to ``fmt`` (torch's cast: ties to even; beyond
    ``float8_e4m3fn``'s max, NaN): ``bits(1.0, "fp16") == "0 01111 0000000000"``.

    Raises:
        ValueError: an unknown format.
    """
    info = format_info(fmt)
    t = torch.tensor([float(x)], dtype=torch.float64).to(info.dtype)
    word = int(t.view(_INT_OF_WIDTH[info.bits]).item()) & ((1 << info.bits) - 1)
    s = format(word, f"0{info.bits}b")
    e = info.exponent_bits
    return f"{s[0]} {s[1:1 + e]} {s[1 + e:]}"


def cast_table(values, formats=("fp32", "fp16", "bf16")) -> pd.DataFrame:
    """Each value (a row) cast to each format: columns ``<fmt>`` (the stored value, 10
    significant digits) and ``<fmt> bits``.

    Raises:
        ValueError: an unknown format.
    """
    dts = [(format_info(f).name, resolve_dtype(f)) for f in formats]
    rows = []
    for v in values:
        row = {"value": f"{float(v):.10g}"}
        for name, dt in dts:
            stored = torch.tensor([float(v)], dtype=torch.float64).to(dt).double().item()
            row[name] = f"{stored:.10g}"
            row[f"{name} bits"] = bits(v, dt)
        rows.append(row)
    return pd.DataFrame(rows).set_index("value")


def round_to_format(x: torch.Tensor, fmt) -> torch.Tensor:
    """``x`` rounded to the nearest value of ``fmt``, saturating at its max (as FP8 training's
    casts do), in fp32: torch's cast within range, and also for ``"fp4 e2m1"``. The value is
    ``round(|x| / q) x q``, ``q = 2^(e - mantissa_bits)``, ``e`` the exponent of ``|x|`` but at
    least the smallest normal's (IEEE 754-2019 section 4.3.1, roundTiesToEven).

    Raises:
        ValueError: an unknown format, E8M0 (a scale format: `mx_scale_exponents`), or ``x``
            not a floating tensor of finite values.
    """
    info = format_info(fmt)
    if info.sign_bits == 0:
        raise ValueError(tr("{name} is a scale format (powers of two, no sign): see "
                            "mx_scale_exponents.", name=info.name))
    x = _finite_float(x)
    a = x.abs().clamp(max=info.max)
    e = (torch.frexp(a).exponent - 1).float()                    # floor(log2 |x|), exact
    e = e.clamp(min=math.log2(info.smallest_normal))             # subnormals share the lowest step
    step = torch.exp2(e - info.mantissa_bits)
    return torch.copysign((torch.round(a / step) * step).clamp(max=info.max), x)


def _finite_float(x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(tr("expected a floating-point tensor, got {type}.", type=type(x).__name__))
    x = x.detach().float()
    if not bool(torch.isfinite(x).all()):
        raise ValueError(tr("the tensor holds inf or NaN: scaled formats need finite values."))
    return x


@dataclass(frozen=True)
class Recipe:
    """One way of storing a tensor in a low-precision format (`RECIPES`): each value in
    ``element`` (a `format_info` name), one scale per ``granularity`` (``"none"``, ``"tensor"``,
    ``"row"`` of the last dimension, or ``"block"`` of ``block`` values of it) stored as
    ``scale``, ``bits_per_value`` counting a block scale's share, and the ``source``."""

    name: str
    element: str
    granularity: str
    scale: str
    bits_per_value: float
    source: str
    block: int | None = None


#: The recipes lesson 04 compares, by name.
RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("bf16", "bf16", "none", "none", 16, "a plain cast (autocast's low precision)"),
    Recipe("e4m3 unscaled", "fp8 e4m3", "none", "none", 8, "a plain cast"),
    Recipe("e4m3 tensorwise", "fp8 e4m3", "tensor", "fp32", 8,
           "torchao float8 'tensorwise' (its default; inputs and weights): scale = 448 / amax"),
    Recipe("e5m2 tensorwise", "fp8 e5m2", "tensor", "fp32", 8,
           "torchao float8 'tensorwise' for gradients: scale = 57344 / amax"),
    Recipe("e4m3 rowwise", "fp8 e4m3", "row", "power of two", 8,
           "torchao float8 'rowwise' (every tensor E4M3): scale = 448 / amax of the row, "
           "rounded down to a power of two"),
    Recipe("MXFP8", "fp8 e4m3", "block", "e8m0", 8 + 8 / 32,
           "OCP MX v1.0 section 6.3: X = 2^(floor(log2 amax) - 8) per 32 values, elements "
           "V / X saturated to E4M3", block=32),
    Recipe("NVFP4", "fp4 e2m1", "block", "e4m3 x fp32", 4 + 8 / 16,
           "NVIDIA NVFP4 (torchao nvfp4_quantize): s = amax / (448 x 6) per tensor, per 16 "
           "values E4M3(amax_block / 6 / s) x s, elements V / scale saturated to E2M1",
           block=16),
)}


def _recipe(recipe) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    if recipe not in RECIPES:
        raise ValueError(tr("unknown recipe {recipe!r}: expected one of {names}.", recipe=recipe,
                            names=", ".join(RECIPES)))
    return RECIPES[recipe]


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.dim() == 0 or x.shape[-1] % block:
        raise ValueError(tr("a block format needs the last dimension divisible by {block}; this "
                            "tensor's shape is {shape}.", block=block, shape=tuple(x.shape)))
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)


def mx_scale_exponents(x: torch.Tensor, element: str = "fp8 e4m3", block: int = 32) -> torch.Tensor:
    """The ``k`` of each block's shared E8M0 scale ``2^k`` (``block`` values of the last
    dimension, which it divides): ``floor(log2(amax)) - emax``, ``emax`` the exponent of the
    element's largest power of two (8 for E4M3), clamped to -127..127; -127 for an all-zero
    block (OCP MX v1.0 section 6.3).

    Raises:
        ValueError: an unknown element format, a last dimension not divisible by ``block``,
            or ``x`` not a floating tensor of finite values.
    """
    emax = math.floor(math.log2(format_info(element).max))
    amax = _blocks(_finite_float(x), block).abs().amax(dim=-1)
    k = (torch.frexp(amax).exponent - 1) - emax
    return torch.where(amax > 0, k, torch.full_like(k, -127)).clamp(-127, 127)


def _nvfp4(x: torch.Tensor, r: Recipe) -> torch.Tensor:
    """NVFP4's round trip, as torchao's ``nvfp4_quantize`` with a per-tensor scale."""
    e4m3, e2m1 = format_info("fp8 e4m3"), format_info("fp4 e2m1")
    amax = x.abs().amax()
    if amax == 0:
        return torch.zeros_like(x)
    per_tensor = amax / (e4m3.max * e2m1.max)
    v = _blocks(x, r.block)
    block_scale = (v.abs().amax(dim=-1, keepdim=True) / e2m1.max / per_tensor)
    block_scale = round_to_format(block_scale.clamp(e4m3.smallest_normal, e4m3.max), "fp8 e4m3")
    total = per_tensor * block_scale
    return (round_to_format(v / total, "fp4 e2m1") * total).reshape(x.shape)


def fake_quantize(x: torch.Tensor, recipe) -> torch.Tensor:
    """``x`` stored with ``recipe`` (a `Recipe` or a name in `RECIPES`) and read back, in fp32.
    Blocks and rows run along the last dimension (a matmul's inner one for an activation
    ``(..., in)`` and a weight ``(out, in)``).

    Raises:
        ValueError: an unknown recipe, a last dimension not divisible by the recipe's block, or
            ``x`` not a floating tensor of finite values.
    """
    r = _recipe(recipe)
    x = _finite_float(x)
    if r.granularity == "none":
        return round_to_format(x, r.element)
    if r.granularity in ("tensor", "row"):  # torchao float8's amax_to_scale, in fp64 then fp32
        amax = x.abs().amax() if r.granularity == "tensor" else x.abs().amax(dim=-1, keepdim=True)
        scale = (format_info(r.element).max / amax.double().clamp(min=1e-12)).float()
        if r.scale == "power of two":
            scale = torch.exp2(torch.floor(torch.log2(scale)))
        return round_to_format(x * scale, r.element) / scale
    if r.scale == "e8m0":
        scale = torch.exp2(mx_scale_exponents(x, r.element, r.block).float()).unsqueeze(-1)
        return (round_to_format(_blocks(x, r.block) / scale, r.element) * scale).reshape(x.shape)
    return _nvfp4(x, r)


def quantization_error(x: torch.Tensor, recipe) -> dict:
    """What storing ``x`` with ``recipe`` loses: ``relative_error`` ||q - x|| / ||x|| (0 for an
    all-zero ``x``) and ``flushed``, the share of its nonzero values that became 0.

    Raises:
        ValueError: as `fake_quantize`.
    """
    x = _finite_float(x)
    q = fake_quantize(x, recipe)
    norm = x.norm()
    nonzero = x != 0
    return {"relative_error": float((q - x).norm() / norm) if norm > 0 else 0.0,
            "flushed": float(((q == 0) & nonzero).sum() / nonzero.sum()) if nonzero.any() else 0.0}


def quantization_table(tensors: dict, recipes=tuple(RECIPES)) -> pd.DataFrame:
    """`quantization_error` of each tensor under each recipe: index (``recipe``, ``tensor``) in
    the order given, columns ``bits per value``, ``relative error``, ``flushed to 0 (%)``.

    Raises:
        ValueError: no tensors, or as `fake_quantize`.
    """
    if not tensors:
        raise ValueError(tr("quantization_table needs at least one tensor."))
    rows = []
    for name in recipes:
        r = _recipe(name)
        for label, t in tensors.items():
            err = quantization_error(t, r)
            rows.append({"recipe": r.name, "tensor": label, "bits per value": r.bits_per_value,
                         "relative error": err["relative_error"],
                         "flushed to 0 (%)": 100 * err["flushed"]})
    return pd.DataFrame(rows).set_index(["recipe", "tensor"])


def log2_histogram(values: torch.Tensor, lo: int | None = None, hi: int | None = None) -> pd.Series:
    """Counts of ``floor(log2|v|)`` for the nonzero finite elements of ``values`` (any tensor):
    a ``pd.Series`` indexed by ``k`` (the bin ``[2^k, 2^(k+1))``) from ``lo`` to ``hi`` (default:
    the data's range; values outside fall in the end bins), with ``attrs["zeros"]``, the zeros.

    Raises:
        ValueError: ``values`` has no nonzero finite element, or ``lo > hi``.
    """
    v = values.detach().flatten()
    v = v if v.is_floating_point() else v.double()
    finite = v[torch.isfinite(v)]
    nz = finite[finite != 0].abs()
    if nz.numel() == 0:
        raise ValueError(tr("log2_histogram needs at least one nonzero finite value."))
    k = torch.frexp(nz).exponent.long() - 1                  # floor(log2 |v|), exact
    lo = int(k.min()) if lo is None else int(lo)
    hi = int(k.max()) if hi is None else int(hi)
    if lo > hi:
        raise ValueError(tr("lo ({lo}) must be <= hi ({hi}).", lo=lo, hi=hi))
    counts = torch.bincount(k.clamp(lo, hi) - lo, minlength=hi - lo + 1)
    s = pd.Series(counts.tolist(), index=pd.RangeIndex(lo, hi + 1, name="log2 bin"), name="count")
    s.attrs["zeros"] = int((finite == 0).sum())
    return s


def underflow_stats(values: torch.Tensor, fmt, scale: float = 1.0) -> dict:
    """What storing ``values x scale`` (in fp32) in ``fmt`` does: ``n`` (elements), ``nonzero``
    (nonzero finite inputs) and, as fractions of those, ``flushed`` (became 0), ``subnormal``
    (kept below the smallest normal) and ``overflow`` (became inf or NaN).

    Raises:
        ValueError: an unknown format, or a scale that is not a positive finite number.
    """
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(tr("scale must be a positive finite number, got {scale!r}.", scale=scale))
    info = format_info(fmt)
    v = values.detach().flatten().float()
    v = v[torch.isfinite(v) & (v != 0)]
    n_nz = v.numel()
    if n_nz == 0:
        return {"n": values.numel(), "nonzero": 0, "flushed": 0.0, "subnormal": 0.0,
                "overflow": 0.0}
    stored = (v * scale).to(info.dtype).float()
    finite = torch.isfinite(stored)
    sub = finite & (stored != 0) & (stored.abs() < info.smallest_normal)
    return {"n": values.numel(), "nonzero": n_nz, "flushed": int((stored == 0).sum()) / n_nz,
            "subnormal": int(sub.sum()) / n_nz, "overflow": int((~finite).sum()) / n_nz}


def _case_label(fmt, scale: float) -> str:
    """``"fp16"``, ``"fp16, loss x 2^16"`` (a power-of-two scale), ``"fp16, loss x 1000"``."""
    name = format_info(fmt).name
    if scale == 1:
        return name
    k = math.log2(scale)
    if k == int(k):
        return tr("{name}, loss x 2^{k:g}", name=name, k=k)
    return tr("{name}, loss x {scale:g}", name=name, scale=scale)


def underflow_table(groups: dict, cases) -> pd.DataFrame:
    """`underflow_stats` of each group (``{name: tensor}``) under each case (``[(format,
    scale), ...]``), indexed by ``stored as`` (``"fp16, loss x 2^16"``) and ``gradients``;
    columns ``nonzero values``, ``flushed to 0 (%)``, ``subnormal (%)``, ``overflow (%)``.

    Raises:
        ValueError: empty ``groups`` or ``cases``, or a bad format or scale.
    """
    if not groups or not cases:
        raise ValueError(tr("underflow_table needs at least one group and one (format, scale) "
                            "case."))
    rows = []
    for fmt, scale in cases:
        for name, vals in groups.items():
            st = underflow_stats(vals, fmt, scale)
            rows.append({"stored as": _case_label(fmt, scale), "gradients": name,
                         "nonzero values": st["nonzero"], "flushed to 0 (%)": 100 * st["flushed"],
                         "subnormal (%)": 100 * st["subnormal"],
                         "overflow (%)": 100 * st["overflow"]})
    return pd.DataFrame(rows).set_index(["stored as", "gradients"])
