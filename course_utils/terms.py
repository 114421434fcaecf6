"""The course's terms as code: precision names and their dtypes, device kinds, the units the
course prints (IEC binary prefixes) and the one check of a positive integer.

The bottom of the package (it imports only ``torch`` and `tr`): every other module takes these
words from here, so a precision, a device or a MiB means the same in every lesson and table.
"""
from __future__ import annotations

import torch

from .i18n import tr

__all__ = ["PRECISIONS", "PRECISION_DTYPES", "DEVICE_KINDS", "KiB", "MiB", "GiB", "precision_dtype",
           "autocast_dtype", "short_dtype", "device_kind", "default_device", "cuda_index",
           "PrecisionOnDevice", "check_positive_int"]

#: The precisions a run can train in, in the order the course lists them.
PRECISIONS = ("fp32", "bf16", "fp16")

#: The dtype each precision computes its matmuls in (fp32: no autocast).
PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

#: Names of the dtypes the course's tables print, beyond the precisions' (FP8 where torch has it).
_DTYPE_NAMES = {dt: name for name, dt in PRECISION_DTYPES.items()}
_DTYPE_NAMES.update({torch.float64: "fp64", torch.int64: "int64", torch.int32: "int32",
                     torch.bool: "bool", torch.uint8: "uint8"})
_DTYPE_NAMES.update({getattr(torch, attr): name for attr, name in (
    ("float8_e4m3fn", "fp8_e4m3"), ("float8_e5m2", "fp8_e5m2")) if hasattr(torch, attr)})

#: The device kinds the course runs on (what ``torch.autocast`` and ``GradScaler`` take).
DEVICE_KINDS = ("cpu", "cuda", "mps")

#: Bytes in a kibibyte (2^10), a mebibyte (2^20) and a gibibyte (2^30).
KiB = 2**10
MiB = 2**20
GiB = 2**30


def precision_dtype(precision: str) -> torch.dtype:
    """The dtype ``precision`` computes in (``bf16`` -> ``torch.bfloat16``).

    Raises:
        ValueError: an unknown precision, naming the valid ones.
    """
    if precision not in PRECISION_DTYPES:
        raise ValueError(tr("unknown precision {precision!r}: expected one of {names}.",
                            precision=precision, names=", ".join(PRECISIONS)))
    return PRECISION_DTYPES[precision]


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a precision: None for ``fp32`` (no autocast), else `precision_dtype`.

    Raises:
        ValueError: an unknown precision.
    """
    dtype = precision_dtype(precision)
    return None if dtype == torch.float32 else dtype


def short_dtype(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bf16"``; a dtype without a course name as ``str`` without ``torch.``."""
    return _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def device_kind(device: str | torch.device) -> str:
    """``"cuda"`` for ``"cuda:1"``: what ``torch.autocast`` and ``GradScaler`` take.

    Raises:
        ValueError: a string that names no device torch knows.
    """
    try:
        return torch.device(device).type
    except (RuntimeError, TypeError) as e:
        raise ValueError(tr("unknown device {device!r}: expected 'cpu', 'cuda', 'cuda:N' or "
                            "'mps'.", device=device)) from e


def default_device() -> str:
    """``cuda`` if available, else ``mps`` if available, else ``cpu``."""
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def cuda_index(device: str | torch.device) -> int:
    """The index of a CUDA device: ``"cuda:1"`` -> 1, ``"cuda"`` -> the current device.
    ``torch.cuda.set_per_process_memory_fraction`` and ``mem_get_info`` refuse a device without
    an index (ValueError: "Expected a torch.device with a specified index", torch 2.11 on an
    H100, results/NVIDIA-H100-80GB-HBM3-2026-11-26).

    Raises:
        ValueError: ``device`` is not a CUDA device.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(tr("{device!r} is not a CUDA device.", device=device))
    return torch.cuda.current_device() if dev.index is None else dev.index


class PrecisionOnDevice:
    """The autocast dtype, device kind and context of a configuration with ``precision`` and
    ``device`` fields (mixed into `course_utils.config.RunConfig` and `profiling.ProfileConfig`)."""

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype (None for fp32)."""
        return autocast_dtype(self.precision)

    @property
    def device_type(self) -> str:
        """`device_kind` of the device."""
        return device_kind(self.device)

    def autocast(self):
        """``torch.autocast(device_type, dtype)`` for this precision (disabled for fp32)."""
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None)


def check_positive_int(name: str, value, *, minimum: int = 1, allow_none: bool = False) -> None:
    """Check that ``value`` is an integer >= ``minimum`` (not a ``bool``), or None where
    ``allow_none``.

    Raises:
        ValueError: ``"<name> must be a positive integer, got 0."`` (or "an integer >= N").
    """
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        fields = {"name": name, "minimum": minimum, "value": value}
        if minimum == 1:
            message = (tr("{name} must be a positive integer or None, got {value!r}.", **fields)
                       if allow_none else
                       tr("{name} must be a positive integer, got {value!r}.", **fields))
        else:
            message = (tr("{name} must be an integer >= {minimum} or None, got {value!r}.",
                          **fields) if allow_none else
                       tr("{name} must be an integer >= {minimum}, got {value!r}.", **fields))
        raise ValueError(message)
