r"""The analytic memory model: bytes of a training step of the course's GPT, in closed form.

`estimate(config)` returns a `MemoryEstimate` with the same memory field names as
`course_utils.measure.Measurement` (``parameters``, ``gradients``, ``optimizer_state``,
``activations``, ``autocast_weight_copies``, ``logits``, ``peak_allocated``).

Notation: ``B`` batch, ``T`` sequence length, ``d`` width, ``h`` heads, ``L`` layers,
``V = 256`` vocabulary, ``a`` bytes per element of autocast's low-precision dtype (4 in fp32,
2 in bf16/fp16), ``N`` parameters.

**Parameters** (this model, untied head): ``N = V d + T d + L (12 d^2 + 13 d) + 2 d + V d``;
bytes ``4 N`` (autocast keeps fp32 parameters). **Gradients**: ``4 N``. **AdamW state**:
two fp32 moments, ``8 N``, plus a 4-byte step counter per parameter tensor (PyTorch's
``torch.optim.AdamW``). Hence 16 bytes/parameter for weights + grads + AdamW in fp32 *and*
under autocast (claim C9 of the course; the "mixed precision 16 bytes" of Rajbhandari et al.
2020, ZeRO, arXiv 1910.02054, counts fp16 weights + fp16 grads + fp32 master + Adam instead).

**Saved activations of one block** (per token, bytes), derived the way Korthikanti et al.
2022 ("Reducing Activation Recomputation in Large Transformer Models", arXiv 2205.05198,
Section 4.1) derive their ``sbh(34 + 5as/h)``, but for this model: no dropout, a pre-LN block
whose residual stream and LayerNorm stay fp32 under autocast, and SDPA attention that saves
no ``T x T`` matrix::

    8 d          block input (LayerNorm 1) and mid-block residual (LayerNorm 2), fp32
  + 14 a d       LN1 out (d), q k v (3d), attention out (d), LN2 out (d), fc1 out (4d),
                 GELU out (4d): the inputs that matmuls, SDPA and GELU keep
  + 16           LayerNorm mean and rstd, 2 LayerNorms x 2 x fp32
  + 4 h          SDPA's logsumexp, fp32

fp32: ``64 d + 16 + 4h`` per token (16 "copies" of the hidden state, cf. the 24-48 copies
Bekman's ml-engineering measured in Hugging Face models with dropout). bf16: ``36 d + 16 + 4h``,
i.e. 0.5625x of fp32 at large d, *not* 0.5x (claim C2). Naive attention replaces the
logsumexp by the softmax output ``h T s`` per token (``s`` = a, or 6 on CUDA where autocast
runs softmax in fp32 and the next matmul keeps a low-precision copy) plus a ``T x T`` bool mask.

**Policies.** ``full`` / a checkpointed segment keeps only its input, ``4 d`` per token
(PyTorch non-reentrant checkpoint). ``selective`` keeps the block input plus the outputs of the
matmuls (qkv 3d, proj d, fc1 4d, fc2 d) and of attention (d, logsumexp): ``4 d + 10 a d + 4 h``.
The embedding keeps the token indices (``8 B T``) and positions (``8 T``).

**Autocast weight copies**: each Linear inside a block that is *not* recomputed keeps its
low-precision weight, ``12 d^2 a`` per block, plus ``V d a`` for the head (0 in fp32).

**Logits bucket** (final LayerNorm, head, loss): ``B T (4 d + 8 + a d + 4 V + 8) + 4``
(LayerNorm input and stats, head input, fp32 log-softmax, targets, the loss's scalar). That is
a CPU's autocast, whose list runs ``cross_entropy`` in fp32; CUDA's list puts only ``nll_loss``
there, so under autocast on CUDA the log-softmax stays in ``a`` bytes and ``nll_loss`` keeps an
fp32 copy of it: ``(a + 4) V`` instead of ``4 V`` (the H100 run in ``results/``: 2 V bytes a
token above this model's ``4 V`` in bf16 and fp16, exactly). With the
chunked cross-entropy (``loss_chunk`` C > 0, `course_utils.chunked_loss`) the ``4 V`` of the
log-softmax term becomes the 4-byte fp32 log-sum-exp of each token and the scalar goes:
``B T (4 d + 8 + a d + 8 + 4)``. The head's weight copy (``V d a`` under autocast) is saved in
both.

**Peak** (a model of the step's timeline, not a bound; `peak_walk` lists its checkpoints).
Parameters + AdamW state are alive throughout. The forward pass ends with every kept tensor
alive; the loss's backward adds ``B T V (a + 8)`` bytes: the logits the training step still holds
(``a``) and two fp32 gradients of them (CUDA under autocast: ``B T V (a + 4)``, one fp32
gradient: measured on an H200 with torch 2.11, 4 bytes a logit above the start of backward);
with the chunked loss it adds instead the gradient of its input, the fp32 sum of the head's
weight gradient and one chunk's fp32 logits turned gradient, ``B T d a + 4 V d + C V (4 + a)``
(``C V 4`` in fp32; `course_utils.chunked_loss.chunked_loss_bytes` has the exact maximum, read
from its code and equal to the CPU profiler's peak: ``tests/test_chunked_loss.py``).
Then backward visits the units of the checkpoint policy from the last to the first: a
checkpointed unit first recomputes its blocks' activations (the recompute bump), then each
block's backward holds a transient of its gradient buffers, ``tau = 16 d`` bytes per token in
fp32 and ``20 d`` under autocast (measured: the peak of one block's backward above its saved
tensors, for d = 64-384 and batches 4-16 on a CPU), reached inside the MLP's backward when
about half of the block's weight gradients (``4 (12 d^2 + 13 d)`` bytes a block) exist; a
selective unit rebuilds what it did not
keep plus the attention-projection and fc2 outputs it did (``2 a d``); as a unit's backward ends
its kept tensors are freed.
So the peak is the largest of: the start of backward; each unit's level (everything kept below
it, every gradient above it) plus its bump; and the optimizer step: parameters + AdamW state +
gradients + AdamW's temporaries: on a CPU, PyTorch's default single-tensor AdamW holds about two
temporaries of the largest parameter tensor (measured on the course model); on CUDA its default
``foreach`` implementation holds one temporary of every parameter, ``4 N`` bytes (measured with
``foreach=True`` on a CPU: ``tests/test_memory_model.py``). With gradient accumulation, the
micro-batches after the first run with every ``.grad`` buffer (``4 N``) alive.
Where the peak falls moves with the policy: early in backward without checkpointing (the last
block's backward), late in backward for ``full`` and ``segments:N`` (the first units recompute
when most gradients exist), in the middle for ``every-K``, at the optimizer step when the
micro-batch is small next to the model. `peak_parts` lists every moment with the parts alive
then; `estimate` reports the largest as ``peak_moment`` / ``peak_at`` with its
``peak_components``, which sentences and charts read instead of re-deriving them. Measured against
the CPU profiler's peak: within 2% for
every policy in fp32 at the ``cpu`` size (batches 1-16); within 5% for widths 128-384,
and -6% at the ``smoke`` width (64, where the 256-byte vocabulary dominates) with ``full`` at
batch 12 (``tests/test_memory_model.py``). Measured again on 2026-11-26 (torch 2.13, a Xeon with
AMX, and the same capped to AVX2; 2 blocks of the ``cpu`` width, batches 8 and 32): fp32 within
1.1% for none, full and selective; bf16 *over*-estimated by 4-6% without checkpointing, 8-11% with
selective and 7-17% with full, growing with the batch (the per-token backward transient ``tau``
under autocast is smaller on these kernels than the 20 d above). A later run of lesson 05 at
batch 32 printed fp32 +1.7% without checkpointing and +4.1% with full (the AVX2-capped Xeon), and
bf16 +6.7% and +16.9% (the AMX Xeon): fp32 within a few percent, bf16 over-estimated most with
full checkpointing at a large batch. Lesson 05 prints that gap beside the extrapolation's; a
tighter bf16 transient is open work.

Over 400 lines because every closed-form byte count lives here with its source formula:
`estimate`, the peak walk and the sharded and scaled estimates share them, and a formula written
twice would drift.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

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
    """Estimated bytes of one training step; field names match `Measurement`.

    Attributes:
        parameters, gradients, optimizer_state, activations, autocast_weight_copies, logits,
        peak_allocated: bytes (see the module docstring for each formula).
        recompute: bytes of the largest checkpointed segment's activations, rebuilt in backward.
        n_parameters: the parameter count ``N``.
        peak_moment: the moment of the step where the estimated peak falls (a moment of
            `peak_parts`: ``"start of backward"``, ``"backward of block 3"`` (or ``"backward
            of blocks 0-1"`` for a checkpointed segment), ``"optimizer step"``, with
            `` (later micro-batch)`` under accumulation).
        peak_components: bytes alive at that moment, by part of `PEAK_PARTS`; they sum to
            ``peak_allocated`` (up to rounding to whole bytes).
    """

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
        """Where the estimated peak falls, in words: ``"the optimizer step"``, ``"the start of
        backward"``, ``"the backward of block 3"``."""
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
    """``N = 2 V d + T d + L (12 d^2 + 13 d) + 2 d`` for the course's GPT
    (`course_utils.config.ModelShape.n_parameters`)."""
    return config.shape.n_parameters


def largest_parameter_tensor(config: RunConfig) -> int:
    """Elements of the model's largest parameter tensor: ``max(4 d^2, V d, T d)``."""
    d = config.d_model
    return max(4 * d * d, config.vocab_size * d, config.seq_len * d)


def _elem_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def block_bytes_per_token(config: RunConfig) -> float:
    """Saved bytes of one plain block per token (see the module docstring)."""
    a = _elem_bytes(config.precision)
    d, h, T = config.d_model, config.n_heads, config.seq_len
    per_token = 8 * d + 14 * a * d + 16
    if config.attention == "sdpa":
        per_token += 4 * h
    else:
        cuda_low = config.device_type == "cuda" and config.precision != "fp32"
        s = 6 if cuda_low else a
        per_token += h * T * s + T * T / (config.batch_size * T)  # mask: T*T bytes per batch
    return per_token


def _cuda_low(config: RunConfig) -> bool:
    """Autocast on CUDA, whose list keeps ``cross_entropy``'s log-softmax in low precision."""
    return config.device_type == "cuda" and config.precision != "fp32"


def _logits_bytes(config: RunConfig) -> int:
    """The logits bucket's saved bytes (see the module docstring): the plain loss's log-softmax
    (``4 V`` a token; ``(a + 4) V`` under CUDA's autocast), or the chunked loss's log-sum-exp."""
    a, d, BT = _elem_bytes(config.precision), config.d_model, config.batch_size * config.seq_len
    if config.loss_chunk:
        return BT * (4 * d + 8 + a * d + 8) + chunked_loss_bytes(
            BT, d, config.vocab_size, config.loss_chunk, a)["saved"]
    log_softmax = (a + 4) if _cuda_low(config) else 4
    return BT * (4 * d + 8 + a * d + log_softmax * config.vocab_size + 8) + 4


def _loss_backward_bytes(config: RunConfig) -> int:
    """What the loss adds at the start of backward: the plain loss's logits and their
    gradients, ``B T V (a + 8)`` (``(a + 4)`` under CUDA's autocast), or the chunked loss's
    buffers (`course_utils.chunked_loss.chunked_loss_bytes`)."""
    a, BT, V = _elem_bytes(config.precision), config.batch_size * config.seq_len, config.vocab_size
    if config.loss_chunk:
        return chunked_loss_bytes(BT, config.d_model, V, config.loss_chunk, a,
                                  config.device_type)["backward"]
    return BT * V * (a + (4 if _cuda_low(config) else 8))


def _units(config: RunConfig) -> list[tuple[int, object]]:
    """The checkpoint policy as ``(blocks, mode)`` units in forward order: mode ``"plain"``,
    ``"checkpointed"``, ``"selective"`` or the memory budget B (a float)."""
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
    """The checkpoints of the peak model (see the module docstring), in the order they happen
    in one training step: ``(moment, {part: bytes})`` for every part of `PEAK_PARTS` alive then.

    ``saved tensors`` are what forward kept for backward and has not been freed yet (block
    activations, autocast weight copies, the logits bucket); ``temporaries`` are what exists
    only at that moment: the logits and their gradients, or the chunked loss's buffers (start of
    backward), a checkpointed unit's recomputation plus one block's backward buffers and the
    gradient of the hidden state (backward of a unit), AdamW's temporaries (optimizer step).

    Raises:
        ValueError: through `RunConfig` validation only.
    """
    a = _elem_bytes(config.precision)
    low = config.precision != "fp32"
    B, T, d, V = config.batch_size, config.seq_len, config.d_model, config.vocab_size
    BT = B * T
    block = block_bytes_per_token(config) * BT
    wcopy_block = 12 * d * d * a if low else 0
    selective = (4 * d + 10 * a * d + 4 * config.n_heads) * BT
    tau = (20 if low else 16) * d * BT  # one block's backward transient (measured)
    grad_block = 4 * (12 * d * d + 13 * d)
    # forward order: (kept after forward, bump when its backward starts, blocks)
    # at a block's backward peak (inside its MLP) about half of its weight gradients exist
    tau += grad_block / 2
    units = []
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
    embedding = 8 * BT + 8 * T
    logits = _logits_bytes(config)
    head_copy = V * d * a if low else 0
    kept = embedding + sum(u[0] for u in units)
    grads_all = 4 * parameter_count(config)
    state = {"weights": 4 * parameter_count(config),
             "AdamW state": 8 * parameter_count(config) + 4 * (5 + 12 * config.n_layers)}
    walk = []
    # With accumulation, micro-batches after the first run with every .grad buffer alive.
    for later in ((False, True) if config.grad_accum_steps > 1 else (False,)):
        tag, held = (_LATER, grads_all) if later else ("", 0)
        walk.append(("start of backward" + tag,
                     {**state, "gradients": held, "saved tensors": kept + logits + head_copy,
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
    # AdamW's step: PyTorch's default is the foreach implementation on CUDA, which holds a
    # temporary of every parameter (4 N bytes); on a CPU the single-tensor one, which holds about
    # two temporaries of the largest parameter tensor (measured on the course model).
    temp = grads_all if config.device_type == "cuda" else 2 * 4 * largest_parameter_tensor(config)
    walk.append(("optimizer step", {**state, "gradients": grads_all, "saved tensors": 0,
                                    "temporaries": temp}))
    return walk


def peak_walk(config: RunConfig) -> list[tuple[str, float]]:
    """The checkpoints of the peak model: ``(moment, bytes)`` above parameters + AdamW state,
    in the order they happen in one training step (`peak_parts` without the weights and AdamW
    state, summed).

    Raises:
        ValueError: through `RunConfig` validation only.
    """
    return [(moment, sum(v for k, v in parts.items() if k not in ("weights", "AdamW state")))
            for moment, parts in peak_parts(config)]


def _moment_words(moment: str) -> str:
    """``"backward of block 3"`` -> ``"the backward of block 3"``, ``"optimizer step"`` -> ``"the
    optimizer step"`` (for sentences, in the learner's language; `peak_parts`' moments stay
    English, the values code compares)."""
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
    """Estimate the memory of one training step of ``config`` (bytes).

    Raises:
        ValueError: through `RunConfig` validation only (the model covers every valid config).
    """
    a = _elem_bytes(config.precision)
    low = config.precision != "fp32"
    B, T, d, h, V = (config.batch_size, config.seq_len, config.d_model, config.n_heads,
                     config.vocab_size)
    BT = B * T
    N = parameter_count(config)
    n_tensors = 5 + 12 * config.n_layers

    block = block_bytes_per_token(config) * BT
    block_in = 4 * d * BT
    wcopy_block = 12 * d * d * a if low else 0
    selective = (4 * d + 10 * a * d + 4 * h) * BT

    activations = 8 * BT + 8 * T  # token indices, positions (embedding backward)
    wcopies = V * d * a if low else 0  # the head's weight copy
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
        else:  # memory-budget B: the partitioner keeps about a fraction B of the activations
            b = mode
            activations += n * (block_in + b * (block - block_in))
            wcopies += n * wcopy_block * b
            recompute = max(recompute, (1 - b) * (block - block_in))
    logits = _logits_bytes(config)

    parameters = 4 * N
    gradients = 4 * N
    optimizer_state = 8 * N + 4 * n_tensors
    moment, parts = max(peak_parts(config), key=lambda mp: sum(mp[1].values()))
    peak = parameters + optimizer_state + max(v for _, v in peak_walk(config))
    return MemoryEstimate(
        config=config, parameters=parameters, gradients=gradients,
        optimizer_state=optimizer_state, activations=int(activations),
        autocast_weight_copies=int(wcopies), logits=int(logits), peak_allocated=int(peak),
        recompute=int(recompute), n_parameters=N, peak_moment=moment,
        peak_components={k: int(v) for k, v in parts.items()})


# --- memory at scale (estimates) -----------------------------------------------------------

#: GPT-like shapes whose parameter count comes out near their name with the course's block
#: (4d MLP, full multi-head attention), a 32000-token vocabulary and 2048-token sequences:
#: 1.04B, 6.71B and 69.8B. 7B has LLaMA-7B's 32 layers of width 4096; LLaMA-2-70B has 80
#: layers of width 8192 but a wider MLP and grouped-query attention, so with this block 86
#: layers give its size.
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
    """A `RunConfig` of a large model for `estimate` (not runnable here: it is only
    estimated), on a CUDA device.

    Args:
        model: a key of `SCALE_MODELS` (``"7B"``) or a `ModelShape`.
        shape_changes: e.g. ``seq_len=4096``.

    Raises:
        ValueError: an unknown model name or an invalid field.
    """
    if isinstance(model, str):
        if model not in SCALE_MODELS:
            raise ValueError(tr("unknown model {model!r}: expected one of {models} or a "
                                "ModelShape.", model=model, models=", ".join(SCALE_MODELS)))
        model = SCALE_MODELS[model]
    return RunConfig(shape=model.replace(**shape_changes), batch_size=batch_size,
                     precision=precision, checkpoint=checkpoint, device="cuda")


def scale_table(models=None, recipes=None, seq_len: int = 2048, batch_size: int = 1,
                detail: bool = False) -> pd.DataFrame:
    """Estimated memory of one training step (AdamW) per model and recipe, in GiB.

    Args:
        models: ``{name: ModelShape}`` (default `SCALE_MODELS`).
        recipes: ``{name: (precision, checkpoint)}`` (default `SCALE_RECIPES`).
        seq_len, batch_size: tokens per sequence and sequences per micro-batch.
        detail: every column (below) instead of the readable seven.

    Returns:
        One row per (model, recipe). Default columns: ``model``, ``recipe``, ``params (B)``
        (billions), ``training state GiB`` (weights + gradients + AdamW state), ``saved GiB``
        (everything forward keeps for backward: activations, autocast weight copies, logits),
        ``peak GiB`` and ``peak at`` (the moment of the step where the estimated peak falls,
        `MemoryEstimate.peak_at`). With ``detail``: also ``weights``, ``gradients``,
        ``AdamW state``, ``weight copies``, ``activations`` (saved activations + the logits
        bucket), ``bytes/param`` (weights + gradients + AdamW per parameter) and, for the parts of
        `PEAK_PARTS`, ``at peak: <part>``: the bytes alive at the peak moment, which sum to the
        peak. GiB = 2^30 bytes. All values are estimates. The default table's
        ``attrs["detail"]`` holds the full one (for `course_utils.plots.scale_chart`).

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
    """`scale_table` over micro-batches: where the estimated peak moves as the batch grows.

    Args:
        batch_sizes: micro-batches (sequences of ``seq_len`` tokens), each >= 1.
        models, recipes, seq_len: as `scale_table`.

    Returns:
        One row per (model, recipe, micro-batch): ``model``, ``recipe``, ``micro-batch``,
        ``params (B)``, ``peak GiB``, ``peak at`` and ``optimizer step GiB`` (the bytes alive at
        the optimizer step: weights, gradients, AdamW state and its temporaries, the same at
        every batch: the floor under the peak). GiB = 2^30 bytes; estimates only.

    Raises:
        ValueError: no batch sizes, a batch size below 1, or as `scale_table`.
    """
    if not batch_sizes:
        raise ValueError(tr("scale_sweep needs at least one batch size."))
    for b in batch_sizes:
        check_positive_int("batch size", b)
    parts = []
    for b in batch_sizes:
        t = scale_table(models, recipes, seq_len=seq_len, batch_size=b, detail=True)
        t.insert(2, "micro-batch", b)
        parts.append(t)
    full = pd.concat(parts, ignore_index=True)
    models = SCALE_MODELS if models is None else models
    floor = {}
    for name, shape in models.items():
        for rname, (precision, policy) in (SCALE_RECIPES if recipes is None else recipes).items():
            cfg = scale_config(shape, 1, precision, policy, seq_len=seq_len)
            floor[(name, rname)] = sum(dict(peak_parts(cfg))["optimizer step"].values()) / GiB
    full["optimizer step GiB"] = [floor[(m, r)] for m, r in zip(full["model"], full["recipe"])]
    return full[["model", "recipe", "micro-batch", "params (B)", "peak GiB", "peak at",
                 "optimizer step GiB"]]


# --------------------------------------------------------------------------------------------
# Sharding the training state across data-parallel ranks (ZeRO stages; lesson 04)
# --------------------------------------------------------------------------------------------

#: ZeRO stages: 0 = plain data parallelism (DDP), 1 = optimizer state sharded, 2 = + gradients,
#: 3 = + parameters (FSDP's ``fully_shard``).
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class ShardedState:
    """Bytes of the training state one rank holds under a ZeRO stage (see
    `sharded_state_bytes`).

    Attributes:
        stage: the ZeRO stage (0-3).
        world_size: data-parallel ranks ``K``.
        n_parameters: the model's parameter count ``N``.
        parameters, gradients, optimizer_state: bytes on one rank.
    """

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
        """The fields and the total as a flat dict."""
        return {"stage": self.stage, "world_size": self.world_size,
                "parameters": self.parameters, "gradients": self.gradients,
                "optimizer_state": self.optimizer_state, "total": self.total}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def sharded_state_bytes(n_parameters: int, world_size: int, stage: int,
                        n_tensors: int = 0) -> ShardedState:
    """Per-rank bytes of weights, gradients and AdamW state when ``world_size`` data-parallel
    ranks shard them by ZeRO ``stage``.

    The unsharded state is the course's 16 bytes per parameter (PyTorch autocast, and FSDP2
    with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, keep fp32 weights, fp32
    gradients and two fp32 AdamW moments: 4 + 4 + 8). With ``N`` parameters, ``K`` ranks and
    ``T`` parameter tensors (one 4-byte AdamW step counter each), bytes on one rank:

    =========  ===================  ===================  =================================
    stage      parameters           gradients            optimizer state
    =========  ===================  ===================  =================================
    0 (DDP)    ``4N``               ``4N``               ``8N + 4T``
    1          ``4N``               ``4N``               ``ceil(8N/K) + 4 ceil(T/K)``
    2          ``4N``               ``ceil(4N/K)``       ``ceil(8N/K) + 4 ceil(T/K)``
    3 (FSDP)   ``ceil(4N/K)``       ``ceil(4N/K)``       ``ceil(8N/K) + 4T``
    =========  ===================  ===================  =================================

    Stage 3 keeps every step counter on every rank because FSDP splits every tensor across all
    ranks; stages 1 and 2 (``ZeroRedundancyOptimizer``) hand whole tensors to ranks. Real
    shards differ slightly: FSDP pads a tensor's first dimension to a multiple of ``K``, and
    ``ZeroRedundancyOptimizer`` balances whole tensors greedily, so one rank may hold a few
    percent more than ``1/K``.

    Source: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
    Parameter Models" (arXiv 1910.02054), Figure 1 and Section 5 (stages P_os, P_os+g,
    P_os+g+p; their 16 bytes are fp16 weights and gradients + 12 bytes of fp32 optimizer state);
    PyTorch docs of ``torch.distributed.fsdp.fully_shard`` and
    ``torch.distributed.optim.ZeroRedundancyOptimizer``.

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
    full_params, full_grads = 4 * N, 4 * N
    shard_params, shard_grads = _ceil_div(4 * N, K), _ceil_div(4 * N, K)
    if stage == 0:
        optimizer = 8 * N + 4 * T
    elif stage == 3:
        optimizer = _ceil_div(8 * N, K) + 4 * T
    else:
        optimizer = _ceil_div(8 * N, K) + 4 * _ceil_div(T, K)
    return ShardedState(stage=stage, world_size=K, n_parameters=N,
                        parameters=shard_params if stage == 3 else full_params,
                        gradients=shard_grads if stage >= 2 else full_grads,
                        optimizer_state=optimizer)


def sharded_estimate(config: RunConfig, world_size: int, stage: int) -> ShardedState:
    """`sharded_state_bytes` for the course model of ``config``: ``N`` and ``T`` are those of
    `estimate` (``T`` read back from its AdamW state, ``8N + 4T``), so that with one rank every
    stage equals `estimate`'s ``parameters + gradients + optimizer_state``.

    Raises:
        ValueError: as `sharded_state_bytes`.
    """
    e = estimate(config)
    n_tensors = (e.optimizer_state - 8 * e.n_parameters) // 4
    return sharded_state_bytes(e.n_parameters, world_size, stage, n_tensors)
