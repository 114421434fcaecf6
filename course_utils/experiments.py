"""Configurations compared side by side, measured next to estimated, timed fairly
(docs/method.md#time): `ladder` plans this machine's comparison, `compare` measures it and
`summary` is the readable table every lesson, the dashboard and ``course-bench`` print.
"""
from __future__ import annotations

import math
import re

import pandas as pd
from tqdm.auto import tqdm

from .config import SIZE_PROFILES, RunConfig, size_profile
from .hardware import detect, recommend_precision
from .i18n import tr
from .measure import (
    MEMORY_FIELDS,
    Accepted,
    Measurement,
    accept,
    measure_memory,
    new_measurement,
    report_gaps,
    time_in_alternation,
)
from .memory_model import estimate
from .step_timing import band_span, default_budget_s, printed_band, time_ratio
from .terms import GiB, MiB, check_positive_int
from .training import train_step

__all__ = ["ladder", "compare", "summary", "size_of", "size_text", "time_cell", "plain_label", "round_sig",
           "sig_text"]


def size_of(config: RunConfig) -> str:
    """The size profile whose model and batch ``config`` has, else the profile in force."""
    for name, dims in SIZE_PROFILES.items():
        if all(getattr(config, k) == v for k, v in dims.items()):
            return name
    return size_profile()


def ladder(base: RunConfig, hw=None) -> list[RunConfig]:
    """This machine's comparison: fp32, the recipe (and fp16 beside bf16 on a GPU), the recipe +
    ``full``, + ``selective``; where the recipe is fp32, the low precision last (emulated).
    ValueError: a device this machine lacks."""
    hw = hw or detect(base.device)
    rec = recommend_precision(hw)
    plain = base.replace(precision="fp32", checkpoint="none", compile=False)
    if rec.precision == "fp32":
        return [plain, plain.replace(checkpoint="full"), plain.replace(checkpoint="selective"),
                plain.replace(precision=rec.low)]
    rows = [plain, plain.replace(precision=rec.precision)]
    if hw.device == "cuda" and rec.precision == "bf16":
        rows.append(plain.replace(precision="fp16"))
    rows += [plain.replace(precision=rec.precision, checkpoint=p) for p in ("full", "selective")]
    return rows


def compare(configs: list[RunConfig | Accepted], *, budget_s: float | None = None,
            steps: int | None = None, timed: bool = True, progress: bool = True,
            force: bool = False, step_fn=train_step, hw=None) -> pd.DataFrame:
    """Measure and estimate each configuration (all pass `course_utils.measure.accept` first):
    memory with one step each, then time in alternation for about ``budget_s`` seconds (default:
    per size profile) or ``steps`` rounds. One row each: the config fields, each memory field
    ``F`` (bytes) and ``est_F``, step times, ``paired_step_time_s`` (`paired_step_s`), ratios to
    the first row; ``df.attrs["measurements"]``: the `Measurement`s.

    Raises:
        ValueError: an empty list, a non-positive budget or step count, a device this machine
            lacks, or a configuration `course_utils.guard.check_feasible` refuses (unless
            ``force``): all before anything is measured.
    """
    if not configs:
        raise ValueError(tr("compare() needs at least one RunConfig."))
    if budget_s is not None and not budget_s > 0:
        raise ValueError(tr("budget_s must be > 0 seconds, got {budget_s!r}.", budget_s=budget_s))
    check_positive_int("steps", steps, allow_none=True)
    hws = {}
    accepted = []
    for cfg in configs:  # refuse before measuring anything
        if not isinstance(cfg, Accepted) and cfg.device not in hws:
            hws[cfg.device] = hw if hw is not None else detect(cfg.device)
        accepted.append(accept(cfg, None if isinstance(cfg, Accepted) else hws[cfg.device],
                               force=force))
    first = accepted[0].config
    size = size_of(first)
    budget = budget_s or default_budget_s(size)
    ms = [new_measurement(a) for a in accepted]
    if progress:
        tqdm.write(_plan_words(len(configs), budget if timed else None,
                               sorted({m.config.precision for m in ms if m.emulated})))
    states = {}
    for i, (m, a) in enumerate(zip(tqdm(ms, desc=tr("memory"), disable=not progress,
                                        leave=False),
                                   accepted)):
        st = measure_memory(m, a, step_fn, time_emulated=timed and steps is None)
        if timed and st is not None:
            states[i] = st
    if states:
        order = list(states)
        with tqdm(total=len(order), desc=tr("step time"), disable=not progress,
                  leave=False) as bar:
            time_in_alternation([ms[i] for i in order], [states[i] for i in order],
                                budget if steps is None else None, steps, progress=bar,
                                device=first.device)
    states.clear()
    return _table(ms, size)


def _plan_words(n: int, budget_s: float | None, emulated: list[str]) -> str:
    """What `compare` is about to do, in one line (``budget_s`` None: memory only)."""
    if budget_s is None:
        return tr("measuring {n} configuration(s): memory with one step each", n=n)
    if not emulated:
        return tr("measuring {n} configuration(s): memory with one step each, then step time in "
                  "alternation for about {budget:g} s", n=n, budget=budget_s)
    return tr("measuring {n} configuration(s): memory with one step each, then step time in "
              "alternation for about {budget:g} s; {emulated} is emulated here: timed with one "
              "step", n=n, budget=budget_s, emulated=", ".join(emulated))


def paired_step_s(own_s, reference_s, r) -> float | None:
    """A row's step time as the tables print it (seconds, docs/method.md#time): ``reference_s``
    times the row's `course_utils.step_timing.TimeRatio` ``r``; ``own_s`` where ``r`` has no band."""
    if r is None or r.ratio is None or r.low is None or reference_s is None:
        return own_s
    return reference_s * r.ratio


def _table(ms: list[Measurement], size: str) -> pd.DataFrame:
    rows = []
    for m in ms:
        e = estimate(m.config)
        report_gaps(m, e)  # a large disagreement is told, never left for the learner to spot
        row = m.as_row()
        for f in MEMORY_FIELDS + ("saved_total",):
            row[f"est_{f}"] = getattr(e, f)
        row["est_recompute"] = e.recompute
        rows.append(row)
    df = pd.DataFrame(rows)
    first = ms[0]
    ratios = [time_ratio(m.step_times_s, first.step_times_s, size=size,
                         emulated=m.emulated or first.emulated) for m in ms]
    df["time_ratio"] = [r.ratio for r in ratios]
    df["time_ratio_low"] = [r.low for r in ratios]
    df["time_ratio_high"] = [r.high for r in ratios]
    df["time_verdict"] = [r.verdict if m is not first else ("emulated" if m.emulated else "reference")
                          for r, m in zip(ratios, ms)]
    df["paired_step_time_s"] = [paired_step_s(m.step_time_s, first.step_time_s, r)
                                if m is not first else m.step_time_s for r, m in zip(ratios, ms)]
    for col, name in (("peak_allocated", "peak_ratio"), ("saved_total", "saved_ratio")):
        base = getattr(first, col)
        df[name] = [(v / base) if (v is not None and base and pd.notna(v)) else None
                    for v in df[col]]
    df.attrs["measurements"] = ms
    df.attrs["size"] = size
    return df


def _policy_words(token: str) -> str | None:
    if token in ("full", "every-1"):
        return tr("full checkpointing")
    if token == "selective":
        return tr("selective checkpointing")
    if m := re.fullmatch(r"every-(\d+)", token):
        return tr("checkpointing every {k} blocks", k=m.group(1))
    if m := re.fullmatch(r"segments:(\d+)", token):
        return tr("{n} checkpointed segments", n=m.group(1))
    if m := re.fullmatch(r"memory-budget:(.+)", token):
        return tr("compile memory budget {budget}", budget=m.group(1))
    return None


def plain_label(label: str) -> str:
    """A `course_utils.config.RunConfig.label` in words: ``"bf16+full+accum2"`` -> ``"bf16 + full
    checkpointing, 2 micro-batches"``; anything after a space is kept as it is."""
    head, sep, tail = str(label).partition(" ")
    words, micro = [], ""
    for token in head.split("+"):
        if token.startswith("accum") and token[5:].isdigit():
            micro = tr(", {n} micro-batches", n=token[5:])
        elif token == "compile":
            words.append("torch.compile")
        else:
            words.append(_policy_words(token) or token)
    return " + ".join(words) + micro + (sep + tail if sep else "")


def round_sig(v, digits: int = 3):
    """``v`` rounded to ``digits`` significant figures (None / NaN stay None): 68.77 -> 68.8,
    0.06371 -> 0.0637, 4949.000996 -> 4950."""
    if v is None or pd.isna(v):
        return None
    v = float(v)
    if v == 0 or not math.isfinite(v):
        return v
    return round(v, digits - 1 - int(math.floor(math.log10(abs(v)))))


def sig_text(v, digits: int = 3) -> str | None:
    """``v`` at ``digits`` significant figures with no digit the rounding did not keep (None /
    NaN stay None): 109.43 -> ``"109"``, 23030.55 -> ``"23,000"``, 0.06371 -> ``"0.0637"``."""
    r = round_sig(v, digits)
    if r is None:
        return None
    if not math.isfinite(r):
        return str(r)
    if abs(r) >= 10 ** (digits - 1):
        return f"{r:,.0f}"
    return f"{r:.{digits}g}"


def size_text(n: int) -> str:
    """Bytes as text: GiB at two decimals, MiB at one decimal from 100 MiB, else at three
    significant figures."""
    if n >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB" if abs(n) >= 100 * MiB else f"{sig_text(n / MiB, 3)} MiB"


def time_cell(ratio, verdict, low=None, high=None) -> str:
    """A time ratio in a table cell: ``"1.31x slower"``, ``"1.43x faster"`` (a speed-up), else the
    verdict alone (docs/method.md#verdict-words; ``"emulated"`` without its factor, which the setup
    cell prints once). With the band ``low``-``high``, a verdict carries it as printed
    (`printed_band`): ``"1.43x faster (1.21-1.70x)"``, since no verdict stands without its band."""
    if ratio is None or pd.isna(ratio) or verdict == "not timed":
        return tr("not timed")
    if verdict == "reference":
        return tr("1.00x (reference)")
    if verdict == "emulated":  # its factor is printed once, by the setup cell's matmul probe
        return tr("emulated")
    cell = (tr("{factor:.2f}x faster", factor=1 / ratio) if verdict == "faster"
            else tr("{ratio:.2f}x slower", ratio=ratio) if verdict == "slower" else tr(verdict))
    if verdict not in ("faster", "slower", "within noise") or pd.isna(low) or pd.isna(high):
        return cell
    lo, hi = printed_band(ratio, low, high) if verdict == "faster" else (low, high)
    return f"{cell} ({band_span(lo, hi)})"


def _per_token(ratio, low, high, verdicts, tokens):
    """Step-time ratios to the first row as time-per-token ratios, verdicts from the scaled band."""
    out = [[], [], [], []]
    for i, (r, lo, hi, v) in enumerate(zip(ratio, low, high, verdicts)):
        c = tokens[0] / tokens[i]
        r2 = None if r is None or pd.isna(r) else r * c
        lo2 = None if lo is None or pd.isna(lo) else lo * c
        hi2 = None if hi is None or pd.isna(hi) else hi * c
        if v in ("faster", "slower", "within noise") and None not in (r2, lo2, hi2):
            pl, ph = printed_band(r2, lo2, hi2)
            v = "within noise" if pl <= 1.0 <= ph else ("faster" if r2 < 1 else "slower")
        for lst, x in zip(out, (r2, lo2, hi2, v)):
            lst.append(x)
    return out


def summary(df: pd.DataFrame, detail: bool = False) -> pd.DataFrame:
    """A readable view of `compare`'s table (and of the dashboard's history), one row per
    configuration in words (`plain_label`): ``step ms`` (`paired_step_s`), ``time vs first``
    (`time_cell`; per token where the tokens per step differ), measured and estimated peak and
    saved MiB, as `sig_text`; ``detail=True`` adds tokens/s, each row's own
    median, the ratios to the first row, the saved activations and autocast weight copies."""
    def mib(col):
        return [sig_text(None if v is None or pd.isna(v) else v / MiB) for v in df[col]]

    labels = [plain_label(v) for v in df["label"]]
    batch = list(df["batch_size"]) if "batch_size" in df else [None] * len(df)
    accum = list(df["grad_accum_steps"]) if "grad_accum_steps" in df else [1] * len(df)
    tokens = [None if b is None else b * a for b, a in zip(batch, accum)]
    per_token = len(set(tokens)) > 1 and None not in tokens
    if per_token:  # different batches: say each row's, and compare time per token
        labels = [tr("{label} of {batch}", label=lab, batch=b) if a > 1
                  else tr("{label}, micro-batch {batch}", label=lab, batch=b)
                  for lab, b, a in zip(labels, batch, accum)]
    elif len(set(batch)) > 1:  # accumulation at the same tokens per step: say the split
        labels = [tr("{label} of {batch}", label=lab, batch=b) if a > 1 else lab
                  for lab, b, a in zip(labels, batch, accum)]
    out = pd.DataFrame({"config": labels})
    own = [None if v is None or pd.isna(v) else float(v) for v in df["step_time_s"]]
    paired = [None if v is None or pd.isna(v) else float(v)
              for v in df.get("paired_step_time_s", [None] * len(df))]
    steps = [p if p is not None else o for p, o in zip(paired, own)]
    ratio, low, high, verdicts = (list(df[c]) if c in df else [None] * len(df)
                                  for c in ("time_ratio", "time_ratio_low", "time_ratio_high",
                                            "time_verdict"))
    out["step ms"] = ["" if v == "emulated" else sig_text(None if t is None else t * 1e3)
                      for t, v in zip(steps, verdicts)]
    if per_token:
        ratio, low, high, verdicts = _per_token(ratio, low, high, verdicts, tokens)
    cells = [time_cell(r, v, lo, hi) for r, v, lo, hi in zip(ratio, verdicts, low, high)]
    if "oom" in df:
        cells = [tr("out of memory") if o else c for o, c in zip(df["oom"], cells)]
    out["time per token vs first" if per_token else "time vs first"] = cells
    if detail:
        out["tokens/s"] = [  # at the printed step time: tokens per step / that step
            None if v is None or pd.isna(v) or not s or not o else sig_text(v * o / s)
            for v, s, o in zip(df.get("tokens_per_s", [None] * len(df)), steps, own)]
        out["own median step ms"] = [sig_text(None if v is None else v * 1e3) for v in own]
    out["peak MiB"] = mib("peak_allocated")
    out["est peak MiB"] = mib("est_peak_allocated")
    if detail:
        out["peak vs first"] = [sig_text(v) for v in df["peak_ratio"]]
    out["saved MiB"] = mib("saved_total")
    out["est saved MiB"] = mib("est_saved_total")
    if detail:
        out["saved vs first"] = [sig_text(v) for v in df["saved_ratio"]]
        out["activations MiB"] = mib("activations")
        out["autocast weight copies MiB"] = mib("autocast_weight_copies")
    return out.set_index("config")
