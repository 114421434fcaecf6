"""What a dashboard Run reports (`course_utils.dashboard`): the message, the history table, the
smaller variants after an out-of-memory error.

Time words follow the course's one rule (`course_utils.step_timing.time_ratio`): a step-time ratio
is printed only when its verdict is faster or slower, outside the measured noise; otherwise the
words say "within noise", "too few rounds", "too small to time" or "emulated here: not the speed of real
hardware". The table is `course_utils.experiments.summary`, the course's one results table.
"""
from __future__ import annotations

import html

import pandas as pd

from ..config import RunConfig
from ..experiments import summary, time_cell
from ..hardware import HardwareInfo, recommend_precision
from ..memory_model import estimate
from ..step_timing import TOO_SMALL, TOO_SMALL_WHY
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
    candidates = {f"{low} autocast": config.replace(precision=low),
                  "checkpoint 'full'": config.replace(checkpoint="full"),
                  f"{low} + checkpoint 'full'": config.replace(precision=low, checkpoint="full")}
    if config.batch_size > 1:
        half, accum = max(1, config.batch_size // 2), config.grad_accum_steps * 2
        candidates[f"batch {half} x accumulation {accum} (same effective batch)"] = \
            config.replace(batch_size=half, grad_accum_steps=accum)
    if config.seq_len > 16:
        candidates[f"sequence {config.seq_len // 2}"] = config.replace(seq_len=config.seq_len // 2)
    rows = []
    for name, cfg in candidates.items():
        peak = estimate(cfg).peak_allocated
        if cfg != config and peak < now:
            rows.append((peak, f"{name}: estimated peak {peak / MiB:,.0f} MiB (now {now / MiB:,.0f} MiB)"))
    return [text for _, text in sorted(set(rows))[:limit]]


def history_table(df: pd.DataFrame) -> pd.DataFrame:
    """The dashboard's history as a readable table: `course_utils.experiments.summary` (the
    course's one results table: time ratios only outside the noise) with the row number, the
    size and the measured dtypes of the saved activations; ratios are to each Run's baseline."""
    labels = df["label"] + df["baseline"].map({True: " (baseline)", False: ""})
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
    return f"{type(e).__name__}: {text.splitlines()[0] if text else 'no message'}"


def dtype_text(acts: dict | None) -> str:
    """``{"bf16": 770, "fp32": 230}`` (bytes) -> ``"bf16 77%, fp32 23%"``."""
    total = sum((acts or {}).values())
    if not total:
        return ""
    return ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(acts.items(), key=lambda kv: -kv[1]))


def time_words(row: dict, size: str) -> str:
    """What the message says about a row's step time against its baseline: a ratio only when
    the verdict is faster or slower (outside the noise)."""
    verdict, ratio = row.get("time_verdict"), row.get("time_ratio")
    low, high = row.get("time_ratio_low"), row.get("time_ratio_high")
    if verdict in ("faster", "slower"):
        band = ""
        if pd.notna(low) and pd.notna(high):  # the band in the words' own direction
            lo, hi = (1 / high, 1 / low) if verdict == "faster" else (low, high)
            band = f", noise band {lo:.2f}-{hi:.2f}x"
        return f"step time {time_cell(ratio, verdict)} than the baseline's ({row.get('timing')}{band})"
    if verdict == "within noise":
        return ("step time: within noise of the baseline's (its noise band includes 1.00x; "
                f"{row.get('timing')})")
    if verdict == "too few rounds":
        return f"step time: too few rounds to tell ({row.get('timing')})"
    if verdict == TOO_SMALL:
        return f"step time: {TOO_SMALL} ({TOO_SMALL_WHY})"
    if verdict == "emulated":
        return (f"step time: {row['precision']} is emulated here: not the speed of real hardware "
                "(timed with the fewest steps that give a number)")
    return "step time: not timed"


def table_html(df: pd.DataFrame) -> str:
    """`history_table` of ``df`` as the dashboard's HTML table (class ``course-history``)."""
    return (_STYLE + '<div style="overflow-x:auto">' + history_table(df).to_html(
        index=False, na_rep="-", border=0, classes="course-history",
        float_format=lambda v: f"{v:,.2f}") + "</div>")


def _measured(row: dict, base: dict, size: str) -> str:
    step = row.get("paired_step_time_s")  # the baseline's median x the ratio: agrees with it
    step = step if pd.notna(step) else row.get("step_time_s")
    parts = [f"step {step * 1e3:,.1f} ms" if pd.notna(step) else ""]
    other = row is not base
    if other and base["status"] == "ok":
        parts.append(time_words(row, size))
    if pd.notna(row.get("peak_allocated")):
        ratio = (f" ({row['peak_ratio']:.2f}x the baseline's)"
                 if other and pd.notna(row.get("peak_ratio")) else "")
        parts.append(f"peak {row['peak_allocated'] / MiB:,.1f} MiB{ratio}")
    if pd.notna(row.get("saved_total")):
        ratio = f" ({row['saved_ratio']:.2f}x)" if other and pd.notna(row.get("saved_ratio")) else ""
        parts.append(f"saved tensors {row['saved_total'] / MiB:,.2f} MiB{ratio}")
    if row.get("saved_dtypes"):
        parts.append(f"saved activations by dtype: {row['saved_dtypes']}")
    return "; ".join(p for p in parts if p) + "."


def result_message(configs, rows: list[dict], hw: HardwareInfo, size: str, notes=(),
                   forced=(), took_s: float | None = None,
                   predicted_s: float | None = None) -> str:
    """The message after a Run of ``configs`` (baseline first) that added history ``rows``.

    Args:
        notes: notes to show (e.g. "bf16 is emulated on this CPU").
        forced: refusals that "run anyway" overrode.
        took_s, predicted_s: the Run's seconds, measured and predicted.
    """
    base, row = rows[0], rows[-1]
    lines, kind = [], "ok"
    name = f"<b>{html.escape(row['label'])}</b> (#{row['run']})"
    if row["status"] != "ok":
        kind = "error"
        what = "ran out of memory" if row["status"] == "OOM" else "failed"
        lines.append(f"{name} {what}: {html.escape(str(row.get('error') or ''))}")
        if row["status"] == "OOM":
            sugg = oom_suggestions(configs[-1], hw)
            if sugg:
                lines.append("Smaller variants, by the analytic model: "
                             + "; ".join(html.escape(s) for s in sugg) + ".")
        lines.append("The dashboard still works: change a setting and press Run again.")
    elif row is base:
        lines.append(f"{name} is the baseline itself (the recipe here, no checkpointing).")
        lines.append(_measured(row, base, size))
    else:
        lines.append(f"{name} against its baseline <b>{html.escape(base['label'])}</b> "
                     f"(#{base['run']}: the recipe here, no checkpointing, same size).")
        if base["status"] == "OOM":
            lines.append("The baseline of this size ran out of memory; this configuration fits.")
        lines.append(_measured(row, base, size))
    lines += [f"ran anyway: {html.escape(p)}" for p in forced]
    lines += [f"note: {html.escape(n)}" for n in notes]
    if took_s is not None:
        lines.append(f"This Run took {took_s:.1f} s" + (f" (predicted {predicted_s:.1f} s)."
                                                        if predicted_s else "."))
    return box(kind, lines)


def header_html(hw: HardwareInfo, size: str, base: RunConfig, recipe, budget_s: float,
                synchronous: str | None = None) -> str:
    """The dashboard's first line: the hardware, the size, the recipe and what a Run does.

    ``synchronous``: why Runs happen on the kernel's thread here (e.g. on Colab), said with
    what that means (no Stop button); None where they happen on a worker thread."""
    scaler = " + GradScaler" if recipe.grad_scaler else ""
    sync = ("" if synchronous is None else
            f" A Run happens in the kernel's thread here ({html.escape(synchronous)}): the "
            "progress bar still moves, but there is no Stop button; interrupt the kernel to "
            "stop a Run.")
    return (f"<b>{html.escape(hw.name)}</b> ({hw.device}), size profile <code>{size}</code>: "
            f"d_model {base.d_model}, {base.n_heads} heads. Recipe here: <b>{recipe.precision}"
            f"</b>{scaler}. Each Run compares your configuration with its baseline, <b>"
            f"{recipe.precision}</b> without checkpointing at the same size, timed in "
            f"alternation for about {budget_s:g} s.{sync}")


def preview_message(cfg: RunConfig, configs, plan, problems, notes, force: bool,
                    slow_limit_s: float) -> str:
    """What the controls set up, before Run: the configuration and its analytic estimate, its
    baseline, the predicted duration (`course_utils.dashboard.run.RunPlan`), refusals, notes."""
    est = estimate(cfg)
    lines = [(f"<b>{html.escape(cfg.label)}</b>: {cfg.n_layers} layers x d_model {cfg.d_model}, "
              f"batch {cfg.batch_size} x sequence {cfg.seq_len} x accumulation "
              f"{cfg.grad_accum_steps} = {cfg.tokens_per_step:,} tokens per step; estimated peak "
              f"{est.peak_allocated / MiB:,.1f} MiB, saved tensors {est.saved_total / MiB:,.1f} "
              "MiB (analytic model)."),
             f"Baseline: <b>{configs[0].label}</b> (the recipe here, no checkpointing)"
             + (": this configuration is the baseline itself." if len(configs) == 1 else
                ", same size, timed in alternation with it.")]
    if plan.seconds is None:
        todo = ", ".join(sorted({c.precision for c in plan.uncalibrated}))
        lines.append(f"This Run: {plan.describe()}: Run first calibrates {todo} with one short "
                     f"step, then refuses the Run if it would take more than {slow_limit_s:.0f} s.")
    else:
        lines.append(f"This Run: {plan.describe()}.")
    lines += [f"<b>{'runs anyway' if force else 'refused'}:</b> {html.escape(p)}"
              for p in problems]
    if problems and not force:
        lines.append("Change the settings, or tick <i>run anyway</i>.")
    lines += [f"note: {html.escape(n)}" for n in notes]
    return box("warn" if problems else "info", lines)
