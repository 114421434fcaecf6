"""What one training run is: `ModelShape` (the model's dimensions) inside `RunConfig` (batch,
precision, checkpoint policy, device...), and the course's size profiles (`SIZE_PROFILES`):
``smoke`` (tests: seconds), ``cpu`` (a laptop), ``t4``, ``a100``, ``h100`` (large enough for
tensor cores to show): `size_profile()` picks one from the hardware (``$COURSE_SIZE`` wins).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from .checkpointing import parse_policy
from .hardware import detect
from .i18n import tr
from .terms import (
    DEVICE_KINDS,
    GiB,
    PrecisionOnDevice,
    autocast_dtype,
    check_positive_int,
    default_device,
    device_kind,
)

__all__ = ["ATTENTIONS", "SIZE_PROFILES", "SIZE_ENV", "ModelShape", "RunConfig", "size_profile",
           "config_for", "step_flops"]

ATTENTIONS = ("sdpa", "naive")
SIZE_ENV = "COURSE_SIZE"


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of the course's GPT (`course_utils.models`), as nanoGPT's ``GPTConfig``;
    `course_utils.memory_model` also takes it at 1B-70B sizes for estimates.

    Attributes:
        n_layers: transformer blocks (>= 1).
        d_model: width; divisible by ``n_heads``.
        n_heads: attention heads.
        seq_len: the longest sequence (tokens).
        vocab_size: vocabulary (256: bytes).
        attention: ``sdpa`` (``F.scaled_dot_product_attention``: O(seq) saved memory) or
            ``naive`` (softmax(QK^T)V written out: O(seq^2)).

    Raises:
        ValueError: on construction, for a non-positive size, ``d_model % n_heads != 0`` or an
            unknown attention.
    """

    n_layers: int = 4
    d_model: int = 256
    n_heads: int = 4
    seq_len: int = 128
    vocab_size: int = 256
    attention: str = "sdpa"

    def __post_init__(self):
        for name in ("n_layers", "d_model", "n_heads", "seq_len", "vocab_size"):
            check_positive_int(name, getattr(self, name))
        if self.d_model % self.n_heads:
            raise ValueError(tr("d_model ({d_model}) must be divisible by n_heads ({n_heads}).",
                                d_model=self.d_model, n_heads=self.n_heads))
        if self.attention not in ATTENTIONS:
            raise ValueError(tr("unknown attention {attention!r}: expected one of {names}.",
                                attention=self.attention, names=", ".join(ATTENTIONS)))

    def replace(self, **changes) -> "ModelShape":
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def n_parameters(self) -> int:
        """``N = 2 V d + T d + L (12 d^2 + 13 d) + 2 d`` (see `course_utils.memory_model`)."""
        d, V, L, T = self.d_model, self.vocab_size, self.n_layers, self.seq_len
        return 2 * V * d + T * d + L * (12 * d * d + 13 * d) + 2 * d


_SHAPE_FIELDS = tuple(f.name for f in dataclasses.fields(ModelShape))


@dataclass(frozen=True)
class RunConfig(PrecisionOnDevice):
    """One training configuration of the course's model: a `ModelShape` and how to train it.
    Built by `config_for`; the shape's fields read through it (``config.n_layers``).

    Attributes:
        batch_size: sequences per micro-batch (>= 1).
        precision: ``fp32``, ``bf16`` (autocast) or ``fp16`` (autocast + GradScaler).
        checkpoint: a checkpoint policy (`course_utils.checkpointing.MODES`).
        compile: compile each block in place (`course_utils.training.compile_blocks`).
        grad_accum_steps: micro-batches per optimizer step (>= 1).
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        seed: seed for weights and data.
        loss_chunk: tokens per chunk of the chunked cross-entropy
            (`course_utils.chunked_loss`); 0 (default): the plain ``F.cross_entropy``.

    Raises:
        ValueError: on construction, for any invalid field, with the valid values named.
    """

    shape: ModelShape = field(default_factory=ModelShape)
    batch_size: int = 8
    precision: str = "fp32"
    checkpoint: str = "none"
    compile: bool = False
    grad_accum_steps: int = 1
    device: str = "cpu"
    seed: int = 0
    loss_chunk: int = 0

    def __post_init__(self):
        if not isinstance(self.shape, ModelShape):
            raise ValueError(tr("shape must be a ModelShape, got {type}.",
                                type=type(self.shape).__name__))
        for name in ("batch_size", "grad_accum_steps"):
            check_positive_int(name, getattr(self, name))
        check_positive_int("loss_chunk", self.loss_chunk, minimum=0)  # 0: the plain loss
        autocast_dtype(self.precision)  # raises on an unknown precision
        if device_kind(self.device) not in DEVICE_KINDS:
            raise ValueError(tr("unknown device {device!r}: expected 'cpu', 'cuda', 'cuda:N' or "
                                "'mps'.", device=self.device))
        parse_policy(self.checkpoint, self.shape.n_layers)  # raises on an unfitting policy

    n_layers = property(lambda self: self.shape.n_layers)
    d_model = property(lambda self: self.shape.d_model)
    n_heads = property(lambda self: self.shape.n_heads)
    seq_len = property(lambda self: self.shape.seq_len)
    vocab_size = property(lambda self: self.shape.vocab_size)
    attention = property(lambda self: self.shape.attention)

    def replace(self, **changes) -> "RunConfig":
        """A copy with ``changes`` applied (fields of the run or of its shape; validated again).

        Raises:
            ValueError: an unknown field name or an invalid value.
        """
        shape_changes = {k: changes.pop(k) for k in list(changes) if k in _SHAPE_FIELDS}
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(_unknown_fields(unknown))
        if shape_changes:
            changes["shape"] = self.shape.replace(**shape_changes)
        return dataclasses.replace(self, **changes)

    @property
    def tokens_per_step(self) -> int:
        """Tokens consumed by one optimizer step: batch x seq x accumulation steps."""
        return self.batch_size * self.seq_len * self.grad_accum_steps

    @property
    def label(self) -> str:
        """A short name for tables and charts: ``fp32``, ``bf16+full``, ``fp32+loss-chunk:64``."""
        s = self.precision
        if self.checkpoint != "none":
            s += f"+{self.checkpoint}"
        if self.compile:
            s += "+compile"
        if self.grad_accum_steps > 1:
            s += f"+accum{self.grad_accum_steps}"
        if self.loss_chunk:
            s += f"+loss-chunk:{self.loss_chunk}"
        return s

    def as_dict(self) -> dict:
        """All fields, the shape's flattened in, as a plain dict (JSON-ready)."""
        d = dataclasses.asdict(self)
        d.update(d.pop("shape"))
        return d


_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunConfig) if f.name != "shape")


def _unknown_fields(unknown) -> str:
    return tr("unknown RunConfig field(s) {unknown}: valid are {valid}.", unknown=sorted(unknown),
              valid=sorted(_SHAPE_FIELDS + _RUN_FIELDS))

#: Model and batch dimensions per size profile (the byte vocabulary is always 256).
SIZE_PROFILES: dict[str, dict] = {
    "smoke": dict(n_layers=2, d_model=64, n_heads=2, seq_len=32, batch_size=4),
    "cpu": dict(n_layers=4, d_model=256, n_heads=4, seq_len=128, batch_size=8),
    "t4": dict(n_layers=4, d_model=768, n_heads=12, seq_len=512, batch_size=8),  # README: T4 guide
    # 6 blocks: the depth only multiplies a lesson's time (results/gpu-budget.md)
    "a100": dict(n_layers=6, d_model=1024, n_heads=16, seq_len=1024, batch_size=16),
    "h100": dict(n_layers=6, d_model=1536, n_heads=16, seq_len=1024, batch_size=16),
}


def size_profile(hw=None) -> str:
    """``$COURSE_SIZE`` if set, else from the hardware: CPU and MPS -> ``cpu``; a CUDA GPU of
    compute capability < 8 or under 20 GiB -> ``t4``; 9.x or newer -> ``h100``; else ``a100``.

    Raises:
        ValueError: ``$COURSE_SIZE`` names no profile.
    """
    env = os.environ.get(SIZE_ENV, "").strip()
    if env:
        if env not in SIZE_PROFILES:
            raise ValueError(tr("{var}={env!r} is not a size profile: expected one of {names}.",
                                var=SIZE_ENV, env=env, names=", ".join(SIZE_PROFILES)))
        return env
    hw = hw or detect()
    if hw.device != "cuda":
        return "cpu"
    cc = hw.compute_capability or (0, 0)
    if cc < (8, 0) or (hw.total_memory_bytes or 0) < 20 * GiB:
        return "t4"
    return "h100" if cc >= (9, 0) else "a100"


def config_for(size: str | None = None, **overrides) -> RunConfig:
    """A `RunConfig` at a size profile (default: `size_profile()`), with ``overrides`` (fields
    of the run or of the shape) applied. ``device`` defaults to this machine's accelerator.

    Raises:
        ValueError: an unknown size, an unknown field or an invalid value.
    """
    size = size or size_profile()
    if size not in SIZE_PROFILES:
        raise ValueError(tr("unknown size {size!r}: expected one of {names}.", size=size,
                            names=", ".join(SIZE_PROFILES)))
    unknown = set(overrides) - set(_SHAPE_FIELDS + _RUN_FIELDS)
    if unknown:
        raise ValueError(_unknown_fields(unknown))
    return RunConfig().replace(**{"device": default_device(), **SIZE_PROFILES[size], **overrides})


def step_flops(config: RunConfig) -> float:
    """Approximate FLOPs of one training step: 6 x matmul parameters x tokens + attention.

    Source: the 6ND rule (Kaplan et al. 2020, arXiv 2001.08361), attention term
    12 x L x seq x d per token (Chinchilla, Hoffmann et al. 2022, arXiv 2203.15556, Table 4).
    """
    L, d, T = config.n_layers, config.d_model, config.seq_len
    matmul_params = L * 12 * d * d + d * config.vocab_size
    tokens = config.tokens_per_step
    return 6.0 * matmul_params * tokens + 12.0 * L * T * d * tokens
