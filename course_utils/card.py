"""The recommendation card of lesson 05 and ``course-profile``: the recipe to train a model with
under a memory budget, every sentence generated from what `course_utils.profiling.profile` timed
and `course_utils.extrapolate.extrapolate` predicts. The rule: (1) this machine's recipe if
profiled natively; (2) among the policies whose largest micro-batch under the budget reaches the
target (at most the measured batch), one measured slower than another drops out
(docs/method.md#verdict-words) and the tie goes to the larger micro-batch, then `PREFERENCE`;
offloading off CUDA and a policy that changed the first step's gradients are no candidates;
(3) ``accum = ceil(target / min(largest, target))``, ``micro = ceil(target / accum)``, planned on
CUDA to `course_utils.extrapolate.CUDA_PLANNING_SHARE` of the budget; (4) one real step checks
it, and on CUDA an out-of-memory step steps down by `BACK_OFF`, at most `CHECKS` times.

Over 400 lines because the rule's four steps and the sentences stating them read one set of
numbers and must not drift apart.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import pandas as pd

from .experiments import plain_label, sig_text, size_text
from .extrapolate import CUDA_PLANNING_SHARE, check_prediction, extrapolate
from .hardware import detect, recommend_precision
from .i18n import tr
from .offload import PCIE_GBPS, transfer_time_estimate
from .profiling import profile
from .search import memory_budget
from .step_timing import emulated_factor, time_ratio
from .terms import MiB, check_positive_int, default_device

__all__ = ["PREFERENCE", "CUDA_PLANNING_SHARE", "BACK_OFF", "CHECKS", "Card", "recommend",
           "budget_from_device", "profile_and_recommend"]

#: Policies from the fewest recomputed FLOPs to the most (offload, copying every saved tensor to
#: the host and back, after selective): the tie rule's last key. Fewer FLOPs is not less time
#: (lessons 02 and 05 measured selective slower than full): it only breaks ties time cannot.
PREFERENCE = ("none", "selective", "offload", "every-", "full", "hf", "offload+checkpoint")

#: After a real step ran out of memory, the next micro-batch tried is this share of the last one.
BACK_OFF = 0.9
#: Real steps the check may run on CUDA before the card gives up stepping down.
CHECKS = 3


def _rank(policy: str) -> int:
    return next((i for i, p in enumerate(PREFERENCE) if policy == p or
                 (p.endswith("-") and policy.startswith(p))), len(PREFERENCE))


def budget_from_device(device: str, fraction: float = 0.9) -> tuple[int, str]:
    """``(bytes, where they come from)``: ``fraction`` of the GPU memory free now
    (``torch.cuda.mem_get_info``); ValueError where ``device`` is not an available CUDA device."""
    try:
        return memory_budget(fraction, device), tr("{fraction:.0%} of the GPU memory free now",
                                                   fraction=fraction)
    except ValueError:
        raise ValueError(tr("device {device!r} has no GPU memory to read a budget from: give a "
                            "budget in bytes (course-profile --budget 2GiB).",
                            device=device)) from None


@dataclass
class Card:
    """A recommended recipe and why (bytes, seconds): ``measured_peak`` is one real step's (None
    if not checked or out of memory); ``time_ratio*`` and ``throughput`` (``unit`` per second) at
    ``measured_batch``, against no checkpointing; ``options``, one dict per option considered."""

    model: str
    device_name: str
    unit: str
    budget_bytes: int
    budget_source: str
    precision: str
    policy: str
    micro_batch: int
    accum_steps: int
    target_batch: int
    effective_batch: int
    predicted_peak: int
    measured_peak: int | None
    check_note: str
    time_ratio: float | None
    time_ratio_low: float | None
    time_ratio_high: float | None
    time_verdict: str
    throughput: float | None
    measured_batch: int
    options: list = field(default_factory=list)
    reasons: list = field(default_factory=list)

    @property
    def recipe(self) -> str:
        """``bf16 autocast + full checkpointing, micro-batch 12 x 3 accumulation steps``."""
        prec = "fp32" if self.precision == "fp32" else f"{self.precision} autocast"
        if self.precision == "fp16":
            prec += " + GradScaler"
        pol = {"none": tr("no checkpointing"), "full": tr("full checkpointing"),
               "selective": tr("selective checkpointing"), "offload": tr("activation offloading"),
               "offload+checkpoint": tr("checkpointing + offloading of block inputs"),
               "hf": tr("Hugging Face's gradient checkpointing")}.get(self.policy, self.policy)
        if self.accum_steps == 1:
            return tr("{precision} + {policy}, micro-batch {micro} x {accum} accumulation step",
                      precision=prec, policy=pol, micro=self.micro_batch, accum=self.accum_steps)
        return tr("{precision} + {policy}, micro-batch {micro} x {accum} accumulation steps",
                  precision=prec, policy=pol, micro=self.micro_batch, accum=self.accum_steps)

    def text(self) -> str:
        """The card as text: a title, the recipe, the numbers, the reasons."""
        lines = [tr("Recommendation for {model} on {device}", model=self.model,
                    device=self.device_name),
                 tr("  recipe      : {recipe} (effective batch {effective}; target {target})",
                    recipe=self.recipe, effective=self.effective_batch, target=self.target_batch)
                 if self.target_batch != self.effective_batch else
                 tr("  recipe      : {recipe} (effective batch {effective})", recipe=self.recipe,
                    effective=self.effective_batch),
                 tr("  budget      : {budget} ({source})", budget=size_text(self.budget_bytes),
                    source=tr(self.budget_source)),
                 tr("  peak        : predicted {predicted}, measured {measured}",
                    predicted=size_text(self.predicted_peak),
                    measured=size_text(self.measured_peak)) if self.measured_peak else
                 tr("  peak        : predicted {predicted}",
                    predicted=size_text(self.predicted_peak))]
        if self.throughput:
            lines.append(tr("  throughput  : {throughput} {unit}/s (measured at micro-batch "
                            "{batch})", throughput=sig_text(self.throughput), unit=tr(self.unit),
                            batch=self.measured_batch))
        lines.append(tr("  why:"))
        lines += [f"   - {r}" for r in self.reasons]
        return "\n".join(lines)

    def options_table(self) -> pd.DataFrame:
        """The options considered, one row each, labelled in words."""
        df = pd.DataFrame(self.options)
        df["config"] = [plain_label(c) for c in df["config"]]
        drop = ["precision", "policy", "m"] + ([] if df["emulated"].any() else ["emulated"])
        return df.drop(columns=[c for c in drop if c in df]).set_index("config")

    def as_dict(self) -> dict:
        """All fields as JSON-ready values (``course-profile --out``)."""
        d = asdict(self)
        d["recipe"] = self.recipe
        return json.loads(json.dumps(d, default=str))


def _ratio_words(r) -> str:
    """A step time against no checkpointing in words, with its noise band."""
    of = tr("no checkpointing")
    if r.ratio is None:
        return tr("a step time that was not measured")
    band = r.band_text()
    if r.verdict == "faster":
        return tr("a step time {speedup:.2f}x faster than {other} ({band})", speedup=1 / r.ratio,
                  other=of, band=band)
    if r.verdict == "slower":
        return tr("a step time {ratio:.2f}x slower than {other} ({band})", ratio=r.ratio,
                  other=of, band=band)
    if r.verdict == "within noise":
        return tr("a step time within the noise of {other} ({band})", other=of, band=band)
    if r.verdict == "emulated":
        return tr("a step time about {factor} that of {other} (emulated here: not the speed of "
                  "real hardware)", factor=emulated_factor(r.ratio), other=of)
    return tr("a step time against {other}: {verdict} ({band})", other=of, verdict=tr(r.verdict),
              band=band)


def _name(policy: str) -> str:
    return tr("no checkpointing") if policy == "none" else policy


def _flops_order(policies) -> str:
    """``policies`` in `PREFERENCE` order, in words."""
    order = sorted(policies, key=_rank)
    if "offload" in order and "selective" in order:
        return tr("{order} (offload recomputes nothing but copies every saved tensor to the host "
                  "and back: it ranks after selective)", order=", ".join(order))
    return ", ".join(order)


@dataclass
class _Pick:
    """``beaten``: policy -> (the option measured faster, TimeRatio to it); ``tied``: the rest, the
    choice first; ``versus``: each other tied policy's `TimeRatio` to the choice."""

    chosen: dict
    beaten: dict
    tied: list
    versus: dict


def _pick(cands: list, profile, want: int) -> _Pick:
    """The module's rule 2 among ``cands``, every pair compared round by round."""
    def versus(o, ref):
        return time_ratio(o["m"].step_times_s, ref["m"].step_times_s, size=profile.size,
                          emulated=o["m"].emulated or ref["m"].emulated)
    beaten = {}
    for o in cands:
        slower = [(ref, r) for ref in cands if ref is not o
                  for r in [versus(o, ref)] if r.verdict == "slower"]
        if slower:  # said against the one it lost to by the most
            beaten[o["policy"]] = max(slower, key=lambda x: x[1].ratio)
    tied = [o for o in cands if o["policy"] not in beaten]
    if not tied:  # a cycle of "faster" (noise can do that): time decides nothing
        beaten, tied = {}, list(cands)
    tied.sort(key=lambda o: (-min(o["largest batch"], want), _rank(o["policy"])))
    chosen = tied[0]
    return _Pick(chosen, beaten, tied, {o["policy"]: versus(o, chosen) for o in tied[1:]})


def _options(profile, extrapolations: dict, plan_bytes: int, measured_batch: int) -> list:
    """One dict per (precision, policy) profiled and extrapolated; ``m`` goes before returning."""
    options = []
    for pr, e in extrapolations.items():
        for policy in e.fits:
            try:
                m = profile.get(pr, policy)
            except KeyError:
                continue
            b = e.largest_batch(plan_bytes, policy)
            step = profile.step_s(m)
            options.append({"config": m.config.label, "precision": pr, "policy": policy,
                            "largest batch": b,
                            "peak at it (MiB)": round(e.peak(b, policy) / MiB, 1) if b else None,
                            tr("step ms at micro-batch {batch}", batch=measured_batch):
                                None if step is None else round(step * 1e3, 1),
                            "time vs none": profile.time_text(m),
                            "emulated": m.emulated, "m": m})
    return options


def _precision(profile, extrapolations: dict, hw) -> str:
    """Rule 1: the recipe if profiled natively, else the first native, else the first one."""
    recipe = recommend_precision(hw).precision
    native = [p for p in extrapolations if not any(
        m.emulated for m in profile.measurements if m.config.precision == p)]
    return recipe if recipe in native else (native[0] if native else next(iter(extrapolations)))


def _why_policy(profile, pick: _Pick | None, mine: list, ex, want: int, need: int,
                accum: int) -> list[str]:
    """The sentences of rule 2: why this policy, and why not each other candidate."""
    chosen = pick.chosen if pick else max(mine, key=lambda o: o["largest batch"])
    policy = chosen["policy"]
    plain = next((o for o in mine if o["policy"] == "none"), None)
    none_b = plain["largest batch"] if plain else 0
    reasons = []
    if policy == "none":
        reasons.append(tr("Without checkpointing a micro-batch of {batch} fits the budget, enough "
                          "for the target of {target}: nothing needs recomputing.", batch=none_b,
                          target=want) if none_b >= want else
                       tr("Without checkpointing a micro-batch of {batch} fits, at least the "
                          "{measured} at which throughput was measured; {accum} accumulation steps "
                          "reach the target of {target} with no recomputation.", batch=none_b,
                          measured=need, accum=accum, target=want))
    else:
        if none_b == 0:
            reasons.append(tr("Without checkpointing not even a batch of 1 fits ({peak:.1f} MiB "
                              "predicted).", peak=ex.peak(1, "none") / MiB))
        elif none_b < need:
            reasons.append(tr("Without checkpointing only {batch} samples fit, fewer than the "
                              "{measured} at which throughput was measured.", batch=none_b,
                              measured=need))
        short = [o["policy"] for o in mine if o["largest batch"] < need
                 and o["policy"] not in ("none", policy)]
        if short:
            reasons.append(tr("{policies} does not reach a micro-batch of {batch} under the "
                              "budget.", policies=short[0], batch=need) if len(short) == 1 else
                           tr("{policies} do not reach a micro-batch of {batch} under the budget.",
                              policies=", ".join(short), batch=need))
        reasons.append(tr("With {policy} a micro-batch of {batch} fits, at {comparison}.",
                          policy=policy, batch=chosen["largest batch"],
                          comparison=_ratio_words(profile.ratio(chosen["m"]))))
    if pick is None:
        return reasons
    for other, (ref, r) in pick.beaten.items():  # the pair's own band; no point ratio
        words = tr("a step time slower than {other}'s, round by round ({band})",
                   other=_name(ref["policy"]), band=r.band_text())
        reasons.append(tr("No checkpointing fits too, but measured {comparison}.", comparison=words)
                       if other == "none" else
                       tr("{policy} fits too, with {comparison}.", policy=other, comparison=words))
    if pick.versus:
        reasons.append(_tie_words(pick, policy, want))
    return reasons


def _tie_words(pick: _Pick, policy: str, want: int) -> str:
    """The sentences of a tie: the tied policies' bands against the choice, and the rule."""
    rest = ", ".join(pick.versus)
    told = all(r.verdict == "within noise" for r in pick.versus.values())
    bands = "; ".join(tr("{policy} against {chosen}: {band}", policy=p, chosen=policy,
                         band=r.band_text() if told else tr(r.verdict))
                      for p, r in pick.versus.items())
    fields = dict(policies=rest, chosen=_name(policy), bands=bands)
    one = len(pick.versus) == 1
    if told:
        first = (tr("{policies} has a step time within the noise of {chosen}'s ({bands}), so time "
                    "does not decide.", **fields) if one else
                 tr("{policies} have step times within the noise of {chosen}'s ({bands}), so time "
                    "does not decide.", **fields))
    else:
        first = (tr("{policies} has a step time not told apart from {chosen}'s ({bands}), so time "
                    "does not decide.", **fields) if one else
                 tr("{policies} have step times not told apart from {chosen}'s ({bands}), so time "
                    "does not decide.", **fields))
    sizes = ", ".join(f"{o['policy']} {min(o['largest batch'], want)}" for o in pick.tied)
    return first + " " + tr(
        "The tie goes to the larger micro-batch under the budget, up to the target of {target} "
        "({sizes}), then to fewer recomputed FLOPs ({order}): {policy}.", target=want,
        sizes=sizes, order=_flops_order(o["policy"] for o in pick.tied), policy=policy)


def _side_notes(profile, options: list, chosen: dict, mine: list, precision: str, hw,
                measured_batch: int, stated=()) -> list[str]:
    """The sentences after the choice (offloading's time unless in ``stated``)."""
    reasons = []
    policy = chosen["policy"]
    others = sorted((o for o in mine if o is not chosen), key=lambda o: -o["largest batch"])
    if others:
        reasons.append(tr("Largest micro-batch under the budget by policy: {batches}.",
                          batches=", ".join(f"{o['policy']} {o['largest batch']}"
                                            for o in [chosen, *others])))
    for o in options:
        if o["precision"] != precision and o["policy"] == policy and o["largest batch"]:
            reasons.append(tr("In {precision} the same policy would fit a micro-batch of {batch} "
                              "(emulated on this machine: not recommended for speed).",
                              precision=o["precision"], batch=o["largest batch"])
                           if o["emulated"] else
                           tr("In {precision} the same policy would fit a micro-batch of "
                              "{batch}.", precision=o["precision"], batch=o["largest batch"]))
    off = next((mm for mm in profile.measurements if mm.config.checkpoint == "offload"
                and mm.config.precision == precision), None)
    if off is not None and off.bytes_to_host:
        moved = off.bytes_to_host
        if hw.device == "cuda":  # its step time is said once: above, if it was a candidate
            fields = dict(moved=moved / MiB, batch=measured_batch)
            reasons.append(tr("Offloading moved {moved:.1f} MiB per step to the host and back "
                              "(measured at micro-batch {batch}).", **fields)
                           if "offload" in stated else
                           tr("Offloading moved {moved:.1f} MiB per step to the host and back "
                              "(measured at micro-batch {batch}): {comparison}.", **fields,
                              comparison=_ratio_words(profile.ratio(off))))
        else:
            reasons.append(tr("Offloading would move {moved:.1f} MiB per step to the host and "
                              "back at micro-batch {batch}: about {ms:.1f} ms over a {gbps:g} GB/s "
                              "PCIe link (an estimate: on a CPU nothing is moved).",
                              moved=moved / MiB, batch=measured_batch,
                              ms=transfer_time_estimate(moved) * 1e3, gbps=PCIE_GBPS))
    reasons += _outside_blocks_note(profile, chosen)
    if hw.device == "cuda":
        reasons.append(tr("Planned to {share:.0%} of the budget: the allocator keeps freed blocks "
                          "cached, so it reserves more than the peak it allocates.",
                          share=CUDA_PLANNING_SHARE))
    return reasons


def _outside_blocks_note(profile, chosen: dict) -> list[str]:
    """A sentence where a language model saves more outside its blocks than inside (issue 26)."""
    try:  # outside the blocks is the same under every policy: read it from none's by-module count
        m = profile.get(chosen["precision"], chosen["policy"])
        by_none = profile.saved_by_block(chosen["precision"], "none")["MiB"]
    except (KeyError, AttributeError, TypeError, ValueError):
        return []
    if getattr(m.config, "unit", "tokens") != "tokens" or "outside the blocks" not in by_none \
            or m.saved_total is None:
        return []
    outside = float(by_none["outside the blocks"])
    inside = m.saved_total / MiB - outside
    if outside <= inside:
        return []
    return [tr("Under {policy} the model saves {outside:.3g} MiB outside its blocks against "
               "{inside:.3g} MiB inside them. In a language model that is the head, its logits and "
               "the loss's copies, which no checkpoint policy reaches; a chunked cross-entropy "
               "keeps one chunk of logits at a time (course_utils.chunked_loss; lesson 03 §6).",
               policy=chosen["policy"], outside=outside, inside=inside)]


def _checked(ex, budget_bytes: int, policy: str, micro: int, accum: int, want: int,
             target_given: bool, on_cuda: bool) -> tuple:
    """Rule 4. Returns ``(micro, accum, want, measured peak or None, note, sentences)``."""
    reasons, measured, note = [], None, tr("not checked")
    for _ in range(CHECKS if on_cuda else 1):
        c = check_prediction(ex, budget_bytes, policy, batch_size=micro)
        measured, note = c.measured_peak, c.note
        reasons.append(tr("Checked with one real step: {note}", note=note)
                       if c.measured_peak or c.oom else tr("Not checked: {note}", note=note))
        if not (c.oom and on_cuda and micro > 1):
            break
        smaller = max(1, int(micro * BACK_OFF))
        if not target_given:  # the target was the largest micro-batch: it shrinks too
            want = smaller
        accum = math.ceil(want / smaller)
        micro = math.ceil(want / accum)  # <= smaller
        reasons.append(tr("So the micro-batch steps down to {micro} ({accum} accumulation "
                          "steps).", micro=micro, accum=accum) if accum > 1 else
                       tr("So the micro-batch steps down to {micro} ({accum} accumulation step).",
                          micro=micro, accum=accum))
    if measured is None and on_cuda and c.oom:
        note = tr("{note} No micro-batch checked fits: give a smaller budget or a policy that "
                  "saves more.", note=note)
    return micro, accum, want, measured, note, reasons


def recommend(profile, extrapolations: dict, budget_bytes: int, *, target_batch: int | None = None,
              budget_source: str = "given", check: bool = True, hw=None) -> Card:
    """The card for ``profile`` (a `course_utils.profiling.Profile`, timed at one batch) and its
    ``extrapolations`` (``{precision: Extrapolation}``, fitted for the same policies), under
    ``budget_bytes``. ``target_batch``: the effective batch wanted (default: the largest
    micro-batch of the policy first in `PREFERENCE`); ``check``: run one real step.

    Raises:
        ValueError: a non-positive budget or target; no configuration fits the budget even at
            batch 1 (the message gives the smallest predicted peak and what to try).
    """
    if not budget_bytes or budget_bytes <= 0:
        raise ValueError(tr("budget_bytes must be a positive number of bytes, got {budget!r}.",
                            budget=budget_bytes))
    check_positive_int("target_batch", target_batch, allow_none=True)
    first = profile.measurements[0]
    hw = hw or detect(first.config.device)
    precision = _precision(profile, extrapolations, hw)
    ex = extrapolations[precision]
    measured_batch = first.config.batch_size
    on_cuda = hw.device == "cuda"
    options = _options(profile, extrapolations,
                       int(budget_bytes * CUDA_PLANNING_SHARE) if on_cuda else budget_bytes,
                       measured_batch)
    changed = [o for o in options if o["precision"] == precision and o["m"].gradients_changed]
    mine = [o for o in options if o["precision"] == precision and o["largest batch"] > 0
            and (on_cuda or not o["policy"].startswith("offload")) and o not in changed]
    if not mine:
        smallest = min(ex.peak(1, p) for p in ex.fits)
        raise ValueError(tr("nothing fits {budget:.1f} MiB in {precision}, even at batch 1: the "
                            "smallest predicted peak is {smallest:.1f} MiB. Give a larger budget, a "
                            "shorter sequence, or profile 'full' and 'offload'.",
                            budget=budget_bytes / MiB, precision=precision,
                            smallest=smallest / MiB))
    want = target_batch or min(mine, key=lambda o: _rank(o["policy"]))["largest batch"]
    need = min(want, measured_batch)
    qualified = [o for o in mine if o["largest batch"] >= need]
    pick = _pick(qualified, profile, want) if qualified else None
    chosen = pick.chosen if pick else max(mine, key=lambda o: o["largest batch"])
    policy = chosen["policy"]
    accum = math.ceil(want / min(chosen["largest batch"], want))
    micro = math.ceil(want / accum)  # the smallest micro-batch that reaches the target in accum steps
    reasons = [tr("{policy} is left out: it changed the first step's gradients beyond rounding "
                  "(largest difference {diff:.2g}, the largest gradient {scale:.3g}), so it would "
                  "train another model.", policy=o["policy"], diff=o["m"].grad_max_diff,
                  scale=o["m"].grad_scale) for o in changed]
    reasons += _why_policy(profile, pick, mine, ex, want, need, accum)
    stated = {policy, *(pick.beaten if pick else ()), *(pick.versus if pick else ())}
    reasons += _side_notes(profile, options, chosen, mine, precision, hw, measured_batch, stated)
    measured_peak, note = None, tr("not checked")
    if check:
        micro, accum, want, measured_peak, note, checked = _checked(
            ex, budget_bytes, policy, micro, accum, want, target_batch is not None, on_cuda)
        reasons += checked
    m = chosen["m"]
    r, step = profile.ratio(m), profile.step_s(m)
    for o in options:  # the measurement itself stays in the profile
        o.pop("m", None)
    return Card(profile.name, first.device_name, profile.unit, int(budget_bytes), budget_source,
                precision, policy, micro, accum, want, micro * accum, ex.peak(micro, policy),
                measured_peak, note, r.ratio, r.low, r.high, r.verdict,
                m.config.tokens_per_step / step if step else None, measured_batch,
                options, reasons)


def profile_and_recommend(model, make_batch, loss_fn=None, *, budget_bytes: int | None = None,
                          target_batch: int | None = None, precisions=None,
                          policies=("none", "full", "selective", "offload"), batch_size: int = 4,
                          device: str | None = None, blocks=None, forward=None,
                          budget_s: float | None = None, name: str | None = None,
                          check: bool = True, progress: bool = True):
    """What ``course-profile`` runs: `course_utils.profiling.profile` at ``batch_size``,
    `extrapolate` per precision (default: fp32 and the recipe) at ``(batch_size // 2,
    batch_size)`` (``(1, 2)`` for 1), then `recommend` (``budget_bytes`` by default
    `budget_from_device`); returns ``(profile, {precision: Extrapolation}, Card)``.

    Raises:
        ValueError: no budget on a device without GPU memory, and what `profile`,
            `extrapolate` and `recommend` raise.
    """
    device = device or default_device()
    hw = detect(device)
    source = "given"
    if budget_bytes is None:
        budget_bytes, source = budget_from_device(device)
    if precisions is None:
        precisions = tuple(dict.fromkeys(["fp32", recommend_precision(hw).precision]))
    batches = (batch_size // 2, batch_size) if batch_size >= 2 else (1, 2)
    kw = dict(device=device, blocks=blocks, forward=forward, name=name)
    prof = profile(model, make_batch, loss_fn, batch_size=batch_size, precisions=precisions,
                   policies=policies, budget_s=budget_s, budget_bytes=budget_bytes,
                   progress=progress, **kw)
    exs = {p: extrapolate(model, make_batch, loss_fn, precision=p, policies=policies,
                          batches=batches, **kw) for p in precisions}
    card = recommend(prof, exs, budget_bytes, target_batch=target_batch, budget_source=source,
                     check=check, hw=hw)
    return prof, exs, card
