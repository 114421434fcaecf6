"""Small measurements behind the claims ledger, one function per claim, each returning the inputs
of its rule in `course_utils.claims`: ``verdict("C6", where="02 §4", **evidence.sqrt_segments())``.

Lesson 03's ledger measures a claim here, on the ``smoke`` model, only where no lesson recorded it
(`course_utils.claims.recorded_or_measure`); `accumulation` (C17) runs the production step, and
`time_between` / `memory_between` / `training_state` read a `course_utils.experiments.compare`
table.
"""
from __future__ import annotations

import functools
import math
import warnings

import torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from .config import RunConfig, config_for
from .data import get_batch
from .hardware import memory_device
from .i18n import tr
from .learner_checks import relative_error, step_gradients
from .memory_model import estimate
from .memory_timeline import peak_during
from .models import build_model
from .saved_tensors import measure_saved, saved_bytes
from .step_timing import TimeRatio, time_ratio
from .terms import check_positive_int
from .training import train_step

__all__ = ["accumulation", "attention_growth", "bf16_range", "checkpoint_keeps", "clip_order",
           "fp16_underflow", "memory_between", "reentrant_pitfalls", "scaler_trace", "small_config",
           "sqrt_segments", "time_between", "training_state"]


def small_config(device: str = "cpu", **overrides) -> RunConfig:
    """The ``smoke`` profile's model with ``overrides`` on ``device`` (the CPU in place of MPS:
    `course_utils.hardware.memory_device`): the size of every measurement here."""
    return config_for("smoke", device=memory_device(device), **overrides)


def _batch(config: RunConfig, step: int = 0, batch_size: int | None = None):
    return get_batch(batch_size or config.batch_size, config.seq_len, seed=config.seed,
                     step=step, device=config.device)


def sqrt_segments(config: RunConfig | None = None, n_layers: int = 4, ratio: int = 4) -> dict:
    """C6: saved activations of ``n_layers`` and ``ratio * n_layers`` blocks, plain and in
    round(sqrt(N)) checkpointed segments, and the segment count with the lowest peak."""
    cfg = config or small_config()
    x, y = _batch(cfg)

    def acts(n, policy):
        c = cfg.replace(n_layers=n, checkpoint=policy)
        return measure_saved(build_model(c), x, y).totals()["activations"]

    small, big = n_layers, ratio * n_layers
    k_small, k_big = round(math.sqrt(small)), round(math.sqrt(big))
    plain = acts(big, "none") / acts(small, "none")
    sqrt_g = acts(big, f"segments:{k_big}") / acts(small, f"segments:{k_small}")

    def peak(s):
        model = build_model(cfg.replace(n_layers=big, checkpoint=f"segments:{s}"))

        def fwd_bwd():
            _, loss = model(x, y)
            loss.backward()
        return peak_during(fwd_bwd, cfg.device)[0]

    peaks = {s: peak(s) for s in range(1, big + 1) if big % s == 0}
    best = min(peaks, key=lambda s: (peaks[s], s))
    return {"plain_growth": plain, "sqrt_growth": sqrt_g, "best_segments": best,
            "sqrt_segments": k_big, "n_layers_ratio": ratio}


def checkpoint_keeps(config: RunConfig | None = None) -> dict:
    """C8: the bytes full checkpointing keeps after a forward, the block inputs + token ids +
    positions they should equal, and the parameter bytes."""
    cfg = (config or small_config()).replace(checkpoint="full", precision="fp32")
    model = build_model(cfg)
    x, y = _batch(cfg)
    kept = measure_saved(model, x, y).totals()["activations"]
    B, T, d = cfg.batch_size, cfg.seq_len, cfg.d_model
    expected = cfg.n_layers * B * T * d * 4 + 8 * B * T + 8 * T
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"kept_bytes": kept, "expected_bytes": expected, "param_bytes": params}


def reentrant_pitfalls(config: RunConfig | None = None) -> dict:
    """C14: does a block checkpointed with ``use_reentrant=True`` lose its gradients when its input
    does not require grad, and which features fail with it that ``use_reentrant=False`` handles?"""
    cfg = config or small_config()
    block = build_model(cfg).layers[0]
    shape = (2, cfg.seq_len, cfg.d_model)

    def block_grads(reentrant):
        block.zero_grad(set_to_none=True)
        x = torch.randn(*shape, device=cfg.device)  # requires no grad
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # reentrant warns that no input requires grad
            out = checkpoint(block, x, use_reentrant=reentrant)
        if out.requires_grad:
            out.sum().backward()
        return any(p.grad is not None for p in block.parameters())

    lost = not block_grads(True)
    ok_plain = block_grads(False)
    xg = torch.randn(*shape, device=cfg.device, requires_grad=True)
    sac = functools.partial(create_selective_checkpoint_contexts, [torch.ops.aten.mm.default])
    tries = {
        "torch.autograd.grad": lambda r: torch.autograd.grad(
            checkpoint(block, xg, use_reentrant=r).sum(), xg),
        "keyword arguments": lambda r: checkpoint(lambda inp, scale: block(inp) * scale, xg,
                                                  scale=2.0, use_reentrant=r).sum().backward(),
        "context_fn (selective checkpointing)": lambda r: checkpoint(
            block, xg, use_reentrant=r, context_fn=sac).sum().backward(),
    }

    def works(attempt, reentrant):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                attempt(reentrant)
            return True
        except (RuntimeError, ValueError, TypeError):
            return False

    failures = tuple(name for name, attempt in tries.items() if not works(attempt, True))
    nonreentrant = ok_plain and all(works(attempt, False) for attempt in tries.values())
    return {"reentrant_lost_grads": lost, "reentrant_failures": failures,
            "nonreentrant_ok": nonreentrant}


def attention_growth(config: RunConfig | None = None, seq_lens: tuple = (64, 128)) -> dict:
    """C15: log-log slopes, from ``seq_lens[0]`` to ``seq_lens[1]``, of one block's saved bytes
    under SDPA and of the extra bytes naive attention saves on top (the seq x seq matrices)."""
    cfg = config or small_config()
    saved = {}
    for attention in ("sdpa", "naive"):
        for T in seq_lens:
            c = cfg.replace(seq_len=T, attention=attention, n_layers=1)
            block = build_model(c).layers[0]
            x = torch.randn(cfg.batch_size, T, cfg.d_model, device=cfg.device,
                            requires_grad=True)
            saved[attention, T] = saved_bytes(block, x, model=block)
    a, b = seq_lens
    span = math.log(b / a)
    extra = [saved["naive", T] - saved["sdpa", T] for T in seq_lens]
    return {"naive_extra_slope": math.log(extra[1] / extra[0]) / span,
            "sdpa_slope": math.log(saved["sdpa", b] / saved["sdpa", a]) / span}


@functools.lru_cache(maxsize=4)
def _gradients(config: RunConfig, loss_scale: float) -> torch.Tensor:
    """All parameter gradients of one fp32 backward, the loss multiplied by ``loss_scale``."""
    model = build_model(config)
    x, y = _batch(config, step=2)
    _, loss = model(x, y)
    (loss * loss_scale).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]).cpu()


def _flushed(g: torch.Tensor, dtype) -> float:
    nonzero = g != 0
    return ((g.to(dtype) == 0) & nonzero).sum().item() / max(1, nonzero.sum().item())


def fp16_underflow(config: RunConfig | None = None, loss_scale: float = 1.0) -> dict:
    """C11: the fraction of nonzero fp32 gradients (of the loss times ``loss_scale``) that fp16
    flushes to 0, unscaled and at GradScaler's default initial scale, and that overflow there."""
    cfg = config or small_config()
    g = _gradients(cfg, loss_scale)
    scale = torch.amp.GradScaler("cpu").get_scale()  # the default init_scale
    scaled = (g * scale).half()
    return {"flushed_unscaled": _flushed(g, torch.float16),
            "flushed_scaled": _flushed(g * scale, torch.float16), "scale": scale,
            "overflow_scaled": torch.isinf(scaled).float().mean().item(),
            "which": "parameter gradients"}


def bf16_range(config: RunConfig | None = None, loss_scale: float = 1.0) -> dict:
    """C13: whether bf16's range equals fp32's, and the fraction of `fp16_underflow`'s
    gradients that bf16 flushes to 0."""
    cfg = config or small_config()
    b, f = torch.finfo(torch.bfloat16), torch.finfo(torch.float32)
    same = b.tiny == f.tiny and b.max / f.max > 0.99
    return {"same_range": bool(same),
            "flushed_bf16": _flushed(_gradients(cfg, loss_scale), torch.bfloat16),
            "which": "parameter gradients"}


def scaler_trace(growth_interval: int = 2, clean_steps: int = 4) -> dict:
    """C12: GradScaler on a linear layer, an inf injected at the first step, then
    ``clean_steps`` clean steps with a small ``growth_interval`` (default 2000)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", growth_interval=growth_interval)
    backoffs, growth_after, taken = [], [], []
    clean = 0
    for i in range(1 + clean_steps):
        bad = i == 0
        before_scale, before_w = scaler.get_scale(), lin.weight.detach().clone()
        opt.zero_grad(set_to_none=True)
        scaler.scale(lin(torch.ones(1, 4)).sum()).backward()
        if bad:
            lin.weight.grad[0, 0] = float("inf")  # what an fp16 overflow looks like
        scaler.step(opt)
        scaler.update()
        stepped = not torch.equal(before_w, lin.weight.detach())
        if bad:
            backoffs.append(not stepped and scaler.get_scale() == before_scale
                            * scaler.get_backoff_factor())
            clean = 0
        else:
            taken.append(stepped)
            clean += 1
            if scaler.get_scale() == before_scale * scaler.get_growth_factor():
                growth_after.append(clean)
                clean = 0
    return {"backoffs_ok": backoffs, "growth_after": growth_after,
            "growth_interval": growth_interval, "clean_taken": all(taken)}


def clip_order(config: RunConfig | None = None, max_grad_norm: float = 1.0) -> dict:
    """C18: one GradScaler step (fp32: the order of the calls is what matters), clipping after
    ``unscale_`` (right) and before it (wrong), under SGD and AdamW."""
    cfg = config or small_config()
    x, y = _batch(cfg, step=3)

    def update(opt_cls, unscale_first):
        model = build_model(cfg)
        opt = opt_cls(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler(cfg.device_type)
        _, loss = model(x, y)
        scaler.scale(loss).backward()
        if unscale_first:
            scaler.unscale_(opt)
        seen = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm).item()
        if not unscale_first:
            scaler.unscale_(opt)
        before = [p.detach().clone() for p in model.parameters()]
        scaler.step(opt)
        moved = torch.linalg.vector_norm(torch.stack(
            [(p.detach() - b).norm() for p, b in zip(model.parameters(), before)])).item()
        return seen, moved, scaler.get_scale()

    seen_bad, sgd_bad, scale = update(torch.optim.SGD, False)
    seen_ok, sgd_ok, _ = update(torch.optim.SGD, True)
    _, adam_bad, _ = update(torch.optim.AdamW, False)
    _, adam_ok, _ = update(torch.optim.AdamW, True)
    return {"clip_saw_ratio": seen_bad / seen_ok, "scale": scale,
            "sgd_update_ratio": sgd_bad / sgd_ok, "adamw_update_ratio": adam_bad / adam_ok}


def accumulation(config: RunConfig, k: int = 4, step_fn=None) -> dict:
    """C17: ``step_fn`` (default `course_utils.training.train_step`, fp32) on ``k`` micro-batches
    against one batch ``k`` times as large: gradients, their norm undivided by ``k``, and each
    step's peak. ValueError: ``k`` < 2."""
    check_positive_int("k (micro-batches)", k, minimum=2)
    step_fn = step_fn or train_step
    cfg = config.replace(precision="fp32", grad_accum_steps=1)
    B = cfg.batch_size
    x, y = _batch(cfg, step=1, batch_size=k * B)
    micro = list(zip(x.split(B), y.split(B)))
    model = build_model(cfg)

    def peak(batches):  # the probe records nothing here: the peak is the step's own
        return peak_during(lambda: step_gradients(step_fn, model, batches, record=False),
                           cfg.device)[0]

    big, acc = step_gradients(step_fn, model, [(x, y)]), step_gradients(step_fn, model, micro)
    peak_big, peak_acc, peak_one = peak([(x, y)]), peak(micro), peak(micro[:1])
    model.zero_grad(set_to_none=True)
    for xm, ym in micro:  # the same loop, the loss not divided by k
        _, loss = model(xm, ym)
        loss.backward()
    undivided = [p.grad.detach().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    def norm(gs):
        return torch.linalg.vector_norm(torch.stack([g.norm() for g in gs])).item()
    grad_buffer = sum(p.numel() * 4 for p in model.parameters())
    return {"grad_rel_err": relative_error(acc["grads"], big["grads"]),
            "undivided_ratio": norm(undivided) / norm(big["grads"]), "k": k,
            "extra_peak_bytes": peak_acc - peak_one, "grad_buffer_bytes": grad_buffer,
            "peak_vs_big": peak_acc / peak_big}


def _row(df, label: str):
    labels = list(df["label"])
    if label not in labels:
        raise ValueError(tr("no row {label!r} in this table: its rows are {labels}.", label=label,
                            labels=labels))
    return labels.index(label)


def time_between(df, label: str, reference: str) -> TimeRatio:
    """Step time of row ``label`` over row ``reference`` of a `compare` table, through the first
    row so that it equals the quotient of the times `course_utils.experiments.summary` prints.
    ValueError: a label that is not in the table."""
    ms = df.attrs["measurements"]
    a, b = ms[_row(df, label)], ms[_row(df, reference)]
    first = ms[0]
    return time_ratio(a.step_times_s, b.step_times_s, size=df.attrs.get("size", ""),
                      emulated=a.emulated or b.emulated,
                      through=None if first.emulated else first.step_times_s)


def memory_between(df, label: str, reference: str) -> dict:
    """``{"peak_ratio", "saved_ratio", "activations_ratio"}`` of row ``label`` over row
    ``reference`` of a `compare` table. ValueError: a label that is not in the table."""
    a, b = df.iloc[_row(df, label)], df.iloc[_row(df, reference)]
    return {"peak_ratio": a["peak_allocated"] / b["peak_allocated"],
            "saved_ratio": a["saved_total"] / b["saved_total"],
            "activations_ratio": a["activations"] / b["activations"]}


def training_state(df, label: str, settings: dict | None = None) -> dict:
    """C9: weights + gradients + AdamW bytes and autocast copies per parameter on row ``label``
    of a `compare` table, and each of ``settings``' (``{name: RunConfig}``) estimated overhead.
    ValueError: a label that is not in the table."""
    i = _row(df, label)
    row = df.iloc[i]
    n = df.attrs["measurements"][i].config.shape.n_parameters
    state = row["parameters"] + row["gradients"] + row["optimizer_state"]
    overheads = {}
    for name, cfg in (settings or {}).items():
        e = estimate(cfg)
        overheads[name] = e.peak_allocated / (16 * e.n_parameters) - 1
    return {"bytes_per_param": state / n, "copies_per_param": row["autocast_weight_copies"] / n,
            "overheads": overheads}
