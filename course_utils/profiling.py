"""The course's measurements applied to *your* model (lesson 05, ``course-profile``): `profile`.

Any ``nn.Module`` and a function that makes a batch are measured as lessons 01-03 measure the
course's GPT, one `ProfileMeasurement` per precision and checkpoint policy: step time timed in
alternation with its noise band, peak allocated memory, saved tensors by module, and the first
step's gradients against ``none``. A policy reaches the model through its repeated blocks
(`find_blocks`), each replaced in place by a wrapper (`wrap_blocks`; the policies: `POLICIES`).
How each number is taken: docs/method.md.

Over 400 lines because `profile` is one pipeline over any model with its own record types: find
the blocks, wrap them, build the training state, measure its memory, time and tabulate.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, noop_context_fn
from tqdm.auto import tqdm

from .checkpointing import SelectiveContexts, save_matmuls_and_attention
from .config import size_profile
from .experiments import paired_step_s, plain_label, sig_text, time_cell
from .guard import available_memory_bytes
from .hardware import detect, is_emulated, require_device
from .i18n import tr
from .measure import EMULATED_TIMING, Measurement, noting_out_of_memory, time_in_alternation
from .memory_timeline import memory_timeline, phase
from .offload import OffloadedBlock, offloaded_bytes
from .saved_tensors import SavedTensorMeter, storage_bytes
from .step_timing import default_budget_s, time_ratio
from .terms import (
    GiB,
    MiB,
    PrecisionOnDevice,
    autocast_dtype,
    check_positive_int,
    default_device,
    device_kind,
)

__all__ = ["POLICIES", "GRADIENT_ROUNDING", "NoRepeatedBlocks", "ModelDoesNotFit", "ProfileConfig",
           "ProfileMeasurement", "Profile", "ModelSpec", "find_blocks", "CheckpointedBlock",
           "wrap_blocks", "hf_method", "parse_model_policy", "block_of", "default_loss", "call_model",
           "to_device", "profile", "measure_config", "static_bytes"]

#: The policies `profile` takes (K: an integer from 1 to the number of blocks).
POLICIES = ("none", "full", "every-K", "selective", "offload", "offload+checkpoint", "hf")


class NoRepeatedBlocks(ValueError):
    """The model has no ``nn.ModuleList`` / ``nn.Sequential`` of same-class blocks to wrap."""


class ModelDoesNotFit(ValueError):
    """Parameters, gradients and optimizer state alone exceed the memory available."""


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _candidates(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2
            and len({type(c) for c in m}) == 1 and _n_params(m) > 0]


def find_blocks(model: nn.Module, blocks: str | nn.Module | None = None) -> tuple[str, nn.Module]:
    """The repeated blocks of ``model``: ``(path, container)``, path ``""`` for ``model`` itself.

    ``blocks``: a dotted path as in ``model.named_modules()``, the container itself, or None to
    find it: of the ``nn.ModuleList`` and ``nn.Sequential`` with at least 2 same-class children
    and parameters, the one with the most parameters (then children). Raises `NoRepeatedBlocks`
    (none found, or ``blocks`` names none) or TypeError (``model`` is not an ``nn.Module``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(tr("profile needs a torch.nn.Module (or a function returning one), got "
                           "{kind}.", kind=type(model).__name__))
    if isinstance(blocks, str):
        try:
            found = model.get_submodule(blocks) if blocks else model
        except AttributeError:
            raise NoRepeatedBlocks(tr("{model} has no submodule {blocks!r}; its lists of blocks: "
                                      "{lists}.", model=type(model).__name__, blocks=blocks,
                                      lists=_describe(model))) from None
        if not isinstance(found, (nn.ModuleList, nn.Sequential)) or len(found) < 1:
            raise NoRepeatedBlocks(tr("{blocks!r} is a {kind}, not an nn.ModuleList or "
                                      "nn.Sequential of blocks.", blocks=blocks,
                                      kind=type(found).__name__))
        return blocks, found
    if isinstance(blocks, nn.Module):
        for name, m in model.named_modules():
            if m is blocks:
                return find_blocks(model, name)
        raise NoRepeatedBlocks(tr("the blocks you passed are not a submodule of this model."))
    if blocks is not None:
        raise TypeError(tr("blocks is a dotted path, a module or None, got {kind}.",
                           kind=type(blocks).__name__))
    cands = _candidates(model)
    if not cands:
        raise NoRepeatedBlocks(tr(
            "no repeated blocks found in {model}: checkpoint policies wrap the modules of an "
            "nn.ModuleList or nn.Sequential of at least 2 same-class modules with parameters, and "
            "it has none ({lists}). Put the repeated part of the model in an nn.ModuleList, or "
            "name it with blocks='path.to.list'.", model=type(model).__name__,
            lists=_describe(model)))
    return max(cands, key=lambda c: (_n_params(c[1]), len(c[1])))


def block_of(module_name: str, blocks_path: str) -> int | None:
    """The index of the block that a module named ``module_name`` (as in ``named_modules()``)
    belongs to, for blocks at ``blocks_path``; None outside the blocks."""
    prefix = f"{blocks_path}." if blocks_path else ""
    if not module_name.startswith(prefix):
        return None
    head = module_name[len(prefix):].split(".")[0]
    return int(head) if head.isdigit() else None


def _describe(model: nn.Module) -> str:
    lists = [f"{name or tr('(the model)')}: {len(m)} x "
             f"{'/'.join(sorted({type(c).__name__ for c in m}))}"
             for name, m in model.named_modules() if isinstance(m, (nn.ModuleList, nn.Sequential))]
    return "; ".join(lists[:6]) if lists else tr("no nn.ModuleList or nn.Sequential at all")


class CheckpointedBlock(nn.Module):
    """One block under non-reentrant ``checkpoint``, keyword arguments passed through (Hugging Face
    decoder layers need them); ``context_fn``: a `course_utils.checkpointing.SelectiveContexts`."""

    def __init__(self, block: nn.Module, context_fn=noop_context_fn):
        super().__init__()
        self.block = block
        self.context_fn = context_fn

    def forward(self, *args, **kwargs):
        return checkpoint(self.block, *args, use_reentrant=False, context_fn=self.context_fn,
                          **kwargs)


def parse_model_policy(policy: str, n_blocks: int) -> tuple[str, int | None]:
    """``(mode, K)`` of a policy of `POLICIES` for a model of ``n_blocks`` blocks; ValueError
    (listing `POLICIES`) for an unknown policy or K outside 1..n_blocks."""
    p = policy.strip().lower() if isinstance(policy, str) else None
    if p in ("none", "full", "selective", "offload", "offload+checkpoint", "hf"):
        return p, None
    if p and p.startswith("every-") and p[6:].isdigit() and 1 <= int(p[6:]) <= n_blocks:
        return "every-k", int(p[6:])
    raise ValueError(tr("checkpoint policy {policy!r} does not fit a model of {n_blocks} blocks: "
                        "valid policies are {policies} (K from 1 to {n_blocks}).", policy=policy,
                        n_blocks=n_blocks, policies=", ".join(POLICIES)))


def hf_method(model) -> str | None:
    """The method policy ``hf`` calls on ``model`` (an instance or a class), or None:
    ``activation_checkpointing_enable`` (transformers 5.24), else ``gradient_checkpointing_enable``
    (older releases; a deprecated alias in 5.24); either with ``use_reentrant=False``."""
    return next((name for name in ("activation_checkpointing_enable", "gradient_checkpointing_enable")
                 if hasattr(model, name)), None)


def _enable_hf(model: nn.Module) -> None:
    name = hf_method(model)
    if name is None:
        raise ValueError(tr("policy 'hf' calls a Hugging Face model's "
                            "gradient_checkpointing_enable(), and {model} has none: use 'full' "
                            "instead.", model=type(model).__name__))
    getattr(model, name)(**{name.replace("enable", "kwargs"): {"use_reentrant": False}})


def wrap_blocks(model: nn.Module, policy: str, blocks: str | nn.Module | None = None) -> nn.Module:
    """Apply ``policy`` (one of `POLICIES`) to ``model``'s repeated blocks, in place; return it.
    Parameters stay the same objects; ``hf`` calls the model's own method (`hf_method`). Raises
    `NoRepeatedBlocks` (see `find_blocks`), or ValueError for an unknown policy, ``hf`` without
    the method, or blocks wrapped already."""
    path, container = find_blocks(model, blocks)
    mode, k = parse_model_policy(policy, len(container))
    if any(isinstance(b, (CheckpointedBlock, OffloadedBlock)) for b in container):
        raise ValueError(tr("the blocks of {path!r} are wrapped already: wrap a fresh copy.",
                            path=path))
    if mode == "hf":
        _enable_hf(model)
        return model
    for i, block in enumerate(list(container)):
        if mode == "full" or (mode == "every-k" and i % k == 0):
            container[i] = CheckpointedBlock(block)
        elif mode == "selective":
            container[i] = CheckpointedBlock(block, SelectiveContexts(save_matmuls_and_attention))
        elif mode in ("offload", "offload+checkpoint"):
            container[i] = OffloadedBlock(block, checkpointed=mode == "offload+checkpoint")
    return model


def call_model(model: nn.Module, batch):
    """The default forward: ``model(**batch)`` for a dict, ``model(*batch)`` for a tuple or
    list, ``model(batch)`` for a tensor."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def default_loss(output, batch) -> torch.Tensor:
    """The loss in ``output``: ``output.loss`` (Hugging Face), the second element of a
    ``(logits, loss)`` tuple (the course's GPT), or ``output`` if a tensor; ValueError if none."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, (tuple, list)) and len(output) >= 2 \
            and isinstance(output[1], torch.Tensor):
        loss = output[1]
    if loss is None and isinstance(output, torch.Tensor):
        loss = output
    if loss is None:
        raise ValueError(tr("no loss in the model's output ({kind}): pass loss_fn=lambda output, "
                            "batch: ... returning a scalar tensor (or give a Hugging Face model "
                            "labels=... in the batch).", kind=type(output).__name__))
    return loss


def _check_loss(loss) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor):
        raise ValueError(tr("the loss must be a scalar tensor, got {kind}.",
                            kind=type(loss).__name__))
    if loss.dim() != 0:
        raise ValueError(tr("the loss is a tensor of shape {shape}, not a scalar: backward needs "
                            "one number. Reduce it (loss.mean()) or pass loss_fn, e.g. "
                            "loss_fn=lambda out, batch: F.cross_entropy(out, batch[1]).",
                            shape=tuple(loss.shape)))
    if not loss.requires_grad:
        raise ValueError(tr("the loss does not require grad: it does not depend on the model's "
                            "parameters (is the model in no_grad mode, or frozen?)."))
    return loss


def _batch_info(batch) -> tuple[int, str, int]:
    """``(batch size, unit, items per sample)``: ``tokens`` for integer ``(batch, seq)`` ids."""
    if isinstance(batch, dict):
        batch = list(batch.values())
    ts = [t for t in (batch if isinstance(batch, (tuple, list)) else [batch])
          if isinstance(t, torch.Tensor)]
    if not ts or ts[0].dim() == 0:
        raise ValueError(tr("make_batch must return a tensor, a tuple/list or a dict of tensors "
                            "whose first dimension is the batch."))
    first = ts[0]
    n = first.shape[0]
    if not first.is_floating_point() and not first.is_complex() and first.dim() >= 2:
        return n, "tokens", first[0].numel()
    return n, "samples", 1


def to_device(batch, device):
    """``batch`` with every tensor in it moved to ``device``: a tensor, or a dict, tuple or list
    of them (nested), other values kept (``use_cache=False``)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def _built_on(device: str, build: Callable[[], nn.Module]) -> nn.Module:
    """``build()`` under ``torch.device(device)`` (``meta``: no memory), else as it is."""
    try:
        with torch.device(device):
            return build()
    except Exception:  # noqa: BLE001 - built again without the context, where errors are its own
        return build()


@dataclass(frozen=True)
class ProfileConfig(PrecisionOnDevice):
    """What one row of a profile ran, where `Measurement` has a `RunConfig`: ``checkpoint`` is
    one of `POLICIES`; ``unit`` ``tokens`` (integer ``(batch, seq)`` input, ``items_per_sample``
    tokens each) or ``samples``; ``seed`` is set before each model is built and batch made."""

    model: str
    precision: str = "fp32"
    checkpoint: str = "none"
    batch_size: int = 1
    device: str = "cpu"
    unit: str = "samples"
    items_per_sample: int = 1
    grad_accum_steps: int = 1
    seed: int = 0

    @property
    def label(self) -> str:
        """``fp32``, ``bf16+full``... as `RunConfig.label`."""
        return self.precision + ("" if self.checkpoint == "none" else f"+{self.checkpoint}")

    @property
    def tokens_per_step(self) -> int:
        """Items (tokens, or samples: ``unit``) per optimizer step."""
        return self.batch_size * self.items_per_sample * self.grad_accum_steps

    def replace(self, **changes) -> "ProfileConfig":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


#: The largest first-step gradient difference from ``none``, as a share of the largest gradient,
#: that still counts as rounding: fp32 kernels that add in another order differ by about 1e-6 of
#: it; a low precision rounds each value to 2^-8 (bf16) or 2^-11 (fp16) of itself.
GRADIENT_ROUNDING = {"fp32": 1e-4, "bf16": 1e-2, "fp16": 1e-2}


@dataclass
class ProfileMeasurement(Measurement):
    """A `Measurement` of any model (``config`` a `ProfileConfig`; ``tokens_per_s`` counts its unit)
    with ``peak_forward_backward`` and ``peak_optimizer`` (peak bytes allocated in that phase,
    parameters and optimizer state included), ``bytes_to_host`` (copied by the ``offload``
    policies in the forward; ``weight_bytes_to_host``: the weights among them), ``grad_max_diff``
    (largest absolute first-step gradient difference from ``none`` in the same precision; None:
    not compared) beside ``grad_scale`` (that ``none`` step's largest gradient), and
    ``saved_modules`` (a DataFrame of the meter's saved tensors)."""

    peak_forward_backward: int | None = None
    peak_optimizer: int | None = None
    bytes_to_host: int = 0
    weight_bytes_to_host: int = 0
    grad_max_diff: float | None = None
    grad_scale: float | None = None
    saved_modules: Any = field(default=None, repr=False)

    @property
    def gradients_changed(self) -> bool:
        """True when the first-step gradients differ from ``none``'s by more than
        ``GRADIENT_ROUNDING[precision] x grad_scale``; ``selective`` did on an H100 with GPT-2's
        dropout (results/NVIDIA-H100-80GB-HBM3-2026-11-26/profile-gpt2.json)."""
        if self.grad_max_diff is None or not self.grad_scale:
            return False
        return self.grad_max_diff > GRADIENT_ROUNDING.get(self.config.precision, 1e-2) * self.grad_scale

    def as_row(self) -> dict:
        row = super().as_row()
        row.pop("saved_modules", None)
        return row


def static_bytes(model: nn.Module) -> int:
    """Bytes alive before any activation: each trainable parameter's storage x 4 (weight,
    gradient, AdamW's two moments), each frozen one's x 1."""
    return sum(p.numel() * p.element_size() * (4 if p.requires_grad else 1)
               for p in model.parameters())


@dataclass
class ModelSpec:
    """A model to profile: how to build a fresh copy, make a batch, run it and take its loss."""

    build: Callable[[], nn.Module]
    make_batch: Callable[[int], Any]
    loss_fn: Callable
    forward: Callable
    name: str
    blocks: str | None
    device: str
    seed: int = 0
    template: nn.Module | None = field(default=None, repr=False)

    @classmethod
    def create(cls, model, make_batch, loss_fn=None, *, forward=None, blocks=None, device=None,
               seed: int = 0, name: str | None = None) -> "ModelSpec":
        """Check the arguments and return a spec; raises as `profile` does."""
        device = device or default_device()
        require_device(device)
        if not callable(make_batch):
            raise TypeError(tr("make_batch must be a function: make_batch(batch_size) -> batch."))
        if isinstance(model, nn.Module):
            template = given = model

            def build(template=template):
                return copy.deepcopy(template)
        elif callable(model):
            def build(factory=model):
                torch.manual_seed(seed)
                m = factory()
                if not isinstance(m, nn.Module):
                    raise TypeError(tr("the model factory returned {kind}, not an nn.Module.",
                                       kind=type(m).__name__))
                return m
            given, template = None, _built_on("meta", build)
        else:
            raise TypeError(tr("profile needs an nn.Module or a function returning one, got "
                               "{kind}.", kind=type(model).__name__))
        path, _ = find_blocks(template, blocks)
        return cls(build, make_batch, loss_fn or default_loss, forward or call_model,
                   name or type(template).__name__, path, device, seed, given)

    def batch(self, batch_size: int):
        torch.manual_seed(self.seed + 1)
        return to_device(self.make_batch(batch_size), self.device)

    def skeleton(self) -> nn.Module:
        """The model to read, not to run: the module given, or the factory's on ``meta``."""
        return self.template if self.template is not None else _built_on("meta", self.build)

    def fresh(self, policy: str) -> nn.Module:
        """A fresh copy of the model with ``policy`` applied, on the device, in train mode."""
        model = self.build() if self.template is not None else _built_on(self.device, self.build)
        wrap_blocks(model, policy, self.blocks)
        return model.to(self.device).train()


@dataclass
class _State:
    config: ProfileConfig
    spec: ModelSpec
    module: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    batch: Any
    meter: SavedTensorMeter | None = None

    def step(self, grads: list | None = None):
        cfg = self.config
        with phase("forward"):
            if self.meter is not None:
                self.meter.__enter__()
            try:
                with cfg.autocast():
                    out = self.spec.forward(self.module, self.batch)
                    loss = _check_loss(self.spec.loss_fn(out, self.batch))
            finally:
                if self.meter is not None:
                    self.meter.__exit__(None, None, None)
            del out
        with phase("backward"):
            self.scaler.scale(loss).backward()
        if grads is not None:  # unscaled: fp16's GradScaler multiplies them by its scale (2^16 at first)
            inv = 1.0 / self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
            grads.extend(None if p.grad is None else p.grad.detach().float() * inv
                         for p in self.module.parameters())
        with phase("optimizer"):
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()


def _setup(spec: ModelSpec, cfg: ProfileConfig, lr: float) -> _State:
    module = spec.fresh(cfg.checkpoint)
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=lr)
    scaler = torch.amp.GradScaler(cfg.device_type, enabled=cfg.precision == "fp16")
    return _State(cfg, spec, module, optimizer, scaler, spec.batch(cfg.batch_size))


def _memory(state: _State) -> dict:
    """One metered step of ``state``: the memory fields of a `ProfileMeasurement`, and ``step_s``."""
    cfg = state.config
    params = storage_bytes(state.module.parameters())
    opt = storage_bytes(v for st in state.optimizer.state.values() for v in st.values()
                        if isinstance(v, torch.Tensor))
    state.meter = SavedTensorMeter(state.module, by_module=True)
    grads: dict = {}
    hooks = [p.register_post_accumulate_grad_hook(
        lambda p: grads.__setitem__(id(p), p.grad.untyped_storage().nbytes()))
        for p in state.module.parameters() if p.requires_grad]
    offloaded_bytes(state.module, reset=True)
    out = {"parameters": params, "optimizer_state": opt, "peak_reserved": None}
    t0 = time.perf_counter()
    try:
        if cfg.device_type in ("cpu", "cuda"):
            tl = memory_timeline(state.step, cfg.device)
            fb = max(tl.phase_peak("forward"), tl.phase_peak("backward"))
            out.update(peak_allocated=params + opt + tl.peak_bytes,
                       peak_forward_backward=params + opt + fb,
                       peak_optimizer=params + opt + tl.phase_peak("optimizer"),
                       peak_method=f"parameters + optimizer state + {tl.method}")
        else:
            state.step()
            out.update(peak_allocated=None, peak_method="not available: no peak-memory counter "
                       f"on {cfg.device}")
    finally:
        meter, state.meter = state.meter, None
        for h in hooks:
            h.remove()
    out["step_s"] = time.perf_counter() - t0
    out.update(meter.totals())
    out["gradients"] = sum(grads.values())
    out["bytes_to_host"], out["weight_bytes_to_host"] = offloaded_bytes(state.module, reset=True)
    recs = pd.DataFrame(meter.records, columns=["nbytes", "bucket", "shape", "dtype", "grad_fn",
                                                "module", "module_type"])
    out["saved_modules"] = recs[["module", "module_type", "bucket", "nbytes", "shape", "dtype"]]
    return out


def _size(n: int) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.2f} MiB" if n >= MiB else f"{n} bytes"


def _fits_or_raise(spec: ModelSpec, budget_bytes: int | None, hw) -> None:
    need = static_bytes(spec.skeleton())
    free = available_memory_bytes(hw)
    limits = [(budget_bytes, tr("the budget"))] if budget_bytes else []
    if free:
        limits.append((free, tr("the GPU memory free now") if hw.device == "cuda"
                        else tr("the RAM free now")))
    for limit, what in limits:
        if need > limit:
            raise ModelDoesNotFit(tr(
                "{model} does not fit before the first step: its parameters, gradients and AdamW "
                "state take {need} (16 bytes per fp32 parameter) and {limit_name} is {limit}, "
                "before any activation. No checkpoint policy or batch size changes that: shard "
                "the optimizer state (lesson 04), freeze most parameters (LoRA, lesson 03), or use "
                "a device with more memory.", model=spec.name, need=_size(need), limit_name=what,
                limit=_size(limit)))


def measure_config(spec: ModelSpec, cfg: ProfileConfig, *, lr: float = 1e-3, hw=None,
                   reference_grads: list | None = None, keep_state: bool = False):
    """Build, warm up (one step) and measure the memory of one configuration: ``(measurement,
    state, grads)``, a `ProfileMeasurement` (one step's time only if the precision is emulated;
    out of memory caught as ``oom=True``), the training state (None unless ``keep_state``), the
    first step's gradients (fp32 copies, unscaled)."""
    hw = hw or detect(cfg.device)
    m = ProfileMeasurement(config=cfg, device_name=hw.name, emulated=is_emulated(hw, cfg.precision))
    grads: list = []
    state = None
    try:
        with noting_out_of_memory(m):
            state = _setup(spec, cfg, lr)
            state.step(grads=grads)
            if reference_grads is not None and len(reference_grads) == len(grads):
                diffs = [0.0 if (a is None and b is None) else
                         (math.inf if (a is None or b is None) else (a - b).abs().max().item())
                         for a, b in zip(grads, reference_grads)]
                m.grad_max_diff = max(diffs) if diffs else 0.0
                m.grad_scale = max((b.abs().max().item() for b in reference_grads
                                    if b is not None and b.numel()), default=0.0)
            mem = _memory(state)
            step_s = mem.pop("step_s")
            for k, v in mem.items():
                setattr(m, k, v)
            if m.emulated:
                m.add_times([step_s])
                m.timing = EMULATED_TIMING
        if m.oom:
            state = None
    finally:
        if not keep_state:
            state = None
        if device_kind(cfg.device) == "cuda":
            torch.cuda.empty_cache()
    return m, state, grads


@dataclass
class Profile:
    """What `profile` measured on one model: ``blocks`` is the path of its repeated blocks,
    ``measurements`` one per (precision, policy) in the order run, ``size`` the size profile."""

    name: str
    blocks: str
    block_type: str
    n_blocks: int
    n_parameters: int
    static_bytes: int
    unit: str
    measurements: list = field(default_factory=list)
    size: str = ""

    def get(self, precision: str, policy: str) -> ProfileMeasurement:
        """The measurement of ``precision`` and ``policy``; KeyError (listing them) if none."""
        for m in self.measurements:
            if m.config.precision == precision and m.config.checkpoint == policy:
                return m
        raise KeyError(tr("{precision}+{policy} was not profiled: measured {labels}.",
                          precision=precision, policy=policy,
                          labels=[m.config.label for m in self.measurements]))

    def reference(self, m: ProfileMeasurement) -> ProfileMeasurement:
        """The row ``m`` is compared with: ``none`` in its precision (else the first row)."""
        try:
            return self.get(m.config.precision, "none")
        except KeyError:
            return self.measurements[0]

    def ratio(self, m: ProfileMeasurement):
        """`course_utils.step_timing.TimeRatio` of ``m``'s step time to its reference's."""
        ref = self.reference(m)
        return time_ratio(m.step_times_s, ref.step_times_s, size=self.size,
                          emulated=m.emulated or ref.emulated)

    def step_s(self, m: ProfileMeasurement) -> float | None:
        """``m``'s step time as the tables print it (seconds): the reference's median times
        ``m``'s per-round ratio (`ratio`), so that a row's milliseconds, ratio and throughput
        agree (`course_utils.experiments.paired_step_s`)."""
        ref = self.reference(m)
        if m is ref:
            return m.step_time_s
        return paired_step_s(m.step_time_s, ref.step_time_s, self.ratio(m))

    def gradients_text(self) -> str:
        """One sentence on the first step's gradients against ``none`` in each precision."""
        diffs = [m for m in self.measurements if m.grad_max_diff is not None]
        if not diffs:
            return tr("gradients: not compared")
        n = (tr("over all {n} configurations", n=len(diffs)) if len(diffs) > 1
             else tr("of the one configuration"))
        changed = [m for m in diffs if m.gradients_changed]
        if changed:
            return tr("gradients of the first step against 'none': {changes}: beyond rounding, so "
                      "that policy trains another model; do not use it. A likely cause: a random "
                      "op (dropout) whose output the policy keeps is not re-run in recomputation, "
                      "so the random ops after it draw other numbers (set dropout to 0, or leave "
                      "ops that draw random numbers out of a save list)", changes="; ".join(
                          tr("{config} CHANGED them (largest difference {diff:.2g}, the largest "
                             "gradient {scale:.3g})", config=m.config.label, diff=m.grad_max_diff,
                             scale=m.grad_scale) for m in changed))
        worst = max(diffs, key=lambda m: m.grad_max_diff)
        if worst.grad_max_diff == 0:
            return tr("gradients of the first step against 'none', {which}: bit-for-bit equal",
                      which=n)
        scale = (" " + tr("(the largest gradient is {scale:.3g})", scale=worst.grad_scale)
                 if worst.grad_scale else "")
        gpu = any(m.config.device_type == "cuda" for m in self.measurements)
        text = tr("gradients of the first step against 'none', {which}: equal to within "
                  "{diff:.2g}{scale}, not bit for bit", which=n, diff=worst.grad_max_diff,
                  scale=scale)
        return text + (": " + tr("GPU kernels that add in a varying order differ in the last bits "
                                 "even between two plain runs") if gpu else "")

    def time_text(self, m: ProfileMeasurement) -> str:
        """``m``'s time against its reference as a table cell: `course_utils.experiments.time_cell`
        and its noise band, ``"1.31x slower (1.24-1.38x)"``, ``"within noise (0.95-1.07x)"``."""
        ref = self.reference(m)
        if m is ref:
            return tr("1.00x (reference, emulated)") if m.emulated else tr("1.00x (reference)")
        r = self.ratio(m)
        return time_cell(r.ratio, r.verdict, r.low, r.high)

    def table(self) -> pd.DataFrame:
        """One row per configuration: `Measurement.as_row`'s fields, then ``time_ratio`` (with
        ``_low``, ``_high``, ``time_verdict``), ``paired_step_time_s`` (`step_s`), ``peak_ratio``
        and ``saved_ratio``, each against ``none`` of the same precision."""
        rows = []
        for m in self.measurements:
            row = m.as_row()
            r = self.ratio(m)
            ref = self.reference(m)
            row.update(time_ratio=r.ratio, time_ratio_low=r.low, time_ratio_high=r.high,
                       time_verdict="reference" if m is ref else r.verdict,
                       paired_step_time_s=self.step_s(m))
            row["peak_ratio"] = (m.peak_allocated / ref.peak_allocated
                                 if m.peak_allocated and ref.peak_allocated else None)
            row["saved_ratio"] = (m.saved_total / ref.saved_total
                                  if m.saved_total is not None and ref.saved_total else None)
            rows.append(row)
        return pd.DataFrame(rows)

    def summary(self, detail: bool = False) -> pd.DataFrame:
        """The readable table, a row per configuration in words: ``step ms`` (`step_s`), ``time vs
        none`` (`time_text`), throughput, ``peak MiB``, ``saved MiB``, ``to host MiB`` if any;
        ``detail=True`` adds each row's own median, ``saved x`` and ``max |grad diff|``."""
        df = self.table()

        def mib(col):
            return [None if v is None or pd.isna(v) else round(v / MiB, 2) for v in df[col]]
        out = pd.DataFrame({"config": [plain_label(v) for v in df["label"]]})
        steps = [self.step_s(m) for m in self.measurements]
        out["step ms"] = [None if s is None else round(s * 1e3, 1) for s in steps]
        out["time vs none"] = [self.time_text(m) for m in self.measurements]
        out[f"{self.unit}/s"] = [None if not s else sig_text(m.config.tokens_per_step / s)
                                 for m, s in zip(self.measurements, steps)]
        out["peak MiB"] = mib("peak_allocated")
        out["saved MiB"] = mib("saved_total")
        if detail or any(m.bytes_to_host for m in self.measurements):  # offloading ran
            on_gpu = any(m.config.device_type == "cuda" for m in self.measurements)
            out["to host MiB" if on_gpu else "would go to host MiB"] = mib("bytes_to_host")
        if detail:
            out["own median step ms"] = [None if v is None or pd.isna(v) else round(v * 1e3, 1)
                                         for v in df["step_time_s"]]
            out["saved x"] = df["saved_ratio"].astype(float).round(3)
            out["max |grad diff|"] = df["grad_max_diff"]
        return out.set_index("config")

    def saved_by_block(self, precision: str, policy: str) -> pd.DataFrame:
        """Saved MiB of one configuration by where they were saved: ``block 0``... and
        ``outside the blocks`` (the index, ``saved at``)."""
        m = self.get(precision, policy)
        df = m.saved_modules

        def where(name: str) -> str:
            i = block_of(name, self.blocks)
            return "outside the blocks" if i is None else f"block {i}"
        g = df.assign(**{"saved at": df["module"].map(where)}).groupby("saved at", sort=False)["nbytes"].sum()
        return (g / MiB).to_frame("MiB")


def _measure_all(prof: Profile, spec: ModelSpec, configs: list, *, lr: float, hw,
                 keep_states: bool, progress: bool) -> dict:
    """Measure every configuration's memory into ``prof``; ``{row index: state}`` of those to time."""
    states, reference = {}, {}
    for i, cfg in enumerate(tqdm(configs, desc=tr("memory"), disable=not progress, leave=False)):
        m, st, grads = measure_config(spec, cfg, lr=lr, hw=hw,
                                      reference_grads=reference.get(cfg.precision),
                                      keep_state=keep_states)
        if cfg.checkpoint == "none":
            reference[cfg.precision] = grads
            m.grad_max_diff = 0.0
        prof.measurements.append(m)
        if st is not None and not m.emulated:
            states[i] = st
    return states


def profile(model, make_batch: Callable[[int], Any], loss_fn: Callable | None = None, *,
            batch_size: int = 4, precisions=("fp32",), policies=("none", "full"),
            device: str | None = None, blocks: str | nn.Module | None = None,
            forward: Callable | None = None, budget_s: float | None = None,
            steps: int | None = None, timed: bool = True, budget_bytes: int | None = None,
            lr: float = 1e-3, seed: int = 0, name: str | None = None,
            progress: bool = True) -> Profile:
    """Measure any model in each precision and checkpoint policy, as the course measures its GPT.

    Args:
        model: an ``nn.Module`` (each configuration trains a deep copy) or a function of no
            arguments returning one (called after ``torch.manual_seed(seed)``).
        make_batch: ``make_batch(batch_size)`` -> a tensor, tuple/list or dict of tensors whose
            first dimension is the batch; integer ``(batch, seq)`` first tensors count as tokens.
        loss_fn: ``loss_fn(output, batch)`` -> a scalar tensor (default `default_loss`).
        precisions: any of ``fp32``, ``bf16``, ``fp16`` (autocast; fp16 with GradScaler).
        policies: any of `POLICIES` (``none``, the reference, is added first if missing).
        blocks: a dotted path or the container (default: `find_blocks`); ``forward(model,
            batch)`` -> output (default `call_model`).
        budget_s: seconds of alternated timing (default: the size profile's); ``steps``: exactly
            this many rounds instead. ``timed=False`` measures memory only.
        budget_bytes: a model whose parameters + gradients + AdamW state exceed it (or the
            memory free now) is refused before any step.

    Returns a `Profile` (``profile.summary()`` is the readable table). Raises `NoRepeatedBlocks`
    (see `find_blocks`), `ModelDoesNotFit` (before the first step), ValueError (an unknown
    precision or policy, a batch without a batch dimension, a loss that is not a scalar, ``hf``
    on a non-HF model) or TypeError (``model`` or ``make_batch`` of the wrong kind).
    """
    check_positive_int("batch_size", batch_size)
    spec = ModelSpec.create(model, make_batch, loss_fn, forward=forward, blocks=blocks,
                            device=device, seed=seed, name=name)
    template = spec.skeleton()
    path, container = find_blocks(template, spec.blocks)
    for p in precisions:
        autocast_dtype(p)
    policies = list(dict.fromkeys(["none", *policies]))
    for p in policies:
        parse_model_policy(p, len(container))
    hw = detect(spec.device)
    _fits_or_raise(spec, budget_bytes, hw)
    n, unit, per = _batch_info(spec.batch(batch_size))
    if n != batch_size:
        raise ValueError(tr("make_batch({batch_size}) returned a batch of {n}: its first "
                            "dimension must be the batch size asked for.", batch_size=batch_size,
                            n=n))
    prof = Profile(spec.name, path, type(container[0]).__name__, len(container),
                   _n_params(template), static_bytes(template), unit, size=size_profile())
    del template
    configs = [ProfileConfig(spec.name, pr, po, batch_size, spec.device, unit, per, seed=seed)
               for pr in precisions for po in policies]
    states = _measure_all(prof, spec, configs, lr=lr, hw=hw, keep_states=timed, progress=progress)
    if states:
        order = list(states)
        budget = budget_s or default_budget_s(prof.size)
        with tqdm(desc=tr("step time"), disable=not progress, leave=False) as bar:
            time_in_alternation([prof.measurements[i] for i in order],
                                [states[i] for i in order], budget if steps is None else None,
                                steps, progress=bar, device=spec.device)
    states.clear()
    return prof
