"""What a dashboard Run reports (`course_utils.dashboard`): the message, the history table
(`course_utils.experiments.summary`), the smaller variants after an out-of-memory error. A
step-time ratio is printed only outside the measured noise (docs/method.md#verdict-words).
"""
from __future__ import annotations

import html

import pandas as pd

from ..config import RunConfig
from ..experiments import summary, time_cell
from ..hardware import HardwareInfo, recommend_precision
from ..i18n import label, tr
from ..memory_model import estimate
from ..step_timing import TOO_SMALL, TOO_SMALL_WHY, printed_band
from ..terms import MiB

__all__ = ("box", "dtype_text", "first_line", "header_html", "history_table", "oom_suggestions",
           "preview_message", "result_message", "table_html", "time_words")

_STYLE = ("<style>.course-history th, .course-history td {text-align: right; padding: 1px 6px;"
          " line-height: 1.3; white-space: nowrap;} .course-history td:nth-child(2), "
          ".course-history th:nth-child(2) {text-align: left;}</style>")
_COLORS = (("ok", "#1b5e20", "#e8f5e9"), ("info", "#0d47a1", "#e3f2fd"),
           ("warn", "#7a4f01", "#fff8e1"), ("error", "#b71c1c", "#ffebee"))


def oom_suggestions(config: RunConfig, hw: HardwareInfo | None = None, limit: int = 3) -> list[str]:
    """Smaller variants of ``config`` with their estimated peak memory, smallest first, e.g.
    ``"bf16 + checkpoint 'full': estimated peak 310 MiB (now 1210 MiB)"`` (analytic model,
    `course_utils.memory_model.estimate`; the low precision is this hardware's: fp16 on a T4)."""
    low = "bf16"
    if hw is not None:
        rec = recommend_precision(hw)
        low = rec.precision if rec.precision != "fp32" else rec.low
    now = estimate(config).peak_allocated
    candidates = {tr("{low} autocast", low=low): config.replace(precision=low),
                  tr("checkpoint 'full'"): config.replace(checkpoint="full"),
                  tr("{low} + checkpoint 'full'", low=low): config.replace(precision=low,
                                                                          checkpoint="full")}
    if config.batch_size > 1:
        half, accum = max(1, config.batch_size // 2), config.grad_accum_steps * 2
        candidates[tr("batch {half} x accumulation {accum} (same effective batch)", half=half,
                      accum=accum)] = config.replace(batch_size=half, grad_accum_steps=accum)
    if config.seq_len > 16:
        candidates[tr("sequence {seq_len}", seq_len=config.seq_len // 2)] = \
            config.replace(seq_len=config.seq_len // 2)
    rows = []
    for name, cfg in candidates.items():
        peak = estimate(cfg).peak_allocated
        if cfg != config and peak < now:
            rows.append((peak, tr("{variant}: estimated peak {peak:,.0f} MiB (now {now:,.0f} MiB)",
                                  variant=name, peak=peak / MiB, now=now / MiB)))
    return [text for _, text in sorted(set(rows))[:limit]]


def history_table(df: pd.DataFrame) -> pd.DataFrame:
    """The dashboard's history as `course_utils.experiments.summary`'s table with the row number,
    the size and the dtypes of the saved activations; ratios are to each Run's baseline."""
    labels = df["label"] + df["baseline"].map({True: " " + tr("(baseline)"), False: ""})
    out = summary(df.assign(label=labels)).reset_index()
    out = out.rename(columns={"time vs first": "time vs baseline"})
    out.insert(0, "#", df["run"].to_numpy())
    out.insert(2, "size", [f"b{b} s{s} L{n}" + (f" x{a}" if a > 1 else "") for b, s, n, a in
                           zip(df["batch_size"], df["seq_len"], df["n_layers"],
                               df["grad_accum_steps"])])
    out["saved dtypes"] = df["saved_dtypes"].to_numpy()
    return out


def box(kind: str, lines: list[str]) -> str:
    """A coloured message box (``ok``, ``info``, ``warn``, ``error``) of HTML ``lines``."""
    fg, bg = {k: (f, b) for k, f, b in _COLORS}[kind]
    return (f'<div class="course-msg course-msg-{kind}" style="color:{fg};background:{bg};'
            f'padding:6px 10px;border-radius:4px;line-height:1.4">{"<br>".join(lines)}</div>')


def first_line(e: BaseException) -> str:
    """``"RuntimeError: the first line of its message"``."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else tr('no message')}"


def dtype_text(acts: dict | None) -> str:
    """``{"bf16": 770, "fp32": 230}`` (bytes) -> ``"bf16 77%, fp32 23%"``."""
    total = sum((acts or {}).values())
    if not total:
        return ""
    return ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(acts.items(), key=lambda kv: -kv[1]))


def time_words(row: dict) -> str:
    """What the message says about a row's step time against its baseline."""
    verdict, ratio = row.get("time_verdict"), row.get("time_ratio")
    low, high = row.get("time_ratio_low"), row.get("time_ratio_high")
    timing = tr(str(row.get("timing")))  # how it was timed, from the measurement
    if verdict in ("faster", "slower"):
        cell = time_cell(ratio, verdict)
        if pd.notna(low) and pd.notna(high):  # the band in the words' own direction
            lo, hi = printed_band(ratio, low, high) if verdict == "faster" else (low, high)
            return tr("step time {ratio} than the baseline's ({timing}, noise band "
                      "{low:.2f}-{high:.2f}x)", ratio=cell, timing=timing, low=lo, high=hi)
        return tr("step time {ratio} than the baseline's ({timing})", ratio=cell,
                  timing=timing)
    if verdict == "within noise":
        return tr("step time: within noise of the baseline's (its noise band includes 1.00x; "
                  "{timing})", timing=timing)
    if verdict == "too few rounds":
        return tr("step time: too few rounds to tell ({timing})", timing=timing)
    if verdict == TOO_SMALL:
        return tr("step time: too small to time ({why})", why=tr(TOO_SMALL_WHY))
    if verdict == "emulated":
        return tr("step time: {precision} is emulated here: not the speed of real hardware "
                  "(timed with the fewest steps that give a number)", precision=row["precision"])
    return tr("step time: not timed")


def table_html(df: pd.DataFrame) -> str:
    """`history_table` of ``df`` as the dashboard's HTML table (class ``course-history``)."""
    shown = history_table(df).rename(columns=label)  # labels in the learner's language
    return (_STYLE + '<div style="overflow-x:auto">' + shown.to_html(
        index=False, na_rep="-", border=0, classes="course-history",
        float_format=lambda v: f"{v:,.2f}") + "</div>")


def _measured(row: dict, base: dict) -> str:
    step = row.get("paired_step_time_s")  # the baseline's median x the ratio: agrees with it
    step = step if pd.notna(step) else row.get("step_time_s")
    parts = [tr("step {ms:,.1f} ms", ms=step * 1e3) if pd.notna(step) else ""]
    other = row is not base
    if other and base["status"] == "ok":
        parts.append(time_words(row))
    if pd.notna(row.get("peak_allocated")):
        peak = row["peak_allocated"] / MiB
        parts.append(tr("peak {peak:,.1f} MiB ({ratio:.2f}x the baseline's)", peak=peak,
                        ratio=row["peak_ratio"])
                     if other and pd.notna(row.get("peak_ratio"))
                     else tr("peak {peak:,.1f} MiB", peak=peak))
    if pd.notna(row.get("saved_total")):
        saved = row["saved_total"] / MiB
        parts.append(tr("saved tensors {saved:,.2f} MiB ({ratio:.2f}x)", saved=saved,
                        ratio=row["saved_ratio"])
                     if other and pd.notna(row.get("saved_ratio"))
                     else tr("saved tensors {saved:,.2f} MiB", saved=saved))
    if row.get("saved_dtypes"):
        parts.append(tr("saved activations by dtype: {dtypes}", dtypes=row["saved_dtypes"]))
    return "; ".join(p for p in parts if p) + "."


def result_message(configs, rows: list[dict], hw: HardwareInfo, notes=(), forced=(),
                   took_s: float | None = None, predicted_s: float | None = None) -> str:
    """The message after a Run of ``configs`` (baseline first) that added history ``rows``, with
    ``notes``, the refusals that "run anyway" ``forced``, and the Run's seconds, measured and
    predicted."""
    base, row = rows[0], rows[-1]
    lines, kind = [], "ok"
    name = f"<b>{html.escape(row['label'])}</b> (#{row['run']})"
    if row["status"] != "ok":
        kind = "error"
        error = html.escape(str(row.get("error") or ""))
        lines.append(tr("{name} ran out of memory: {error}", name=name, error=error)
                     if row["status"] == "OOM" else
                     tr("{name} failed: {error}", name=name, error=error))
        if row["status"] == "OOM":
            sugg = oom_suggestions(configs[-1], hw)
            if sugg:
                lines.append(tr("Smaller variants, by the analytic model: {variants}.",
                                variants="; ".join(html.escape(s) for s in sugg)))
        lines.append(tr("The dashboard still works: change a setting and press Run again."))
    elif row is base:
        lines.append(tr("{name} is the baseline itself (the recipe here, no checkpointing).",
                        name=name))
        lines.append(_measured(row, base))
    else:
        lines.append(tr("{name} against its baseline {baseline} (#{run}: the recipe here, no "
                        "checkpointing, same size).", name=name,
                        baseline=f"<b>{html.escape(base['label'])}</b>", run=base["run"]))
        if base["status"] == "OOM":
            lines.append(tr("The baseline of this size ran out of memory; this configuration "
                            "fits."))
        lines.append(_measured(row, base))
    lines += [tr("ran anyway: {problem}", problem=html.escape(p)) for p in forced]
    lines += [tr("note: {note}", note=html.escape(n)) for n in notes]
    if took_s is not None:
        lines.append(tr("This Run took {took:.1f} s (predicted {predicted:.1f} s).", took=took_s,
                        predicted=predicted_s) if predicted_s else
                     tr("This Run took {took:.1f} s.", took=took_s))
    return box(kind, lines)


def header_html(hw: HardwareInfo, size: str, base: RunConfig, recipe, budget_s: float,
                synchronous: str | None = None) -> str:
    """The dashboard's first line: the hardware, the size, the recipe and what a Run does;
    ``synchronous``: why Runs happen on the kernel's thread here (None: on a worker thread)."""
    scaler = " + GradScaler" if recipe.grad_scaler else ""
    sync = ("" if synchronous is None else " " + tr(
        "A Run happens in the kernel's thread here ({why}): the progress bar still moves, but "
        "there is no Stop button; interrupt the kernel to stop a Run.",
        why=html.escape(synchronous)))
    return tr("{hardware} ({device}), size profile {size}: d_model {d_model}, {n_heads} heads. "
              "Recipe here: {recipe}. Each Run compares your configuration with its baseline, "
              "{precision} without checkpointing at the same size, timed in alternation for about "
              "{budget:g} s.", hardware=f"<b>{html.escape(hw.name)}</b>", device=hw.device,
              size=f"<code>{size}</code>", d_model=base.d_model, n_heads=base.n_heads,
              recipe=f"<b>{recipe.precision}</b>{scaler}",
              precision=f"<b>{recipe.precision}</b>", budget=budget_s) + sync


def preview_message(cfg: RunConfig, configs, plan, problems, notes, force: bool,
                    slow_limit_s: float) -> str:
    """What the controls set up, before Run: the configuration and its analytic estimate, its
    baseline, the predicted duration (`course_utils.dashboard.run.RunPlan`), refusals, notes."""
    est = estimate(cfg)
    baseline = f"<b>{configs[0].label}</b>"
    lines = [tr("{config}: {n_layers} layers x d_model {d_model}, batch {batch} x sequence "
                "{seq_len} x accumulation {accum} = {tokens:,} tokens per step; estimated peak "
                "{peak:,.1f} MiB, saved tensors {saved:,.1f} MiB (analytic model).",
                config=f"<b>{html.escape(cfg.label)}</b>", n_layers=cfg.n_layers,
                d_model=cfg.d_model, batch=cfg.batch_size, seq_len=cfg.seq_len,
                accum=cfg.grad_accum_steps, tokens=cfg.tokens_per_step,
                peak=est.peak_allocated / MiB, saved=est.saved_total / MiB),
             tr("Baseline: {baseline} (the recipe here, no checkpointing): this configuration is "
                "the baseline itself.", baseline=baseline) if len(configs) == 1 else
             tr("Baseline: {baseline} (the recipe here, no checkpointing), same size, timed in "
                "alternation with it.", baseline=baseline)]
    if plan.seconds is None:
        todo = ", ".join(sorted({c.precision for c in plan.uncalibrated}))
        lines.append(tr("This Run: {plan}: Run first calibrates {precisions} with one short "
                        "step, then refuses the Run if it would take more than {limit:.0f} s.",
                        plan=plan.describe(), precisions=todo, limit=slow_limit_s))
    else:
        lines.append(tr("This Run: {plan}.", plan=plan.describe()))
    said = tr("runs anyway") if force else tr("refused")
    lines += [f"<b>{said}:</b> {html.escape(p)}" for p in problems]
    if problems and not force:
        lines.append(tr("Change the settings, or tick {run_anyway}.",
                        run_anyway=f"<i>{tr('run anyway')}</i>"))
    lines += [tr("note: {note}", note=html.escape(n)) for n in notes]
    return box("warn" if problems else "info", lines)
