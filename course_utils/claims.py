"""The claims the course tests, as popular tutorials state them, and the one engine that judges them.

`verdict(claim_id, where=..., **measured)` applies the claim's one rule (its inputs and thresholds
in its docstring) to numbers a lesson measured or computed, so two lessons that measure the same
numbers get the same status (`STATUSES`, docs/method.md#claims-and-verdicts). Inside a notebook
kernel each verdict is recorded in this machine's results store (`course_utils.store`), where
lesson 03's ledger reads it (`recorded_or_measure`).

Over 400 lines because it holds one rule per claim (twenty), read side by side with the engine
that applies them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Callable

import pandas as pd

from . import store
from .config import size_profile
from .experiments import round_sig
from .hardware import detect
from .i18n import tr
from .step_timing import TOO_SMALL, TimeRatio
from .terms import GiB, KiB, MiB

__all__ = ["CLAIMS", "STATUSES", "Verdict", "verdict", "claims_table", "recorded_or_measure",
           "recorded_verdict", "recorded_time"]

#: Claim ID -> the claim as popular tutorials state it.
CLAIMS: dict[str, str] = {
    "C1": 'bf16 autocast gives a "free 1.5-2x" speed-up over fp32 on Ampere+ GPUs',
    "C2": "bf16 autocast cuts training memory about 50%",
    "C3": "torch.compile adds another ~1.5-2x on top of bf16",
    "C4": 'gradient checkpointing drops memory 50-70% ("frees 70%")',
    "C5": "gradient checkpointing costs about 20-33% more time (one extra forward)",
    "C6": "checkpointing turns activation memory from O(N) into O(sqrt(N)) in the number of layers",
    "C7": "gradient checkpointing makes training faster",
    "C8": "checkpointing stores the model's parameters and state at checkpoints",
    "C9": "mixed-precision AdamW needs 16 bytes per parameter, plus 20-30% overhead",
    "C10": "a 7B model needs 28 GB for fp32 weights and 84 GB for Adam states",
    "C11": "fp16 gradients underflow without loss scaling; loss scaling fixes it",
    "C12": "dynamic loss scaling halves and skips the step on inf/NaN, doubles after N clean steps",
    "C13": "bf16 needs no loss scaling because it has fp32's exponent range",
    "C14": "non-reentrant checkpointing is the recommended mode; reentrant has limitations",
    "C15": "attention activation memory is O(seq^2)",
    "C16": "T4/V100 need fp16 + GradScaler; Ampere+ should use bf16 without a scaler",
    "C17": "gradient accumulation: divide the loss by the micro-batches; no extra memory",
    "C18": "with a scaler, unscale_ must precede gradient clipping",
    "C19": "FP8 (Transformer Engine, Hopper+) gives up to 2x over bf16",
    "C20": "checkpointing frees memory for a larger batch that can outweigh the recompute cost",
}

STATUSES = ("held", "busted", "depends", "inconclusive", "not measured here")


@dataclass(frozen=True)
class Verdict:
    """What this machine's numbers say about one claim (``"C2"``): a status of `STATUSES`, the
    evidence in words, where it is tested (``"01 §6"``) and the basis, ``"measured"``,
    ``"derived"`` or ``"none"``. ValueError: an unknown claim ID, status or basis."""

    claim: str
    status: str
    evidence: str
    where: str = ""
    basis: str = "measured"

    def __post_init__(self):
        if self.claim not in CLAIMS:
            raise _unknown_claim(self.claim)
        if self.status not in STATUSES:
            raise ValueError(tr("unknown status {status!r}: expected one of {statuses}.",
                                status=self.status, statuses=", ".join(STATUSES)))
        if self.basis not in ("measured", "derived", "none"):
            raise ValueError(tr("basis is 'measured', 'derived' or 'none', got {basis!r}.",
                                basis=self.basis))

    def __str__(self) -> str:
        """``"C2 held - bf16 peak = ..."``, the status in the learner's language."""
        return tr("{claim} {status} - {evidence}", claim=self.claim, status=tr(self.status),
                  evidence=self.evidence)


def _unknown_claim(claim) -> ValueError:
    return ValueError(tr("unknown claim {claim!r}: expected one of {claims}.", claim=claim,
                         claims=", ".join(CLAIMS)))


def _pct(x: float) -> str:
    return f"{x:+.0%}"


def _bytes(n: float) -> str:
    """Three significant figures: "4.01 MiB", "66.8 KiB", "812 bytes"."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{round_sig(n / size, 3):,g} {unit}"
    return tr("{n:,.0f} bytes", n=n)


def _times(x: float) -> str:
    """65536.2 -> "65,536x", 1.3e-05 -> "1/77,000 of", 0.42 -> "0.42x"."""
    if abs(x) >= 100:
        return f"{x:,.0f}x"
    if 0 < abs(x) < 0.01:
        return tr("1/{n:,.0f} of", n=round_sig(1 / x, 2))
    return f"{x:.2g}x"


def _gpu(hw) -> str:
    cc = hw.compute_capability
    if cc:
        return tr("{name} (compute capability {major}.{minor})", name=hw.name, major=cc[0],
                  minor=cc[1])
    return f"{hw.name} ({hw.device})"


def _why_not(claim: str, why_not) -> tuple[str, str]:
    if not why_not:
        raise ValueError(tr("{claim} not measured: say exactly why not (why_not=...).", claim=claim))
    return "not measured here", why_not


def _unsettled(t, what: str) -> tuple[str, str] | None:
    """(status, evidence) when the time comparison ``t`` (of ``what``) cannot decide, else None."""
    if t is None or t.ratio is None:
        return "not measured here", tr("{what}: not timed in this run", what=what)
    if t.verdict in ("within noise", "too few rounds", TOO_SMALL):
        return "inconclusive", t.describe(what)
    if t.verdict == "emulated":
        return "inconclusive", tr("{described} (emulated arithmetic says nothing here)",
                                  described=t.describe(what))
    return None


def _c1(hw, bf16_time=None, bf16_vs_tf32=None):
    """``bf16_time``: TimeRatio bf16 / fp32 step (fp32 matmuls in full fp32); ``bf16_vs_tf32``:
    a bf16 matmul's time / a TF32 one's (one probe each). Held from 1.5x faster, on an Ampere+ GPU
    only; depends when a bf16 matmul is less than 1.5x faster than TF32 (a baseline's speed-up)."""
    here = (tr(" Here: {described}", described=bf16_time.describe(tr("the bf16 step")))
            if bf16_time and bf16_time.ratio and bf16_time.verdict != "emulated" else "")
    if not (hw.device == "cuda" and hw.native_bf16):
        return "not measured here", tr("a claim about Ampere+ GPUs; this is {gpu}.{here}",
                                       gpu=_gpu(hw), here=here)
    if u := _unsettled(bf16_time, tr("bf16 / fp32 step time")):
        return u
    speedup = 1 / bf16_time.ratio
    text = tr("{gpu}: {described}", gpu=_gpu(hw),
              described=bf16_time.describe(tr("the bf16 step, against full fp32:")))
    if speedup < 1.5:
        return "busted", text
    if bf16_vs_tf32 is None:
        return "held", text
    text = tr("{text}; a bf16 matmul takes {ratio:.2f}x the time of an fp32 one with TF32 (one "
              "probe each, no noise band)", text=text, ratio=bf16_vs_tf32)
    if bf16_vs_tf32 > 1 / 1.5:
        return "depends", tr("{text}: a speed-up of 1.5x or more against full fp32, below 1.5x "
                             "against TF32", text=text)
    return "held", text


def _c2(peak_ratio, activations_ratio=None, low="bf16"):
    """``peak_ratio``: peak of the low precision / fp32's. Held at a cut of 40% or more."""
    acts = (tr("; saved activations {ratio:.2f}x", ratio=activations_ratio)
            if activations_ratio is not None else "")
    return ("held" if peak_ratio <= 0.6 else "busted",
            tr("{low} peak = {ratio:.2f}x fp32's{acts}; parameters, gradients and AdamW state "
               "stay fp32", low=low, ratio=peak_ratio, acts=acts))


def _c3(compile_time=None, why_not=None, precision="bf16"):
    """``compile_time``: TimeRatio compiled / eager step, or ``why_not``. Held from 1.5x faster."""
    if compile_time is None:
        return _why_not("C3", why_not)
    if u := _unsettled(compile_time, tr("compiled / eager {precision} step time",
                                        precision=precision)):
        return u
    speedup = 1 / compile_time.ratio
    return ("held" if speedup >= 1.5 else "busted",
            tr("torch.compile: {speedup:.2f}x eager {precision}'s speed ({described})",
               speedup=speedup, precision=precision, described=compile_time.describe()))


def _c4(peak_ratio, saved_ratio):
    """Full checkpointing / none: held when the peak drops 50% or more; depends when only the
    saved tensors do."""
    peak_drop, saved_drop = 1 - peak_ratio, 1 - saved_ratio
    text = tr("full checkpointing: saved tensors {saved}, peak {peak} (the peak keeps "
              "parameters, gradients, AdamW state and logits)", saved=_pct(-saved_drop),
              peak=_pct(-peak_drop))
    if peak_drop >= 0.5:
        return "held", text
    return ("depends" if saved_drop >= 0.5 else "busted"), text


def _c5(full_time, flops_ratio=None):
    """``full_time``: TimeRatio full / none. Held when the whole printed band lies in 1.20-1.40
    (the published measurements lesson 02 cites: Hugging Face 20%, Bekman 20-25%, NeMo 30%, the
    Ultra-Scale Playbook 30-40%); busted when wholly outside; else inconclusive."""
    if u := _unsettled(full_time, tr("full / none step time")):
        return u
    cost = full_time.ratio - 1
    flops = tr("; FLOPs {change}", change=_pct(flops_ratio - 1)) if flops_ratio is not None else ""
    text = tr("{described} = {cost} (held when the band lies within +20% to +40%, the span of "
              "published measurements){flops}",
              described=full_time.describe(), cost=_pct(cost), flops=flops)
    lo, hi = round(full_time.low, 2), round(full_time.high, 2)
    if 1.20 <= lo and hi <= 1.40:
        return "held", text
    if hi < 1.20 or lo > 1.40:
        return "busted", text
    edges = [_pct(e - 1) for e in (1.20, 1.40) if lo < e <= hi or lo <= e < hi]
    if len(edges) == 1:
        return "inconclusive", tr("{text}; that band straddles the {edge} edge of the held range",
                                  text=text, edge=edges[0])
    return "inconclusive", tr("{text}; that band straddles the {low} and {high} edges of the "
                              "held range", text=text, low=edges[0], high=edges[1])


def _c6(plain_growth, sqrt_growth, best_segments, sqrt_segments, n_layers_ratio=4):
    """Growth of saved bytes when the layers grow ``n_layers_ratio``-fold, plain and with sqrt(N)
    segments (busted above 1.5 sqrt(ratio)); held when the lowest peak is at sqrt(N) segments."""
    text = tr("{ratio}x the layers: plain saved x{plain:.1f}, sqrt(N) segments x{grown:.1f} "
              "(sqrt = {sqrt:.1f}); lowest peak at {best} segments, sqrt(N) is {segments}",
              ratio=n_layers_ratio, plain=plain_growth, grown=sqrt_growth,
              sqrt=n_layers_ratio ** 0.5, best=best_segments, segments=sqrt_segments)
    if sqrt_growth > 1.5 * n_layers_ratio ** 0.5:
        return "busted", text
    return ("held" if best_segments == sqrt_segments else "depends"), text


def _c7(full_time, per_token_time=None):
    """``full_time``: TimeRatio full / none per step; ``per_token_time``: as C20's."""
    if u := _unsettled(full_time, tr("full / none step time")):
        return u
    text = full_time.describe(tr("per step, full / none"))
    if full_time.verdict == "faster":  # more work cannot be faster: the load changed
        return "inconclusive", tr("{described}: faster than the same step without its "
                                  "recomputation, which only adds work; the machine's load "
                                  "changed while it was timed: run it again", described=text)
    if per_token_time is not None and per_token_time.verdict == "faster":
        return "depends", tr("{text}; but at the largest batch under the budget, {described}",
                             text=text, described=per_token_time.describe(tr("time per token")))
    return "busted", tr("{text}; it can raise throughput only through a larger batch (C20)",
                        text=text)


def _c8(kept_bytes=None, expected_bytes=None, param_bytes=None, batch_ratio=None):
    """``kept_bytes`` vs the block inputs ``expected_bytes``, or ``batch_ratio`` (kept bytes at 2x
    the batch / at 1x): busted when full checkpointing keeps activations, not parameters."""
    if kept_bytes is not None and expected_bytes is not None:
        same = kept_bytes == expected_bytes
        text = (tr("kept {kept} = the block inputs and token ids", kept=_bytes(kept_bytes))
                if same else
                tr("kept {kept}; the block inputs and token ids are {expected} ({diff:+,} bytes)",
                   kept=_bytes(kept_bytes), expected=_bytes(expected_bytes),
                   diff=kept_bytes - expected_bytes))
        if param_bytes:
            text += tr("; parameters {params}, not copied", params=_bytes(param_bytes))
        return ("busted" if same else "inconclusive"), text
    if batch_ratio is not None:
        return ("busted" if 1.8 <= batch_ratio <= 2.2 else "inconclusive",
                tr("kept bytes x{ratio:.2f} when the batch doubles: activations, which scale "
                   "with the batch; parameters do not", ratio=batch_ratio))
    raise ValueError(tr("C8 needs kept_bytes and expected_bytes, or batch_ratio."))


def _c9(bytes_per_param, overheads=None, copies_per_param=None):
    """``bytes_per_param``: weights + grads + AdamW per parameter under autocast (held at 16);
    ``overheads``: {setting: estimated peak / (16 N) - 1} (held within 0.2-0.3)."""
    text = tr("weights + gradients + AdamW = {bytes:.2f} bytes/param (4 + 4 + 8, fp32)",
              bytes=bytes_per_param)
    if copies_per_param:
        text += tr(", + {copies:.2f} bytes/param of autocast weight copies",
                   copies=copies_per_param)
    if abs(bytes_per_param - 16) >= 0.05:
        return "busted", text
    if not overheads:
        return "held", text
    text += tr("; overhead {overheads}",
               overheads=", ".join(f"{v:+.0%} ({k})" for k, v in overheads.items()))
    return ("held" if all(0.2 <= v <= 0.3 for v in overheads.values()) else "depends"), text


def _c10(n_params=7e9):
    """Arithmetic: fp32 weights 4 N bytes, AdamW's moments 8 N bytes (GB = 1e9); held when both
    of the claim's figures are right, depends when one is."""
    w, adam = 4 * n_params / 1e9, 8 * n_params / 1e9
    w_ok, adam_ok = round(w) == 28, round(adam) == 84
    text = tr("{n:,.3g}B parameters: fp32 weights {weights:.0f} GB{weights_said}; AdamW moments "
              "{moments:.0f} GB{moments_said}", n=n_params / 1e9, weights=w,
              weights_said=tr(": right") if w_ok else tr(", not 28 GB"), moments=adam,
              moments_said=tr(": right") if adam_ok else
              tr(", not 84 GB (84 GB = 12 bytes/param: the moments plus an fp32 master copy, "
                 "which fp32 training does not have)"))
    return ("held" if w_ok and adam_ok else "depends" if w_ok or adam_ok else "busted"), text


def _c11(flushed_unscaled, flushed_scaled, scale, overflow_scaled=0.0, which="gradients"):
    """Fractions of nonzero gradients (``which``, in words) flushed to 0 in fp16, unscaled and
    at loss scale ``scale``, and that overflowed at it."""
    text = tr("fp16 flushed {unscaled:.3%} of the {which} unscaled, {scaled:.3%} at scale "
              "{scale:g}", unscaled=flushed_unscaled, which=tr(which), scaled=flushed_scaled,
              scale=scale)
    if overflow_scaled:
        text += tr(" (overflow {overflow:.3%})", overflow=overflow_scaled)
    if flushed_unscaled == 0:
        return "depends", tr("{text}: no underflow at this size; smaller gradients show it",
                             text=text)
    fixed = flushed_scaled < flushed_unscaled and flushed_scaled < 0.001 and not overflow_scaled
    return ("held" if fixed else "busted"), text


def _c12(backoffs_ok, growth_after, growth_interval, clean_taken=True):
    """A GradScaler trace: each injected inf/NaN skipped and backed off (``backoffs_ok``), each
    growth after ``growth_interval`` clean steps (``growth_after``)."""
    ok = (bool(backoffs_ok) and all(backoffs_ok) and bool(growth_after)
          and all(g == growth_interval for g in growth_after) and clean_taken)
    return ("held" if ok else "busted",
            tr("skip + back off on each inf/NaN: {backoffs}; growth after {growth_after} clean "
               "steps (growth_interval {interval})",
               backoffs=all(backoffs_ok) if backoffs_ok else None, growth_after=growth_after,
               interval=growth_interval))


def _c13(same_range, flushed_bf16, val_loss_gap=None, which="gradients"):
    """bf16's range equals fp32's, the fraction of gradients (``which``) bf16 flushes, and
    bf16's relative gap to fp32's validation loss without a scaler (held under 2%)."""
    text = tr("bf16 range = fp32's: {same}; bf16 flushed {flushed:.3%} of the {which}",
              same=same_range, flushed=flushed_bf16, which=tr(which))
    ok = same_range and flushed_bf16 == 0
    if val_loss_gap is not None:
        text += (tr("; without a scaler it ended within 0.01% of fp32's validation loss")
                 if abs(val_loss_gap) < 5e-5 else
                 tr("; without a scaler it ended {gap:+.2%} from fp32's validation loss",
                    gap=val_loss_gap))
        ok = ok and abs(val_loss_gap) < 0.02
    return ("held" if ok else "busted"), text


def _c14(reentrant_lost_grads, reentrant_failures=(), nonreentrant_ok=True):
    """Reentrant checkpointing lost the block's gradients or failed at ``reentrant_failures``;
    the non-reentrant version handled everything."""
    names = (f" ({', '.join(tr(f) for f in reentrant_failures)})" if reentrant_failures
             else "")
    text = tr("reentrant: block gradients lost: {lost}; fails at {n} of the features "
              "tried{names}; non-reentrant handles all: {ok}", lost=reentrant_lost_grads,
              n=len(reentrant_failures), names=names, ok=nonreentrant_ok)
    limited = reentrant_lost_grads or bool(reentrant_failures)
    return ("held" if limited and nonreentrant_ok else "busted"), text


def _c15(naive_extra_slope, sdpa_slope):
    """Log-log slopes of saved bytes vs sequence length (quadratic from 1.8)."""
    text = tr("naive attention's extra saved bytes grow with slope {naive:.2f}, SDPA's with "
              "slope {sdpa:.2f}", naive=naive_extra_slope, sdpa=sdpa_slope)
    if sdpa_slope >= 1.8:
        return "held", text
    if naive_extra_slope >= 1.8:
        return "depends", tr("{text}: quadratic only for naive attention", text=text)
    return "busted", text


def _c16(hw, bf16_vs_fp16=None, recipe=""):
    """``bf16_vs_fp16``: bf16 matmul time / fp16's on this GPU; a stand-in GPU times at its own
    speed, not the smaller card's: not measured."""
    if hw.device != "cuda":
        return "not measured here", (
            tr("a claim about NVIDIA GPUs; this is {gpu}, whose recipe is {recipe}",
               gpu=_gpu(hw), recipe=recipe) if recipe
            else tr("a claim about NVIDIA GPUs; this is {gpu}", gpu=_gpu(hw)))
    if hw.stand_in:
        return "not measured here", tr("{stand_in}: its matmuls run at the bigger GPU's speed, "
                                       "so they cannot say what the smaller card's do",
                                       stand_in=hw.stand_in)
    if bf16_vs_fp16 is None:
        return "not measured here", tr("{gpu}: no bf16/fp16 matmul timing in this run",
                                       gpu=_gpu(hw))
    text = tr("{gpu}: a bf16 matmul takes {ratio:.2f}x fp16's time; native bf16: {native}",
              gpu=_gpu(hw), ratio=bf16_vs_fp16, native=hw.native_bf16)
    if recipe:
        text += tr("; recipe {recipe}", recipe=recipe)
    if hw.native_bf16:
        return ("held" if bf16_vs_fp16 <= 1.2 else "busted"), text
    return ("held" if bf16_vs_fp16 >= 1.5 else "busted"), text


def _c17(grad_rel_err, undivided_ratio, k, extra_peak_bytes, grad_buffer_bytes, peak_vs_big):
    """Accumulation over ``k`` micro-batches vs one big batch. Held when the gradients equal the
    big batch's (``k`` times too large undivided) and the peak exceeds one micro-batch's by at
    most 1% of the .grad buffer; depends when the extra is the .grad buffer (at most 1.05x it)."""
    divided_ok = grad_rel_err < 1e-4 and abs(undivided_ratio - k) < 0.01 * k
    text = tr("{k} micro-batches: gradients within {err:.2g} of the big batch's, x{undivided:.2f} "
              "without the division; peak {peak:.2f}x the big batch's, {extra:+.2f} MiB above "
              "one micro-batch's (.grad buffer {buffer:.2f} MiB)", k=k, err=grad_rel_err,
              undivided=undivided_ratio, peak=peak_vs_big, extra=extra_peak_bytes / MiB,
              buffer=grad_buffer_bytes / MiB)
    if not divided_ok or peak_vs_big >= 1:
        return "busted", text
    if extra_peak_bytes <= 0.01 * grad_buffer_bytes:
        return "held", text
    if extra_peak_bytes <= 1.05 * grad_buffer_bytes:
        return "depends", tr("{text}: dividing the loss is right; the memory is not free: the "
                             ".grad buffer stays alive across micro-batches", text=text)
    return "busted", text


def _c18(clip_saw_ratio, scale, sgd_update_ratio=None, adamw_update_ratio=None):
    """Clipping before ``unscale_``: the norm clipping saw / the true norm (held from half the
    scale), and the update norms clipped wrong / right under SGD and AdamW."""
    text = tr("clipping before unscale_ saw {times} the true norm (scale {scale:,.0f})",
              times=_times(clip_saw_ratio), scale=scale)
    if sgd_update_ratio is not None:
        text += tr("; SGD's update became {times} the right one", times=_times(sgd_update_ratio))
    if adamw_update_ratio is not None:
        text += tr("; AdamW's {times} (Adam divides by the gradient's running scale, so it hides "
                   "most of it: the clip threshold is what breaks)",
                   times=_times(adamw_update_ratio))
    return ("held" if clip_saw_ratio >= 0.5 * scale else "busted"), text


def _c19(hw, fp8_time=None, why_not=None):
    """``fp8_time``: TimeRatio FP8 / bf16 step; ``why_not`` when not measured."""
    if fp8_time is None:
        return _why_not("C19", why_not)
    if u := _unsettled(fp8_time, tr("FP8 / bf16 step time")):
        return u
    speedup = 1 / fp8_time.ratio
    return ("held" if speedup >= 1.2 else "busted",
            tr("{gpu}: FP8 {speedup:.2f}x bf16's speed ({described})", gpu=_gpu(hw),
               speedup=speedup, described=fp8_time.describe()))


def _c20(per_token_time, budget_bytes=None):
    """``per_token_time``: seconds per token, best checkpointed / best plain at the largest batch
    under the budget. Held when faster, else depends (the claim says *can*)."""
    if u := _unsettled(per_token_time, tr("time per token, checkpointed / plain at their largest "
                                          "batch")):
        return u
    what = (tr("at the largest batch under {budget:,.1f} MiB, time per token",
               budget=budget_bytes / MiB) if budget_bytes
            else tr("at the largest batch, time per token"))
    return ("held" if per_token_time.verdict == "faster" else "depends",
            per_token_time.describe(what))


_RULES = {"C1": _c1, "C2": _c2, "C3": _c3, "C4": _c4, "C5": _c5, "C6": _c6, "C7": _c7,
          "C8": _c8, "C9": _c9, "C10": _c10, "C11": _c11, "C12": _c12, "C13": _c13,
          "C14": _c14, "C15": _c15, "C16": _c16, "C17": _c17, "C18": _c18, "C19": _c19,
          "C20": _c20}
_DERIVED = {"C10"}
#: Claims judged from step times: a stand-in GPU (course_utils.stand_in) times at its own speed.
_TIMED = {"C3", "C5", "C7", "C19", "C20"}


def _jsonable(v):
    """A rule input as JSON: dataclasses (TimeRatio) as dicts, the rest as is or as text."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _jsonable(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def verdict(claim: str, where: str = "", record: bool | None = None, **measured) -> Verdict:
    """Judge ``claim`` from ``measured``, the inputs of its rule (``help(claims._c5)``);
    ``record`` it in the results store (default: inside a notebook kernel only).

    Raises:
        ValueError: an unknown claim ID, or inputs the rule cannot judge.
        TypeError: a missing or unknown input name.
    """
    if claim not in _RULES:
        raise _unknown_claim(claim)
    status, evidence = _RULES[claim](**measured)
    stand_in = detect().stand_in if claim in _TIMED else None
    if stand_in and status != "not measured here":
        status, evidence = "not measured here", tr(
            "{stand_in}: its steps run at the bigger GPU's speed, so they cannot say how long "
            "the smaller card's take", stand_in=stand_in)
    basis = ("none" if status == "not measured here"
             else "derived" if claim in _DERIVED else "measured")
    v = Verdict(claim, status, evidence, where, basis)
    if record or (record is None and store.in_notebook()):
        store.record("verdicts", claim, {"status": v.status, "evidence": v.evidence,
                                         "where": v.where, "basis": v.basis,
                                         "inputs": _jsonable(measured)}, _context())
    return v


def _context() -> str:
    return store.context_key(size_profile(), detect())


def _recorded(claim: str, key: str | None) -> dict | None:
    if claim not in CLAIMS:
        raise _unknown_claim(claim)
    return store.lookup("verdicts", claim, key or _context())


def recorded_verdict(claim: str, key: str | None = None) -> Verdict | None:
    """The verdict on ``claim`` a lesson recorded under ``key`` (default: this run's context),
    as that lesson printed it; None if none did. ValueError: an unknown claim ID."""
    rec = _recorded(claim, key)
    if not rec or rec.get("status") not in STATUSES:
        return None
    return Verdict(claim, rec["status"], rec.get("evidence", ""), rec.get("where", ""),
                   rec.get("basis", "measured"))


def recorded_time(claim: str, name: str, lesson: str, key: str | None = None) -> TimeRatio | None:
    """The `TimeRatio` input ``name`` (``"full_time"``) of the verdict on ``claim`` that lesson
    ``lesson`` (``"02"``) recorded here; None where it has not, or a later lesson replaced it.
    ValueError: an unknown claim ID."""
    rec = _recorded(claim, key)
    if not rec or not str(rec.get("where", "")).startswith(lesson):
        return None
    d = (rec.get("inputs") or {}).get(name)
    fields = [f.name for f in dataclasses.fields(TimeRatio)]
    if not isinstance(d, dict) or any(f not in d for f in fields):
        return None
    return TimeRatio(**{f: d[f] for f in fields})

def recorded_or_measure(claim: str, where: str, measure: Callable[[], dict], model: str,
                        key: str | None = None) -> Verdict:
    """The verdict a lesson recorded here (`recorded_verdict`) at ``where``; else the claim
    judged now from ``measure()`` (the rule's inputs), ``where`` saying it was measured again on
    ``model`` (or judged here, when not measured here). Raises as `verdict`."""
    v = recorded_verdict(claim, key)
    if v is not None:
        return replace(v, where=where)
    v = verdict(claim, where=where, record=False, **measure())
    again = (tr("{where}; judged here", where=where) if v.status == "not measured here"
             else tr("{where}; measured again here on {model}", where=where, model=model))
    return replace(v, where=again)


def claims_table(verdicts) -> pd.DataFrame:
    """Verdicts as a table indexed by claim, in claim order, the latest per claim: ``says`` (in the
    learner's language), ``status``, ``basis`` (constants), ``evidence``, ``where``."""
    latest = {v.claim: v for v in verdicts}
    rows = [{"claim": v.claim, "says": tr(CLAIMS[v.claim]), "status": v.status, "basis": v.basis,
             "evidence": v.evidence, "where": v.where} for v in latest.values()]
    df = pd.DataFrame(rows, columns=["claim", "says", "status", "basis", "evidence", "where"])
    order = {c: i for i, c in enumerate(CLAIMS)}
    return df.sort_values("claim", key=lambda s: s.map(order)).set_index("claim")
