r"""The analytic memory model: bytes of a training step of the course's GPT, in closed form.

`estimate(config)` returns a `MemoryEstimate` with `Measurement`'s fields (docs/method.md#estimates).
Notation: ``B`` batch, ``T`` sequence, ``d`` width, ``h`` heads, ``V`` vocabulary, ``N``
parameters, ``a`` bytes of autocast's dtype (4 fp32, 2 bf16/fp16). Sources: weights + gradients
+ AdamW are ``16 N`` bytes in fp32 *and* under autocast (claim C9; ZeRO's 16, Rajbhandari et al.
2020, arXiv 1910.02054, count fp16 weights and an fp32 master copy); a block's saved activations
are derived as Korthikanti et al. 2022 (arXiv 2205.05198, Section 4.1) derive their
``sbh(34 + 5as/h)`` (`block_bytes_per_token`); the peak walk (`peak_parts`) is within a few
percent of the CPU profiler's peak in fp32, above it by up to 17 % in bf16 with full
checkpointing at a large batch (tests/test_memory_model.py; lesson 05 prints it).

Over 400 lines because every closed-form byte count lives here with its source formula:
`estimate`, the peak walk and the sharded and scaled estimates share them.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import pandas as pd

from .checkpointing import parse_policy, segment_bounds
from .chunked_loss import chunked_loss_bytes
from .config import ModelShape, RunConfig
from .i18n import tr
from .terms import GiB, check_positive_int

__all__ = ["MemoryEstimate", "estimate", "parameter_count", "block_bytes_per_token",
           "largest_parameter_tensor", "peak_walk", "peak_parts", "PEAK_PARTS", "SCALE_MODELS",
           "SCALE_RECIPES",
           "scale_config", "scale_table", "scale_sweep", "ZERO_STAGES", "ShardedState", "sharded_state_bytes",
           "sharded_estimate"]


@dataclass
class MemoryEstimate:
    """Estimated bytes of one training step, in the fields of `Measurement`; ``recompute``: the
    largest checkpointed segment's activations, rebuilt in backward; ``n_parameters``: ``N``;
    ``peak_moment``: the moment of `peak_parts` where the peak falls, and ``peak_components``
    the bytes alive then by part of `PEAK_PARTS` (their sum is ``peak_allocated``, to a byte)."""

    config: RunConfig
    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    autocast_weight_copies: int
    logits: int
    peak_allocated: int
    recompute: int
    n_parameters: int
    peak_moment: str
    peak_components: dict

    @property
    def peak_at(self) -> str:
        """Where the estimated peak falls, in words: ``"the backward of block 3"``."""
        return _moment_words(self.peak_moment)

    @property
    def saved_total(self) -> int:
        """All saved-tensor bytes: activations + autocast weight copies + logits."""
        return self.activations + self.autocast_weight_copies + self.logits

    def as_row(self) -> dict:
        """The memory fields as a flat dict."""
        return {k: getattr(self, k) for k in (
            "parameters", "gradients", "optimizer_state", "activations",
            "autocast_weight_copies", "logits", "peak_allocated", "recompute", "saved_total")}


def parameter_count(config: RunConfig) -> int:
    """``N = 2 V d + T d + L (12 d^2 + 13 d) + 2 d`` for the course's GPT (untied head;
    `course_utils.config.ModelShape.n_parameters`)."""
    return config.shape.n_parameters


def largest_parameter_tensor(config: RunConfig) -> int:
    """Elements of the model's largest parameter tensor: ``max(4 d^2, V d, T d)``."""
    d = config.d_model
    return max(4 * d * d, config.vocab_size * d, config.seq_len * d)


def _elem_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def _cuda_low(config: RunConfig) -> bool:
    """Autocast on CUDA, whose list keeps ``cross_entropy``'s log-softmax in low precision."""
    return config.device_type == "cuda" and config.precision != "fp32"


def block_bytes_per_token(config: RunConfig) -> float:
    """Saved bytes of one plain block per token: ``8 d`` (the two LayerNorm inputs, fp32) +
    ``14 a d`` (LN outputs, q k v, attention out, fc1 and GELU outputs) + ``16`` (LayerNorm
    statistics) + SDPA's fp32 logsumexp ``4 h``. Naive attention keeps instead its softmax,
    ``h T s`` (``s = 6`` under CUDA's autocast: an fp32 softmax and a low-precision copy),
    and a ``T x T`` bool mask per batch."""
    a = _elem_bytes(config.precision)
    d, h, T = config.d_model, config.n_heads, config.seq_len
    per_token = 8 * d + 14 * a * d + 16
    if config.attention == "sdpa":
        per_token += 4 * h
    else:
        s = 6 if _cuda_low(config) else a
        per_token += h * T * s + T * T / (config.batch_size * T)  # mask: T*T bytes per batch
    return per_token


def _sizes(config: RunConfig) -> tuple:
    """``a``, ``B T``, a plain block's saved bytes, its weight copies (``12 d^2 a`` under
    autocast) and a selective block's saved bytes (``4 d + 10 a d + 4 h`` a token)."""
    a, d, BT = _elem_bytes(config.precision), config.d_model, config.batch_size * config.seq_len
    wcopy_block = 12 * d * d * a if config.precision != "fp32" else 0
    selective = (4 * d + 10 * a * d + 4 * config.n_heads) * BT
    return a, BT, block_bytes_per_token(config) * BT, wcopy_block, selective


def _logits_bytes(config: RunConfig) -> int:
    """The final LayerNorm, head and loss: ``B T (4 d + 8 + a d + 4 V + 8) + 4``, with ``(a + 4) V``
    for ``4 V`` under CUDA's autocast (its list runs only ``nll_loss`` in fp32: 2 V bytes a token
    more in the H100 run in ``results/``), or the chunked loss's fp32 log-sum-exp for ``4 V``."""
    a, d, BT = _elem_bytes(config.precision), config.d_model, config.batch_size * config.seq_len
    if config.loss_chunk:
        return BT * (4 * d + 8 + a * d + 8) + chunked_loss_bytes(
            BT, d, config.vocab_size, config.loss_chunk, a)["saved"]
    log_softmax = (a + 4) if _cuda_low(config) else 4
    return BT * (4 * d + 8 + a * d + log_softmax * config.vocab_size + 8) + 4


def _loss_backward_bytes(config: RunConfig) -> int:
    """What the loss adds at the start of backward: the logits and two fp32 gradients of them,
    ``B T V (a + 8)`` (one under CUDA's autocast, ``a + 4``: measured on an H200, torch 2.11), or
    the chunked loss's buffers (`course_utils.chunked_loss.chunked_loss_bytes`)."""
    a, BT, V = _elem_bytes(config.precision), config.batch_size * config.seq_len, config.vocab_size
    if config.loss_chunk:
        return chunked_loss_bytes(BT, config.d_model, V, config.loss_chunk, a,
                                  config.device_type)["backward"]
    return BT * V * (a + (4 if _cuda_low(config) else 8))


def _units(config: RunConfig) -> list[tuple[int, object]]:
    """The policy as ``(blocks, mode)`` units in forward order; mode: a word or the budget B."""
    p = parse_policy(config.checkpoint, config.n_layers)
    L = config.n_layers
    if p.mode == "none":
        return [(L, "plain")]
    if p.mode == "full":
        return [(1, "checkpointed")] * L
    if p.mode == "selective":
        return [(1, "selective")] * L
    if p.mode == "every-k":
        return [(1, "checkpointed" if i % p.arg == 0 else "plain") for i in range(L)]
    if p.mode == "segments":
        return [(b - a, "checkpointed") for a, b in segment_bounds(L, p.arg)]
    return [(L, float(p.arg))]


#: The parts of the bytes alive at a moment of the step, as `peak_parts` names them.
PEAK_PARTS = ("weights", "AdamW state", "gradients", "saved tensors", "temporaries")


def peak_parts(config: RunConfig) -> list[tuple[str, dict]]:
    """The moments of one training step, in order, as ``(moment, {part: bytes})`` for the parts
    of `PEAK_PARTS` alive then: the start of backward; the backward of each checkpoint unit,
    last to first (its recomputation and one block's backward transient, ``16 d`` a token in
    fp32 and ``20 d`` under autocast, measured on a CPU for d = 64-384); the optimizer step.
    With accumulation, later micro-batches run with every ``.grad`` buffer alive."""
    a, BT, block, wcopy_block, selective = _sizes(config)
    low = config.precision != "fp32"
    T, d, V = config.seq_len, config.d_model, config.vocab_size
    tau = (20 if low else 16) * d * BT  # one block's backward transient (measured)
    grad_block = 4 * (12 * d * d + 13 * d)
    # at a block's backward peak (inside its MLP) about half of its weight gradients exist
    tau += grad_block / 2
    units = []  # forward order: (kept after forward, bump when its backward starts, blocks)
    for n, mode in _units(config):
        if mode == "plain":
            units += [(block + wcopy_block, tau, 1)] * n
        elif mode == "selective":  # rebuilds what it did not keep, and the proj/fc2 outputs
            rebuilt = block - selective + 2 * a * d * BT + wcopy_block
            units += [(selective, rebuilt + tau, 1)] * n
        elif mode == "checkpointed":
            units.append((4 * d * BT, n * (block + wcopy_block) + tau, n))
        else:  # memory-budget B
            kept = n * (4 * d * BT + mode * (block - 4 * d * BT) + mode * wcopy_block)
            units.append((kept, n * (block + wcopy_block) - kept + tau, n))
    kept = 8 * BT + 8 * T + sum(u[0] for u in units)  # the embedding's indices and positions
    saved_all = kept + _logits_bytes(config) + (V * d * a if low else 0)  # + the head's copy
    grads_all = 4 * parameter_count(config)
    state = {"weights": 4 * parameter_count(config),
             "AdamW state": 8 * parameter_count(config) + 4 * (5 + 12 * config.n_layers)}
    walk = []
    for later in ((False, True) if config.grad_accum_steps > 1 else (False,)):
        tag, held = (_LATER, grads_all) if later else ("", 0)
        walk.append(("start of backward" + tag,
                     {**state, "gradients": held, "saved tensors": saved_all,
                      "temporaries": _loss_backward_bytes(config)}))
        grads = held + (0 if later else 4 * (V * d + 2 * d))
        saved = kept
        for i in range(len(units) - 1, -1, -1):
            kept_u, bump, n = units[i]
            first = sum(u[2] for u in units[:i])
            where = f"block {first}" if n == 1 else f"blocks {first}-{first + n - 1}"
            if later:  # the unit's gradients exist already: no half-block allocated in its bump
                bump -= grad_block / 2
            walk.append((f"backward of {where}" + tag,
                         {**state, "gradients": grads, "saved tensors": saved,
                          "temporaries": 4 * d * BT + bump}))
            grads += 0 if later else n * grad_block
            saved -= kept_u
    # AdamW's default on CUDA (foreach) holds a temporary of every parameter, 4 N bytes; on a
    # CPU (single-tensor) about two of the largest parameter tensor (measured on the course model).
    temp = grads_all if config.device_type == "cuda" else 2 * 4 * largest_parameter_tensor(config)
    walk.append(("optimizer step", {**state, "gradients": grads_all, "saved tensors": 0,
                                    "temporaries": temp}))
    return walk


def peak_walk(config: RunConfig) -> list[tuple[str, float]]:
    """`peak_parts` summed without the weights and AdamW state: ``(moment, bytes)``.
    """
    return [(moment, sum(v for k, v in parts.items() if k not in ("weights", "AdamW state")))
            for moment, parts in peak_parts(config)]


def _moment_words(moment: str) -> str:
    """A moment of `peak_parts` (English, the value code compares) in the learner's language:
    ``"backward of block 3"`` -> ``"the backward of block 3"``."""
    base, later = moment, ""
    if moment.endswith(_LATER):
        base, later = moment[:-len(_LATER)], tr(" (later micro-batch)")
    if base == "start of backward":
        return tr("the start of backward") + later
    if base == "optimizer step":
        return tr("the optimizer step") + later
    if m := re.fullmatch(r"backward of block (\d+)", base):
        return tr("the backward of block {block}", block=int(m.group(1))) + later
    if m := re.fullmatch(r"backward of blocks (\d+)-(\d+)", base):
        return tr("the backward of blocks {first}-{last}", first=int(m.group(1)),
                  last=int(m.group(2))) + later
    return "the " + moment


#: What `peak_parts` adds to a moment of a micro-batch after the first (accumulation).
_LATER = " (later micro-batch)"


def estimate(config: RunConfig) -> MemoryEstimate:
    """Estimate the memory of one training step of ``config`` (bytes). A checkpointed unit
    keeps its input, ``4 d`` a token; ``memory-budget:B`` about a fraction B of the activations.
    """
    a, BT, block, wcopy_block, selective = _sizes(config)
    d, T = config.d_model, config.seq_len
    N = parameter_count(config)
    n_tensors = 5 + 12 * config.n_layers
    block_in = 4 * d * BT

    activations = 8 * BT + 8 * T  # token indices, positions (embedding backward)
    wcopies = config.vocab_size * d * a if config.precision != "fp32" else 0  # the head's copy
    recompute = 0
    for n, mode in _units(config):
        if mode == "plain":
            activations += n * block
            wcopies += n * wcopy_block
        elif mode == "selective":
            activations += n * selective
            recompute = max(recompute, block - selective + wcopy_block)
        elif mode == "checkpointed":
            activations += block_in
            recompute = max(recompute, n * (block + wcopy_block))
        else:  # memory-budget B
            activations += n * (block_in + mode * (block - block_in))
            wcopies += n * wcopy_block * mode
            recompute = max(recompute, (1 - mode) * (block - block_in))
    logits = _logits_bytes(config)

    parameters = 4 * N
    optimizer_state = 8 * N + 4 * n_tensors
    moment, parts = max(peak_parts(config), key=lambda mp: sum(mp[1].values()))
    peak = parameters + optimizer_state + max(v for _, v in peak_walk(config))
    return MemoryEstimate(
        config=config, parameters=parameters, gradients=4 * N,
        optimizer_state=optimizer_state, activations=int(activations),
        autocast_weight_copies=int(wcopies), logits=int(logits), peak_allocated=int(peak),
        recompute=int(recompute), n_parameters=N, peak_moment=moment,
        peak_components={k: int(v) for k, v in parts.items()})


# --- memory at scale (estimates) -----------------------------------------------------------

#: GPT-like shapes with the course's block (4d MLP, full multi-head attention), a 32000-token
#: vocabulary and 2048-token sequences: 1.04B, 6.71B and 69.8B parameters. 7B has LLaMA-7B's 32
#: layers of width 4096; LLaMA-2-70B's wider MLP and grouped-query attention take 86 layers here.
SCALE_MODELS: dict[str, ModelShape] = {
    "1B": ModelShape(n_layers=18, d_model=2048, n_heads=16, seq_len=2048, vocab_size=32000),
    "7B": ModelShape(n_layers=32, d_model=4096, n_heads=32, seq_len=2048, vocab_size=32000),
    "70B": ModelShape(n_layers=86, d_model=8192, n_heads=64, seq_len=2048, vocab_size=32000),
}

#: The recipes of `scale_table`: name -> (precision, checkpoint policy).
SCALE_RECIPES = {"fp32": ("fp32", "none"),
                 "bf16 autocast": ("bf16", "none"),
                 "bf16 autocast + full ckpt": ("bf16", "full")}


def scale_config(model: str | ModelShape, batch_size: int = 1, precision: str = "bf16",
                 checkpoint: str = "none", **shape_changes) -> RunConfig:
    """A CUDA `RunConfig` of ``model`` (a key of `SCALE_MODELS` or a `ModelShape`, changed by
    ``shape_changes`` such as ``seq_len=4096``), only for `estimate`; ValueError for an unknown
    name or an invalid field."""
    if isinstance(model, str):
        if model not in SCALE_MODELS:
            raise ValueError(tr("unknown model {model!r}: expected one of {models} or a "
                                "ModelShape.", model=model, models=", ".join(SCALE_MODELS)))
        model = SCALE_MODELS[model]
    return RunConfig(shape=model.replace(**shape_changes), batch_size=batch_size,
                     precision=precision, checkpoint=checkpoint, device="cuda")


def scale_table(models=None, recipes=None, seq_len: int = 2048, batch_size: int = 1,
                detail: bool = False) -> pd.DataFrame:
    """Estimated memory of one training step (AdamW) per model of ``models`` (default
    `SCALE_MODELS`) and recipe ``{name: (precision, checkpoint)}`` (default `SCALE_RECIPES`), in
    GiB: ``params (B)``, ``training state GiB``, ``saved GiB``, ``peak GiB`` and ``peak at``
    (`MemoryEstimate.peak_moment`). ``detail``: also each part of the state and of the saved
    tensors, ``bytes/param`` and ``at peak: <part>`` for `PEAK_PARTS` (the default table's
    ``attrs["detail"]``).

    Raises:
        ValueError: empty ``models``/``recipes`` or invalid sizes.
    """
    models = SCALE_MODELS if models is None else models
    recipes = SCALE_RECIPES if recipes is None else recipes
    if not models or not recipes:
        raise ValueError(tr("scale_table needs at least one model and one recipe."))
    rows = []
    for mname, shape in models.items():
        for rname, (precision, policy) in recipes.items():
            e = estimate(scale_config(shape, batch_size, precision, policy, seq_len=seq_len))
            state = e.parameters + e.gradients + e.optimizer_state
            row = {"model": mname, "recipe": rname,
                   "params (B)": e.n_parameters / 1e9,
                   "training state GiB": state / GiB,
                   "saved GiB": e.saved_total / GiB,
                   "peak GiB": e.peak_allocated / GiB,
                   "peak at": e.peak_moment,
                   "weights": e.parameters / GiB, "gradients": e.gradients / GiB,
                   "AdamW state": e.optimizer_state / GiB,
                   "weight copies": e.autocast_weight_copies / GiB,
                   "activations": (e.activations + e.logits) / GiB,
                   "bytes/param": state / e.n_parameters}
            for part in PEAK_PARTS:
                row[f"at peak: {part}"] = e.peak_components.get(part, 0) / GiB
            rows.append(row)
    full = pd.DataFrame(rows)
    if detail:
        return full
    out = full[["model", "recipe", "params (B)", "training state GiB", "saved GiB", "peak GiB",
                "peak at"]].copy()
    out.attrs["detail"] = full
    return out


def scale_sweep(batch_sizes=(1, 2, 4, 8, 16, 32), models=None, recipes=None,
                seq_len: int = 2048) -> pd.DataFrame:
    """`scale_table` over micro-batches of ``batch_sizes`` sequences: where the peak moves. One
    row per (model, recipe, micro-batch), with ``optimizer step GiB``, the floor under the peak.

    Raises:
        ValueError: no batch sizes, a batch size below 1, or as `scale_table`.
    """
    if not batch_sizes:
        raise ValueError(tr("scale_sweep needs at least one batch size."))
    for b in batch_sizes:
        check_positive_int("batch size", b)
    full = pd.concat([scale_table(models, recipes, seq_len=seq_len, batch_size=b, detail=True)
                      .assign(**{"micro-batch": b}) for b in batch_sizes], ignore_index=True)
    floor = {}
    for name, shape in (SCALE_MODELS if models is None else models).items():
        for rname, (precision, policy) in (SCALE_RECIPES if recipes is None else recipes).items():
            cfg = scale_config(shape, 1, precision, policy, seq_len=seq_len)
            floor[(name, rname)] = sum(dict(peak_parts(cfg))["optimizer step"].values()) / GiB
    full["optimizer step GiB"] = [floor[(m, r)] for m, r in zip(full["model"], full["recipe"])]
    return full[["model", "recipe", "micro-batch", "params (B)", "peak GiB", "peak at",
                 "optimizer step GiB"]]


# --- sharding the training state across data-parallel ranks (ZeRO stages; lesson 04) ---------

#: ZeRO stages: 0 = plain data parallelism (DDP), 1 = optimizer state sharded, 2 = + gradients,
#: 3 = + parameters (FSDP's ``fully_shard``).
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class ShardedState:
    """Bytes of the training state one rank holds (``parameters``, ``gradients``,
    ``optimizer_state``) under ZeRO ``stage``, ``world_size`` ranks and ``n_parameters``."""

    stage: int
    world_size: int
    n_parameters: int
    parameters: int
    gradients: int
    optimizer_state: int

    @property
    def total(self) -> int:
        """Parameters + gradients + optimizer state, bytes on one rank."""
        return self.parameters + self.gradients + self.optimizer_state

    def as_row(self) -> dict:
        """The fields but ``n_parameters``, and the total, as a flat dict."""
        return {k: v for k, v in asdict(self).items() if k != "n_parameters"} | {"total": self.total}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def sharded_state_bytes(n_parameters: int, world_size: int, stage: int,
                        n_tensors: int = 0) -> ShardedState:
    """Per-rank bytes of the course's 16 bytes per parameter (fp32 weights, gradients and AdamW
    moments, as autocast and FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``
    keep them) sharded by ZeRO ``stage``; ``N`` parameters, ``K`` ranks, ``T`` tensors:

    =========  ===================  ===================  =================================
    stage      parameters           gradients            optimizer state
    =========  ===================  ===================  =================================
    0 (DDP)    ``4N``               ``4N``               ``8N + 4T``
    1          ``4N``               ``4N``               ``ceil(8N/K) + 4 ceil(T/K)``
    2          ``4N``               ``ceil(4N/K)``       ``ceil(8N/K) + 4 ceil(T/K)``
    3 (FSDP)   ``ceil(4N/K)``       ``ceil(4N/K)``       ``ceil(8N/K) + 4T``
    =========  ===================  ===================  =================================

    FSDP splits every tensor (every rank keeps every step counter); ``ZeroRedundancyOptimizer``
    hands whole tensors to ranks. Source: Rajbhandari et al. 2020, ZeRO (arXiv 1910.02054),
    Section 5; PyTorch docs of ``fully_shard`` and ``ZeroRedundancyOptimizer``.

    Raises:
        ValueError: ``n_parameters`` or ``world_size`` not a positive integer, ``n_tensors``
            negative, or a stage outside `ZERO_STAGES`.
    """
    for name, v, low in (("n_parameters", n_parameters, 1), ("world_size", world_size, 1),
                         ("n_tensors", n_tensors, 0)):
        check_positive_int(name, v, minimum=low)
    if stage not in ZERO_STAGES or isinstance(stage, bool):
        raise ValueError(tr("unknown ZeRO stage {stage!r}: expected one of {stages}.", stage=stage,
                            stages=", ".join(map(str, ZERO_STAGES))))
    N, K, T = n_parameters, world_size, n_tensors
    shard = _ceil_div(4 * N, K)
    if stage == 0:
        optimizer = 8 * N + 4 * T
    else:
        optimizer = _ceil_div(8 * N, K) + 4 * (T if stage == 3 else _ceil_div(T, K))
    return ShardedState(stage=stage, world_size=K, n_parameters=N,
                        parameters=shard if stage == 3 else 4 * N,
                        gradients=shard if stage >= 2 else 4 * N, optimizer_state=optimizer)


def sharded_estimate(config: RunConfig, world_size: int, stage: int) -> ShardedState:
    """`sharded_state_bytes` with `estimate`'s ``N`` and ``T`` for ``config``: with one rank
    every stage equals `estimate`'s ``parameters + gradients + optimizer_state``."""
    e = estimate(config)
    n_tensors = (e.optimizer_state - 8 * e.n_parameters) // 4
    return sharded_state_bytes(e.n_parameters, world_size, stage, n_tensors)
