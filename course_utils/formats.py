"""Number formats: what fp32, fp16, bf16 and the two FP8 formats can represent, read from
``torch.finfo`` (nothing typed in); the bit layout of a value in each; and what a format does to
a set of values (a gradient, say): the log2 histogram, and the fraction flushed to zero, kept as
subnormal or overflowed, with or without a loss scale.

IEEE 754 binary formats (and bf16, FP8): a value is ``(-1)^s x 2^(e - bias) x 1.m`` (normal) or
``(-1)^s x 2^(1 - bias) x 0.m`` (subnormal). With ``p`` mantissa (fraction) bits, machine epsilon is
``2^-p`` and the smallest subnormal is ``smallest_normal x 2^-p`` (IEEE 754-2019 section 3.3;
Micikevicius et al. 2022, "FP8 Formats for Deep Learning", arXiv 2209.05433, for E4M3 / E5M2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch

from .fp32_matmul import tf32_probe  # lesson 03 imports it from here
from .terms import PRECISION_DTYPES, short_dtype

__all__ = ["FORMATS", "FormatInfo", "resolve_dtype", "format_info", "format_table",
           "bits", "cast_table", "log2_histogram", "underflow_stats", "underflow_table",
           "tf32_probe"]

#: The formats lesson 01 compares, by the course's short name (FP8 only where torch has it).
FORMATS: dict[str, torch.dtype] = {
    name: dt for name, dt in (
        *((p, PRECISION_DTYPES[p]) for p in ("fp32", "fp16", "bf16")),
        ("fp8 e4m3", getattr(torch, "float8_e4m3fn", None)),
        ("fp8 e5m2", getattr(torch, "float8_e5m2", None)),
    ) if dt is not None}

_ALIASES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16,
            "half": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
            "fp64": torch.float64}


def resolve_dtype(fmt) -> torch.dtype:
    """A floating-point ``torch.dtype`` from a name (``"fp16"``, ``"bf16"``, ``"fp8 e4m3"``,
    ``"float16"``, ...) or a dtype.

    Raises:
        ValueError: an unknown name, or a dtype that is not floating point.
    """
    if isinstance(fmt, torch.dtype):
        dt = fmt
    elif isinstance(fmt, str) and (fmt in FORMATS or fmt in _ALIASES):
        dt = FORMATS.get(fmt) or _ALIASES[fmt]
    else:
        raise ValueError(f"unknown number format {fmt!r}: expected a floating torch.dtype or one "
                         f"of {', '.join(list(FORMATS) + list(_ALIASES))}.")
    if not dt.is_floating_point:
        raise ValueError(f"{dt} is not a floating-point dtype.")
    return dt


@dataclass(frozen=True)
class FormatInfo:
    """What one floating-point format can represent (from ``torch.finfo``).

    Attributes:
        name: the course's short name (``"bf16"``).
        dtype: the ``torch.dtype``.
        bits: total bits; ``sign_bits`` (1), ``exponent_bits``, ``mantissa_bits`` (stored
            fraction bits, without the implicit leading 1).
        eps: machine epsilon, the gap between 1 and the next larger value, ``2^-mantissa_bits``.
        max: the largest finite value.
        smallest_normal: the smallest positive normal value (``finfo.smallest_normal``).
        smallest_subnormal: the smallest positive value, ``smallest_normal x eps``.
        decimal_digits: significant decimal digits, ``(mantissa_bits + 1) x log10(2)`` (the
            implicit leading bit counts).
    """

    name: str
    dtype: torch.dtype
    bits: int
    sign_bits: int
    exponent_bits: int
    mantissa_bits: int
    eps: float
    max: float
    smallest_normal: float
    smallest_subnormal: float
    decimal_digits: float


def format_info(fmt) -> FormatInfo:
    """The `FormatInfo` of a format name or floating dtype, computed from ``torch.finfo``.

    ``mantissa_bits = -log2(eps)``, ``exponent_bits = bits - 1 - mantissa_bits``,
    ``smallest_subnormal = smallest_normal x eps`` (see the module docstring).

    Raises:
        ValueError: not a floating-point format (see `resolve_dtype`).
    """
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
    """One row per format (default: all of `FORMATS`), indexed by the format's name.

    Default columns (seven): ``exponent bits``, ``mantissa bits``, ``eps``, ``max``,
    ``smallest normal``, ``smallest subnormal``, ``decimal digits``. ``detail=True`` adds the
    ``dtype`` name, the total ``bits`` and the ``sign`` bit.

    Raises:
        ValueError: a name that is not a floating-point format.
    """
    infos = [format_info(f) for f in (formats if formats is not None else FORMATS)]
    rows = []
    for i in infos:
        row = {"format": i.name}
        if detail:
            row.update({"dtype": str(i.dtype).replace("torch.", ""), "bits": i.bits,
                        "sign": i.sign_bits})
        row.update({"exponent bits": i.exponent_bits, "mantissa bits": i.mantissa_bits,
                    "eps": i.eps, "max": i.max, "smallest normal": i.smallest_normal,
                    "smallest subnormal": i.smallest_subnormal,
                    "decimal digits": i.decimal_digits})
        rows.append(row)
    return pd.DataFrame(rows).set_index("format")


_INT_OF_WIDTH = {8: torch.uint8, 16: torch.int16, 32: torch.int32, 64: torch.int64}


def bits(x: float, fmt) -> str:
    """The bit pattern of ``x`` rounded to ``fmt``: ``"sign exponent mantissa"``, e.g.
    ``bits(1.0, "fp16") == "0 01111 0000000000"``.

    ``x`` is rounded to the format with PyTorch's cast (round to nearest even; for
    ``float8_e4m3fn`` values beyond its max become NaN, as the cast defines).

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
    """Each value rounded to each format: the stored value (printed with 10 significant digits)
    and its bit pattern. Rows: the values as given (fp64); columns ``<fmt>`` and ``<fmt> bits``.

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


def log2_histogram(values: torch.Tensor, lo: int | None = None, hi: int | None = None) -> pd.Series:
    """Counts of ``floor(log2|v|)`` for the nonzero elements of ``values``.

    Args:
        values: any tensor (flattened; integer tensors are converted to fp64).
        lo, hi: the first and last exponent bin (default: the data's range); values outside
            are counted in the end bins.

    Returns:
        A ``pd.Series`` indexed by the integer exponent ``k`` (the bin ``[2^k, 2^(k+1))``),
        plus its attribute ``attrs["zeros"]``: the number of exact zeros (not binned).

    Raises:
        ValueError: ``values`` has no nonzero finite element, or ``lo > hi``.
    """
    v = values.detach().flatten()
    if not v.is_floating_point():
        v = v.double()
    finite = v[torch.isfinite(v)]
    nz = finite[finite != 0].abs()
    if nz.numel() == 0:
        raise ValueError("log2_histogram needs at least one nonzero finite value.")
    # frexp: |v| = m x 2^e with m in [0.5, 1), so floor(log2|v|) = e - 1 exactly (no rounding).
    k = torch.frexp(nz).exponent.long() - 1
    lo = int(k.min()) if lo is None else int(lo)
    hi = int(k.max()) if hi is None else int(hi)
    if lo > hi:
        raise ValueError(f"lo ({lo}) must be <= hi ({hi}).")
    k = k.clamp(lo, hi)
    counts = torch.bincount(k - lo, minlength=hi - lo + 1)
    s = pd.Series(counts.tolist(), index=pd.RangeIndex(lo, hi + 1, name="log2 bin"), name="count")
    s.attrs["zeros"] = int((finite == 0).sum())
    return s


def underflow_stats(values: torch.Tensor, fmt, scale: float = 1.0) -> dict:
    """What happens to ``values x scale`` when stored in ``fmt`` (round to nearest even).

    ``values`` are taken as fp32 and multiplied by ``scale`` in fp32 (exact for a power of two).

    Returns:
        A dict with ``n`` (elements), ``nonzero`` (nonzero finite inputs), and as fractions of
        the nonzero inputs: ``flushed`` (became exactly 0), ``subnormal`` (kept, but below the
        smallest normal value: fewer significant bits), ``overflow`` (became inf or NaN).

    Raises:
        ValueError: an unknown format, or a scale that is not a positive finite number.
    """
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}.")
    info = format_info(fmt)
    v = values.detach().flatten().float()
    v = v[torch.isfinite(v) & (v != 0)]
    n_nz = v.numel()
    if n_nz == 0:
        return {"n": values.numel(), "nonzero": 0, "flushed": 0.0, "subnormal": 0.0,
                "overflow": 0.0}
    # In fp32: exact for a power-of-two scale (what GradScaler uses) unless it leaves fp32's range.
    stored = (v * scale).to(info.dtype).float()
    flushed = int((stored == 0).sum())
    overflow = int((~torch.isfinite(stored)).sum())
    kept = (stored != 0) & torch.isfinite(stored)
    sub = int((kept & (stored.abs() < info.smallest_normal)).sum())
    return {"n": values.numel(), "nonzero": n_nz, "flushed": flushed / n_nz,
            "subnormal": sub / n_nz, "overflow": overflow / n_nz}


def _case_label(fmt, scale: float) -> str:
    """``"fp16"``, ``"fp16, loss x 2^16"`` (a power-of-two scale), ``"fp16, loss x 1000"``."""
    name = format_info(fmt).name
    if scale == 1:
        return name
    k = math.log2(scale)
    return f"{name}, loss x 2^{k:g}" if k == int(k) else f"{name}, loss x {scale:g}"


def underflow_table(groups: dict, cases) -> pd.DataFrame:
    """`underflow_stats` for each group of values under each (format, scale) case, in percent.

    Args:
        groups: ``{name: tensor}``, e.g. `GradientCapture.groups()`.
        cases: ``[(format, scale), ...]``, e.g. ``[("fp16", 1), ("fp16", 2**16), ("bf16", 1)]``.

    Returns:
        One row per (case, group), indexed by ``stored as`` (the format, with the loss scale
        when it is not 1: ``"fp16, loss x 2^16"``) and ``gradients`` (the group's name); four
        columns: ``nonzero values`` (count), ``flushed to 0 (%)``, ``subnormal (%)``,
        ``overflow (%)`` (percent of the nonzero values).

    Raises:
        ValueError: empty ``groups`` or ``cases``, or a bad format or scale.
    """
    if not groups or not cases:
        raise ValueError("underflow_table needs at least one group and one (format, scale) case.")
    rows = []
    for fmt, scale in cases:
        for name, vals in groups.items():
            st = underflow_stats(vals, fmt, scale)
            rows.append({"stored as": _case_label(fmt, scale), "gradients": name,
                         "nonzero values": st["nonzero"], "flushed to 0 (%)": 100 * st["flushed"],
                         "subnormal (%)": 100 * st["subnormal"],
                         "overflow (%)": 100 * st["overflow"]})
    return pd.DataFrame(rows).set_index(["stored as", "gradients"])
