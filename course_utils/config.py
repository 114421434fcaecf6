"""`RunConfig`: one training configuration, validated; and the course's size profiles.

A size profile picks model and batch dimensions so that notebooks, the CLI, widgets and tests
agree: ``smoke`` (tests, CI: seconds), ``cpu`` (a laptop: a lesson in about two minutes),
``t4``, ``a100``, ``h100`` (large enough for tensor cores to show). `size_profile()` chooses one
from the hardware; the environment variable ``COURSE_SIZE`` overrides it.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass

import torch

from .checkpointing import plan_segments

__all__ = ["PRECISIONS", "SIZE_PROFILES", "RunConfig", "size_profile", "config_for",
           "check_feasible", "autocast_dtype", "SIZE_ENV", "step_flops", "default_device",
           "warn_if_slow", "check_dimensions", "MiB", "GiB"]

PRECISIONS = ("fp32", "bf16", "fp16")
ATTENTIONS = ("sdpa", "naive")
SIZE_ENV = "COURSE_SIZE"

#: Units the course prints (DESIGN.md: MiB = 2^20 bytes, GiB = 2^30 bytes).
MiB = 2**20
GiB = 2**30

#: Model and batch dimensions per size profile. The byte vocabulary is always 256.
SIZE_PROFILES: dict[str, dict] = {
    "smoke": dict(n_layers=2, d_model=64, n_heads=2, seq_len=32, batch_size=4),
    "cpu": dict(n_layers=4, d_model=256, n_heads=4, seq_len=128, batch_size=8),
    "t4": dict(n_layers=8, d_model=768, n_heads=12, seq_len=512, batch_size=8),
    "a100": dict(n_layers=12, d_model=1024, n_heads=16, seq_len=1024, batch_size=16),
    "h100": dict(n_layers=12, d_model=1536, n_heads=16, seq_len=1024, batch_size=16),
}

# Step FLOPs above which fp16 on a CPU without fp16 instructions is refused: fp16 matmuls
# measured ~215x slower than fp32 there (shared/notes/measurement.md), so 1e9 FLOPs already
# takes seconds. The `smoke` size is ~1e8.
_CPU_FP16_MAX_FLOPS = 1e9


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a precision name: ``fp32`` -> None (no autocast).

    Raises:
        ValueError: an unknown precision.
    """
    if precision == "fp32":
        return None
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp16":
        return torch.float16
    raise ValueError(f"unknown precision {precision!r}: expected one of {', '.join(PRECISIONS)}.")


def check_dimensions(obj, names) -> None:
    """Check that ``obj``'s attributes ``names`` are positive integers and that ``d_model`` is
    divisible by ``n_heads``.

    Raises:
        ValueError: naming the first attribute that is not.
    """
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}.")
    if obj.d_model % obj.n_heads:
        raise ValueError(f"d_model ({obj.d_model}) must be divisible by n_heads "
                         f"({obj.n_heads}).")


@dataclass(frozen=True)
class RunConfig:
    """One training configuration of the course's reference transformer.

    Attributes:
        n_layers: number of transformer blocks (>= 1).
        d_model: model width; must be divisible by ``n_heads``.
        n_heads: attention heads.
        seq_len: tokens (bytes) per sequence.
        batch_size: sequences per micro-batch (>= 1).
        precision: ``fp32``, ``bf16`` (autocast) or ``fp16`` (autocast + GradScaler).
        checkpoint: checkpoint policy: ``none``, ``full``, ``every-K``, ``segments:N``,
            ``selective`` (see `course_utils.checkpointing`).
        compile: wrap the model in ``torch.compile``.
        grad_accum_steps: micro-batches per optimizer step (>= 1); effective batch is
            ``batch_size * grad_accum_steps``.
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        seed: seed for weights and data.
        attention: ``sdpa`` (``F.scaled_dot_product_attention``) or ``naive`` (softmax(QK^T)V,
            O(seq^2) saved memory).
        vocab_size: 256 (bytes).

    Raises:
        ValueError: on construction, for any invalid field, with the valid values named.
    """

    n_layers: int = 4
    d_model: int = 256
    n_heads: int = 4
    seq_len: int = 128
    batch_size: int = 8
    precision: str = "fp32"
    checkpoint: str = "none"
    compile: bool = False
    grad_accum_steps: int = 1
    device: str = "cpu"
    seed: int = 0
    attention: str = "sdpa"
    vocab_size: int = 256

    def __post_init__(self):
        check_dimensions(self, ("n_layers", "d_model", "n_heads", "seq_len", "batch_size",
                                "grad_accum_steps"))
        autocast_dtype(self.precision)  # raises on an unknown precision
        if self.attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {self.attention!r}: expected one of "
                             f"{', '.join(ATTENTIONS)}.")
        if self.vocab_size != 256:
            raise ValueError("vocab_size is 256: the course's model reads bytes.")
        kind = str(self.device).split(":")[0]
        if kind not in ("cpu", "cuda", "mps"):
            raise ValueError(f"unknown device {self.device!r}: expected 'cpu', 'cuda', 'cuda:N' "
                             "or 'mps'.")
        plan_segments(self.checkpoint, self.n_layers)  # raises on an unknown/unfitting policy

    def replace(self, **changes) -> "RunConfig":
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def tokens_per_step(self) -> int:
        """Tokens consumed by one optimizer step: batch x seq x accumulation steps."""
        return self.batch_size * self.seq_len * self.grad_accum_steps

    @property
    def label(self) -> str:
        """A short name such as ``bf16+full`` or ``fp32`` for tables and charts."""
        s = self.precision
        if self.checkpoint != "none":
            s += f"+{self.checkpoint}"
        if self.compile:
            s += "+compile"
        if self.grad_accum_steps > 1:
            s += f"+accum{self.grad_accum_steps}"
        return s

    def as_dict(self) -> dict:
        """All fields as a plain dict (JSON-ready)."""
        return dataclasses.asdict(self)


def size_profile(hw=None) -> str:
    """The size profile to use: ``$COURSE_SIZE`` if set, else chosen from the hardware.

    CPU and MPS -> ``cpu``; a CUDA GPU with compute capability < 8 or under 20 GiB -> ``t4``;
    compute capability 9.x or newer -> ``h100``; other Ampere-class GPUs -> ``a100``.

    Raises:
        ValueError: ``$COURSE_SIZE`` names no profile.
    """
    env = os.environ.get(SIZE_ENV, "").strip()
    if env:
        if env not in SIZE_PROFILES:
            raise ValueError(f"{SIZE_ENV}={env!r} is not a size profile: expected one of "
                             f"{', '.join(SIZE_PROFILES)}.")
        return env
    from .hardware import detect
    hw = hw or detect()
    if hw.device != "cuda":
        return "cpu"
    cc = hw.compute_capability or (0, 0)
    if cc < (8, 0) or (hw.total_memory_bytes or 0) < 20 * 2**30:
        return "t4"
    return "h100" if cc >= (9, 0) else "a100"


def default_device() -> str:
    """``cuda`` if available, else ``mps`` if available, else ``cpu``."""
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def config_for(size: str | None = None, **overrides) -> RunConfig:
    """A `RunConfig` at a size profile (default: `size_profile()`), with ``overrides`` applied.

    ``device`` defaults to this machine's accelerator if any.

    Raises:
        ValueError: an unknown size or an invalid override.
    """
    size = size or size_profile()
    if size not in SIZE_PROFILES:
        raise ValueError(f"unknown size {size!r}: expected one of {', '.join(SIZE_PROFILES)}.")
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    unknown = set(overrides) - fields
    if unknown:
        raise ValueError(f"unknown RunConfig field(s) {sorted(unknown)}: valid are {sorted(fields)}.")
    kw = dict(SIZE_PROFILES[size])
    kw.setdefault("device", default_device())
    kw.update(overrides)
    return RunConfig(**kw)


def step_flops(config: RunConfig) -> float:
    """Approximate FLOPs of one training step: 6 x matmul parameters x tokens + attention.

    Source: the 6ND rule (Kaplan et al. 2020, arXiv 2001.08361), attention term
    12 x L x seq x d per token (Chinchilla, Hoffmann et al. 2022, arXiv 2203.15556, Table 4).
    """
    L, d, T = config.n_layers, config.d_model, config.seq_len
    matmul_params = L * 12 * d * d + d * config.vocab_size
    tokens = config.tokens_per_step
    return 6.0 * matmul_params * tokens + 12.0 * L * T * d * tokens


def check_feasible(config: RunConfig, hw=None, force: bool = False) -> list[str]:
    """Refuse configurations that would be wrong or take minutes; return warnings for slow ones.

    Args:
        config: the configuration to run.
        hw: a `HardwareInfo` for ``config.device`` (default: detected).
        force: run anyway (errors become warnings).

    Returns:
        Warnings (strings) to show the learner, e.g. bf16 on a CPU without bf16 instructions.

    Raises:
        ValueError: the device is missing; fp16 on a CPU without fp16 instructions above a tiny
            size (~215x slower than fp32); bf16 on a GPU that only emulates it (e.g. a T4).
    """
    from .hardware import detect
    hw = hw or detect(config.device)
    problems, notes = [], []
    if hw.device == "cpu" and config.precision == "fp16" and not hw.fp16_fast:
        flops = step_flops(config)
        if flops > _CPU_FP16_MAX_FLOPS:
            problems.append(
                f"fp16 on this CPU ({hw.name}) has no fp16 instructions: fp16 matmuls run about "
                f"200x slower than fp32, and this step ({flops:.1e} FLOPs) would take minutes. "
                "Use bf16 or fp32 on a CPU, the 'smoke' size, or force=True.")
        else:
            notes.append("fp16 on a CPU is emulated (~200x slower than fp32); fine at this tiny size.")
    if hw.device == "cuda" and config.precision == "bf16" and not hw.native_bf16:
        problems.append(
            f"bf16 on {hw.name} is emulated (compute capability "
            f"{'.'.join(map(str, hw.compute_capability or ()))} < 8.0): it runs but slowly and "
            "teaches the wrong lesson. Use fp16 with GradScaler here, or force=True.")
    if hw.device == "cpu" and config.precision == "bf16" and not hw.native_bf16:
        notes.append(f"this CPU ({hw.name}) has no avx512_bf16/AMX: bf16 autocast is emulated and "
                     "slower than fp32 here (its memory saving still holds).")
    if config.compile and hw.device == "cpu":
        notes.append("torch.compile on a CPU: the first step compiles for tens of seconds.")
    if problems and not force:
        raise ValueError(" ".join(problems))
    return problems + notes


def warn_if_slow(config: RunConfig, hw=None, force: bool = False) -> None:
    """`check_feasible` that emits its notes as `UserWarning`s."""
    for msg in check_feasible(config, hw, force=force):
        warnings.warn(msg, UserWarning, stacklevel=3)
