r"""LoRA on a frozen low-precision base (lesson 03): the adapter the lesson writes, and its bytes.

LoRA (Hu et al. 2021, arXiv 2106.09685) freezes the weights ``W`` and trains ``y = x W^T +
(x A^T B^T) * alpha / r`` beside each targeted Linear, ``A`` (r x in), ``B`` (out x r) = 0 at the
start; here on a frozen bf16 base, fp32 adapters with AdamW, the course's `train_step` under bf16
autocast. **Bytes of a LoRA step** (`estimate`; ``N`` base and ``n`` adapter parameters, ``B``
micro-batch, ``T`` tokens, ``d`` width, ``V`` vocabulary, ``L`` blocks):

* parameters ``b N + 4 n`` (``b`` = 2 for bf16, `NF4_BITS` / 8 for QLoRA's blocks' Linears);
  gradients ``4 n``; AdamW ``8 n`` + 4 bytes per adapter tensor (its step counter);
* saved with per-block checkpointing: each block's bf16 input, ``2 L B T d``; logits bucket per
  token: the final LayerNorm's input and statistics (``2 d + 4`` on a CPU, ``4 d + 8`` under
  CUDA autocast), the fp32 log-softmax ``4 V``, the targets ``8``; + 4;
* peak: parameters + AdamW state + the larger of the start of backward (saved + bf16 logits,
  two fp32 ``B T V`` gradient buffers, one block recomputed at
  `course_utils.memory_model.block_bytes_per_token` in bf16, the adapter gradients when
  micro-batches accumulate) and the optimizer step (adapter gradients + one fp32 temporary the
  size of the largest adapter tensor).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from .config import RunConfig
from .data import batches
from .i18n import tr
from .memory_model import (
    PEAK_PARTS,
    SCALE_MODELS,
    MemoryEstimate,
    block_bytes_per_token,
    parameter_count,
    peak_parts,
    scale_config,
)
from .memory_model import estimate as full_estimate
from .models import build_model
from .terms import GiB, check_positive_int
from .training import DEFAULT_MAX_GRAD_NORM, TrainState, train_step

__all__ = ["routes_table", "ADAM8_BYTES", "NF4_BITS", "TARGETS", "LoRALinear", "LoraEstimate",
           "adapter_count", "add_lora", "estimate", "routes", "setup"]

#: The Linears of the course's block that get an adapter (all four, as QLoRA recommends).
TARGETS = ("qkv", "proj", "fc1", "fc2")

#: Bits per parameter of QLoRA's NF4 storage with double quantisation: 4 + 0.127 for the
#: quantisation constants (Dettmers et al. 2023, "QLoRA", arXiv 2305.14314, Section 3).
NF4_BITS = 4.127

#: Bytes per parameter of 8-bit AdamW's two moments (Dettmers et al. 2022, "8-bit Optimizers via
#: Block-wise Quantization", arXiv 2110.02861), block constants left out (well under 1%).
ADAM8_BYTES = 2


class LoRALinear(nn.Module):
    """A frozen Linear plus a trainable low-rank update: y = base(x) + x A^T B^T * alpha / r."""

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0):
        super().__init__()
        self.base = base.requires_grad_(False)       # frozen: no gradient, no optimizer state
        device = base.weight.device
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features, device=device))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank, device=device))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))   # as nn.Linear initialises
        self.scale = alpha / rank                    # B = 0: training starts from the base

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale


def add_lora(model, rank=8, alpha=16.0, targets=("qkv", "proj", "fc1", "fc2"),
             base_dtype=torch.bfloat16):
    """Freeze ``model`` in ``base_dtype`` and give each Linear named in ``targets`` an fp32
    adapter of rank ``rank``; returns the model (changed in place)."""
    model.requires_grad_(False).to(base_dtype)       # the whole base: frozen, 2 bytes/param
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in targets and isinstance(child, nn.Linear):
                setattr(module, name, LoRALinear(child, rank, alpha))   # fp32 adapters
    return model


def _linear_shapes(d: int) -> dict:
    """(in, out) of each Linear of the course's block."""
    return {"qkv": (d, 3 * d), "proj": (d, d), "fc1": (d, 4 * d), "fc2": (4 * d, d)}


def _check_targets(targets) -> tuple:
    targets = tuple(targets)
    unknown = set(targets) - set(TARGETS)
    if not targets or unknown:
        raise ValueError(tr("targets must be a non-empty subset of {targets}, got {got!r}.",
                            targets=TARGETS, got=targets))
    return targets


def adapter_count(config: RunConfig, rank: int = 8, targets=TARGETS) -> int:
    """Adapter parameters of ``config``'s model: ``r (in + out)`` per targeted Linear per block
    (``16 r d`` per block with all four); ValueError for a rank below 1 or an unknown target."""
    check_positive_int("rank", rank)
    shapes = _linear_shapes(config.d_model)
    return config.n_layers * sum(rank * sum(shapes[t]) for t in _check_targets(targets))


def setup(config: RunConfig, rank: int = 8, alpha: float = 16.0, targets=TARGETS,
          lr: float = 1e-3, adapt=None):
    """A `course_utils.training.TrainState` of ``config``'s model with `add_lora` applied (or
    ``adapt``, a function of the same signature): AdamW over the adapters only, no GradScaler.
    ValueError for a precision other than ``bf16``, a rank below 1, an unknown target, or a
    device this machine lacks."""
    if config.precision != "bf16":
        raise ValueError(tr("a LoRA model here has a bf16 base and runs under bf16 autocast: pass "
                            "config.replace(precision='bf16'), not {precision!r}.",
                            precision=config.precision))
    check_positive_int("rank", rank)
    targets = _check_targets(targets)
    model = (adapt or add_lora)(build_model(config), rank, alpha, targets)
    adapters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(adapters, lr=lr, weight_decay=0.0)
    scaler = torch.amp.GradScaler(config.device_type, enabled=False)
    return TrainState(config, model, model, optimizer, scaler, batches(config), lr,
                      DEFAULT_MAX_GRAD_NORM, train_step)


@dataclass
class LoraEstimate(MemoryEstimate):
    """Estimated bytes of one LoRA step (module docstring): `MemoryEstimate`'s fields, plus the
    adapters' ``rank`` and ``n_adapter`` (adapter parameters)."""

    rank: int
    n_adapter: int


def estimate(config: RunConfig, rank: int = 8, targets=TARGETS,
             base_bytes_per_param: float = 2.0) -> LoraEstimate:
    """Bytes of one LoRA training step of ``config`` with per-block checkpointing (module
    docstring). ``base_bytes_per_param``: the frozen blocks' Linear weights (2: bf16; QLoRA:
    ``NF4_BITS / 8``); the rest of the base stays bf16. ValueError for a policy other than
    ``full``, a rank below 1, an unknown target."""
    if config.checkpoint != "full":
        raise ValueError(tr("lora.estimate models per-block checkpointing (checkpoint='full'), "
                            "the LoRA route of lesson 03; got {policy!r}.",
                            policy=config.checkpoint))
    targets = _check_targets(targets)
    B, T, d, V, L = (config.batch_size, config.seq_len, config.d_model, config.vocab_size,
                     config.n_layers)
    BT = B * T
    N = parameter_count(config)
    n = adapter_count(config, rank, targets)
    linear_w = L * 12 * d * d                     # the blocks' Linear weights
    base = 2 * (N - linear_w) + base_bytes_per_param * linear_w
    n_tensors = 2 * L * len(targets)
    parameters = math.ceil(base) + 4 * n
    gradients = 4 * n
    optimizer_state = 8 * n + 4 * n_tensors
    activations = 2 * L * BT * d
    final_ln = (4 * d + 8) if config.device_type == "cuda" else (2 * d + 4)
    logits = BT * (final_ln + 4 * V + 8) + 4
    recompute = int(block_bytes_per_token(config.replace(precision="bf16")) * BT)
    largest = max(rank * i for t in targets for i in _linear_shapes(d)[t])
    start_of_backward = (activations + logits + BT * V * (2 + 8) + recompute
                         + (gradients if config.grad_accum_steps > 1 else 0))
    optimizer_step = gradients + 4 * largest
    peak = parameters + optimizer_state + max(start_of_backward, optimizer_step)
    state = {"weights": parameters, "AdamW state": optimizer_state}
    if start_of_backward >= optimizer_step:
        held = gradients if config.grad_accum_steps > 1 else 0
        moment, parts = "start of backward", {
            **state, "gradients": held, "saved tensors": activations + logits,
            "temporaries": start_of_backward - held - activations - logits}
    else:
        moment, parts = "optimizer step", {**state, "gradients": gradients, "saved tensors": 0,
                                           "temporaries": 4 * largest}
    return LoraEstimate(config=config, rank=rank, parameters=parameters, gradients=gradients,
                        optimizer_state=optimizer_state, activations=activations,
                        autocast_weight_copies=0, logits=logits, peak_allocated=int(peak),
                        recompute=recompute, n_parameters=N, peak_moment=moment,
                        peak_components={k: int(v) for k, v in parts.items()}, n_adapter=n)


def routes(model: str = "7B", gpu_bytes: int = 24 * GiB, rank: int = 16, micro_batch: int = 1,
           accum: int = 16, seq_len: int | None = None) -> pd.DataFrame:
    """Fine-tuning ``model`` (a key of `course_utils.memory_model.SCALE_MODELS`) on one GPU of
    ``gpu_bytes``, micro-batches of ``micro_batch`` accumulated ``accum`` times, per-block
    checkpointing: four routes estimated side by side, full fine-tune (bf16 autocast), LoRA
    (`estimate`), QLoRA (`NF4_BITS`), and 8-bit AdamW: `ADAM8_BYTES` per parameter and no
    temporary of every parameter in its step (bitsandbytes' ``Optimizer8bit.step`` updates one
    parameter at a time in place, where PyTorch's ``foreach`` AdamW holds ``4 N`` bytes).

    Returns one row per route: ``route``, ``trains`` (parameters trained), ``weights``,
    ``gradients``, ``optimizer``, ``activations`` (saved + logits + one recomputed block), ``peak``
    (GiB), ``fits``, ``peak_bytes``, ``peak at`` (the moment of the peak) and ``at peak: <part>``
    (GiB, for each of `memory_model.PEAK_PARTS`).

    Raises:
        ValueError: an unknown model, a rank, micro-batch or accumulation below 1.
    """
    for name, v in (("micro_batch", micro_batch), ("accum", accum)):
        check_positive_int(name, v)
    if model not in SCALE_MODELS:
        raise ValueError(tr("unknown model {model!r}: expected one of {names}.", model=model,
                            names=", ".join(SCALE_MODELS)))
    shape = {} if seq_len is None else {"seq_len": seq_len}
    cfg = scale_config(model, micro_batch, "bf16", "full", **shape).replace(grad_accum_steps=accum)
    full = full_estimate(cfg)
    lora = estimate(cfg, rank)
    qlora = estimate(cfg, rank, base_bytes_per_param=NF4_BITS / 8)
    adam8_state = ADAM8_BYTES * full.n_parameters
    adam8_moment, adam8_parts = max(
        ((moment, {**parts, "AdamW state": adam8_state,
                   **({"temporaries": 0} if moment == "optimizer step" else {})})
         for moment, parts in peak_parts(cfg)), key=lambda mp: sum(mp[1].values()))
    rows = []

    def row(route, trains, e, moment, parts, optimizer=None):
        peak = sum(parts.values())
        rows.append({"route": route, "trains": trains, "weights": e.parameters / GiB,
                     "gradients": e.gradients / GiB,
                     "optimizer": (e.optimizer_state if optimizer is None else optimizer) / GiB,
                     "activations": (e.saved_total + e.recompute) / GiB, "peak": peak / GiB,
                     "fits": peak <= gpu_bytes, "peak_bytes": int(peak), "peak at": moment,
                     **{f"at peak: {k}": parts.get(k, 0) / GiB for k in PEAK_PARTS}})

    N = full.n_parameters
    row(tr("full fine-tune (bf16 autocast + checkpointing)"), f"{N / 1e9:.2f}B", full,
        full.peak_moment, full.peak_components)
    row(tr("LoRA r={rank}, frozen bf16 base (+ checkpointing)", rank=rank),
        f"{lora.n_adapter / 1e6:.1f}M", lora, lora.peak_moment, lora.peak_components)
    row(tr("next: QLoRA r={rank}, NF4 base (+ checkpointing)", rank=rank),
        f"{qlora.n_adapter / 1e6:.1f}M", qlora, qlora.peak_moment, qlora.peak_components)
    row(tr("next: 8-bit AdamW, full fine-tune"), f"{N / 1e9:.2f}B", full, adam8_moment,
        adam8_parts, optimizer=adam8_state)
    return pd.DataFrame(rows)


def routes_table(routes: pd.DataFrame) -> pd.DataFrame:
    """`routes`' result as a readable table indexed by route: ``trains``, ``weights GiB``,
    ``gradients GiB``, ``optimizer GiB``, ``peak GiB`` (one decimal) and ``fits``."""
    out = routes.set_index("route")[["trains"]].copy()
    for col in ("weights", "gradients", "optimizer", "peak"):
        out[f"{col} GiB"] = [round(float(v), 1) for v in routes[col]]
    out["fits"] = routes["fits"].to_numpy()
    return out
