"""What one training run is: `ModelShape` (the model's dimensions) inside `RunConfig` (batch,
precision, checkpoint policy, device...), and the course's size profiles.

A size profile picks model and batch dimensions so that notebooks, the CLI, widgets and tests
agree: ``smoke`` (tests, CI: seconds), ``cpu`` (a laptop: a lesson in about two minutes),
``t4``, ``a100``, ``h100`` (large enough for tensor cores to show). `size_profile()` chooses one
from the hardware; the environment variable ``COURSE_SIZE`` overrides it.

The words a configuration is written in (precision names and their dtypes, device kinds, units)
live in `course_utils.terms`; the hardware a size profile is chosen from, in
`course_utils.hardware`.
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


def _check_dimensions(obj, names) -> None:
    """Check that ``obj``'s attributes ``names`` are positive integers (`check_positive_int`).

    Raises:
        ValueError: naming the first attribute that is not (0 is not "unset": it is refused).
    """
    for name in names:
        check_positive_int(name, getattr(obj, name))


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a GPT-like model (the course's block: pre-LN, 4d MLP, learned
    positions, untied head), as nanoGPT's ``GPTConfig``.

    The course runs it at ``vocab_size`` 256 (bytes); `course_utils.memory_model` also takes it
    at the sizes of 1B-70B models (`SCALE_MODELS` there) for estimates.

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
        _check_dimensions(self, ("n_layers", "d_model", "n_heads", "seq_len", "vocab_size"))
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

    Build one with `config_for` (a size profile plus overrides); read the shape's fields
    directly (``config.n_layers``); change any field, of the run or of the shape, with
    ``config.replace(batch_size=2, n_layers=8)``.

    Attributes:
        shape: the model's dimensions (`ModelShape`).
        batch_size: sequences per micro-batch (>= 1).
        precision: ``fp32``, ``bf16`` (autocast) or ``fp16`` (autocast + GradScaler).
        checkpoint: checkpoint policy: ``none``, ``full``, ``every-K``, ``segments:N``,
            ``selective``, ``memory-budget:B`` (see `course_utils.checkpointing`).
        compile: compile the blocks with ``torch.compile``, each in place (regional
            compilation: `course_utils.training.compile_blocks`).
        grad_accum_steps: micro-batches per optimizer step (>= 1); the effective batch is
            ``batch_size * grad_accum_steps``.
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.
        seed: seed for weights and data.
        loss_chunk: tokens per chunk of the chunked cross-entropy
            (`course_utils.chunked_loss.chunked_cross_entropy`: the head and the loss computed
            a chunk at a time, so the full logits never exist); 0 (default) is the plain
            ``head`` + ``F.cross_entropy``.

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
        _check_dimensions(self, ("batch_size", "grad_accum_steps"))
        check_positive_int("loss_chunk", self.loss_chunk, minimum=0)  # 0: the plain loss
        autocast_dtype(self.precision)  # raises on an unknown precision
        if device_kind(self.device) not in DEVICE_KINDS:
            raise ValueError(tr("unknown device {device!r}: expected 'cpu', 'cuda', 'cuda:N' or "
                                "'mps'.", device=self.device))
        parse_policy(self.checkpoint, self.shape.n_layers)  # raises on an unfitting policy

    # The shape's fields, read through the config (config.n_layers, ...).
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
        """A short name such as ``bf16+full``, ``fp32`` or ``fp32+loss-chunk:64`` for tables and
        charts."""
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
    """The error message for field names that are neither the run's nor the shape's."""
    return tr("unknown RunConfig field(s) {unknown}: valid are {valid}.", unknown=sorted(unknown),
              valid=sorted(_SHAPE_FIELDS + _RUN_FIELDS))

#: Model and batch dimensions per size profile (``batch_size`` is the run's; the rest is the
#: shape's). The byte vocabulary is always 256.
SIZE_PROFILES: dict[str, dict] = {
    "smoke": dict(n_layers=2, d_model=64, n_heads=2, seq_len=32, batch_size=4),
    "cpu": dict(n_layers=4, d_model=256, n_heads=4, seq_len=128, batch_size=8),
    "t4": dict(n_layers=4, d_model=768, n_heads=12, seq_len=512, batch_size=8),  # README: T4 guide
    # 6 blocks: the width sets how well tensor cores are used, the depth only multiplies a
    # lesson's time (results/gpu-budget.md: a lesson in about a minute on an H100)
    "a100": dict(n_layers=6, d_model=1024, n_heads=16, seq_len=1024, batch_size=16),
    "h100": dict(n_layers=6, d_model=1536, n_heads=16, seq_len=1024, batch_size=16),
}


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
    kw = dict(SIZE_PROFILES[size])
    kw.update(overrides)
    kw.setdefault("device", default_device())
    shape_kw = {k: kw.pop(k) for k in list(kw) if k in _SHAPE_FIELDS}
    unknown = set(kw) - set(_RUN_FIELDS)
    if unknown:
        raise ValueError(_unknown_fields(unknown))
    return RunConfig(shape=ModelShape(**shape_kw), **kw)


def step_flops(config: RunConfig) -> float:
    """Approximate FLOPs of one training step: 6 x matmul parameters x tokens + attention.

    Source: the 6ND rule (Kaplan et al. 2020, arXiv 2001.08361), attention term
    12 x L x seq x d per token (Chinchilla, Hoffmann et al. 2022, arXiv 2203.15556, Table 4).
    """
    L, d, T = config.n_layers, config.d_model, config.seq_len
    matmul_params = L * 12 * d * d + d * config.vocab_size
    tokens = config.tokens_per_step
    return 6.0 * matmul_params * tokens + 12.0 * L * T * d * tokens
