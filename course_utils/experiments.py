"""Compare configurations, measured and estimated side by side; the ``course-bench`` CLI.

``compare(configs)`` measures each `RunConfig` and returns a pandas DataFrame with one row per
configuration: the measured memory fields (bytes), the estimate of each (``est_`` prefix), step
time (seconds), tokens/s, and ratios to the first row. ``course-bench`` runs the course's
ladder (fp32 -> bf16 -> bf16 + checkpointing) at this machine's size profile.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from .config import (PRECISIONS, SIZE_PROFILES, MiB, RunConfig, check_feasible, config_for,
                     size_profile)
from .measure import MEMORY_FIELDS, measure
from .memory_model import estimate

__all__ = ["compare", "ladder", "summary", "MiB", "main", "default_min_run_time"]


#: Seconds of timed steps per configuration, per size profile (enough for a stable median).
_MIN_RUN_TIME = {"smoke": 0.2, "cpu": 1.0}


def default_min_run_time(size: str) -> float:
    """Seconds of timed steps per configuration at a size profile (GPU profiles: 2 s)."""
    return _MIN_RUN_TIME.get(size, 2.0)


def ladder(base: RunConfig, hw=None) -> list[RunConfig]:
    """The course's ladder for ``base``'s device: fp32; bf16 (native or CPU) and/or fp16 (CUDA);
    then the preferred low precision + ``full`` and + ``selective`` checkpointing.

    On a CUDA GPU without native bf16 (T4, V100) bf16 rows are left out and fp16 + GradScaler
    takes their place.
    """
    from .hardware import detect
    hw = hw or detect(base.device)
    lows = []
    if hw.device != "cuda" or hw.native_bf16:
        lows.append("bf16")
    if hw.device == "cuda":
        lows.append("fp16")
    best = lows[0]
    rows = [base.replace(precision="fp32", checkpoint="none")]
    rows += [base.replace(precision=p, checkpoint="none") for p in lows]
    rows += [base.replace(precision=best, checkpoint=pol) for pol in ("full", "selective")]
    return rows


def compare(configs: list[RunConfig], min_run_time: float | None = None,
            steps: int | None = None, progress: bool = True, force: bool = False) -> pd.DataFrame:
    """Measure and estimate each configuration; one row each, ratios to the first row.

    Columns: ``label``, the config fields, for each memory field ``F`` (bytes) ``F`` measured and
    ``est_F`` estimated, ``saved_total`` / ``est_saved_total``, ``step_time_s``,
    ``step_time_iqr_s``, ``tokens_per_s``, ``time_ratio``, ``peak_ratio``, ``saved_ratio``
    (each measured value / the first row's), ``oom``, ``error``, ``notes``.

    Raises:
        ValueError: an empty list, or a configuration refused by `check_feasible` (unless
            ``force``).
    """
    if not configs:
        raise ValueError("compare() needs at least one RunConfig.")
    for cfg in configs:  # refuse before measuring anything
        check_feasible(cfg, force=force)
    rows = []
    for cfg in tqdm(configs, desc="measuring", disable=not progress, leave=False):
        m = measure(cfg, min_run_time=1.0 if min_run_time is None else min_run_time,
                    steps=steps, force=force)
        e = estimate(cfg)
        row = m.as_row()
        for f in MEMORY_FIELDS + ("saved_total",):
            row[f"est_{f}"] = getattr(e, f)
        row["est_recompute"] = e.recompute
        rows.append(row)
    df = pd.DataFrame(rows)
    first = df.iloc[0]
    for col, name in (("step_time_s", "time_ratio"), ("peak_allocated", "peak_ratio"),
                      ("saved_total", "saved_ratio")):
        base = first[col]
        df[name] = [(v / base) if (v is not None and base and pd.notna(v)) else None
                    for v in df[col]]
    return df


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """A readable view of `compare`'s table: milliseconds, MiB, ratios, measured vs estimated."""
    def mib(col):
        return [None if v is None or pd.isna(v) else round(v / MiB, 2) for v in df[col]]

    out = pd.DataFrame({"config": df["label"]})
    out["step ms"] = [None if v is None or pd.isna(v) else round(v * 1e3, 1)
                      for v in df["step_time_s"]]
    out["time x"] = df["time_ratio"].round(2)
    out["tokens/s"] = [None if v is None or pd.isna(v) else int(v) for v in df["tokens_per_s"]]
    out["peak MiB"] = mib("peak_allocated")
    out["est peak"] = mib("est_peak_allocated")
    out["peak x"] = df["peak_ratio"].round(3)
    out["saved MiB"] = mib("saved_total")
    out["est saved"] = mib("est_saved_total")
    out["saved x"] = df["saved_ratio"].round(3)
    out["acts MiB"] = mib("activations")
    out["w-copies MiB"] = mib("autocast_weight_copies")
    if df["oom"].any():
        out["OOM"] = df["oom"]
    return out.set_index("config")


def _rows_for_json(df: pd.DataFrame) -> list[dict]:
    rows = []
    for rec in df.to_dict(orient="records"):
        clean = {k: (None if isinstance(v, float) and pd.isna(v) else v) for k, v in rec.items()}
        measured = {f: clean[f] for f in MEMORY_FIELDS + ("saved_total",)}
        measured.update({k: clean[k] for k in ("peak_reserved", "peak_method", "step_time_s",
                                                "step_time_iqr_s", "tokens_per_s")})
        estimated = {f: clean[f"est_{f}"] for f in MEMORY_FIELDS + ("saved_total",)}
        estimated["recompute"] = clean["est_recompute"]
        config = {k: clean[k] for k in ("precision", "checkpoint", "compile", "batch_size",
                                        "seq_len", "n_layers", "d_model", "grad_accum_steps",
                                        "device")}
        rows.append({"label": clean["label"], "config": config, "measured": measured,
                     "estimated": estimated,
                     "ratios": {k: clean[k] for k in ("time_ratio", "peak_ratio", "saved_ratio")},
                     "oom": clean["oom"], "error": clean["error"], "notes": clean["notes"]})
    return rows


def _parse_list(text: str, valid=None, what="value") -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"no {what} given")
    if valid is not None:
        bad = [t for t in items if t not in valid]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad}: expected {', '.join(valid)}")
    return items


def main(argv: list[str] | None = None) -> int:
    """``course-bench``: measure the ladder (or a grid) and print/write the comparison.

    Exit status 0 on success, 2 on bad arguments or a refused configuration.
    """
    p = argparse.ArgumentParser(
        prog="course-bench",
        description="Train the course's byte-level transformer on real text under fp32, bf16 "
                    "autocast and bf16 + activation checkpointing (plus fp16 + GradScaler on "
                    "CUDA, and selective checkpointing); print measured step time, peak memory "
                    "and saved-activation bytes next to the analytic estimate.")
    p.add_argument("--size", choices=list(SIZE_PROFILES), default=None,
                   help="size profile (default: $COURSE_SIZE, else chosen from the hardware)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:N or mps (default: best)")
    p.add_argument("--precisions", type=lambda s: _parse_list(s, PRECISIONS, "precision"),
                   default=None, help="comma-separated, e.g. fp32,bf16 (with --policies: a grid)")
    p.add_argument("--policies", type=lambda s: _parse_list(s, None, "policy"), default=None,
                   help="comma-separated checkpoint policies: none, full, every-K, segments:N, "
                        "selective")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per configuration (default: as many as fit in a time budget)")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--out", type=Path, default=None, help="folder for bench.json and bench.png")
    p.add_argument("--force", action="store_true",
                   help="run configurations that would be refused (fp16 on a CPU, emulated bf16)")
    args = p.parse_args(argv)

    from .hardware import detect, recommend_precision
    try:
        size = args.size or size_profile()
        overrides = {}
        if args.device:
            overrides["device"] = args.device
        if args.batch_size:
            overrides["batch_size"] = args.batch_size
        if args.seq_len:
            overrides["seq_len"] = args.seq_len
        base = config_for(size, **overrides)
        hw = detect(base.device)
        if args.precisions or args.policies:
            precs = args.precisions or ["fp32", "bf16"]
            pols = args.policies or ["none"]
            configs = [base.replace(precision="fp32", checkpoint="none")]
            configs += [base.replace(precision=pr, checkpoint=po) for pr in precs for po in pols
                        if not (pr == "fp32" and po == "none")]
        else:
            configs = ladder(base, hw)
        if args.steps is not None and args.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {args.steps}.")
    except ValueError as e:
        print(f"course-bench: {e}", file=sys.stderr)
        return 2

    rec = recommend_precision(hw)
    print(f"course-bench: {hw.name} ({hw.device}), torch {hw.torch_version}, size '{size}': "
          f"{base.n_layers} layers, d_model {base.d_model}, {base.n_heads} heads, "
          f"seq {base.seq_len}, batch {base.batch_size}")
    print(f"recommended recipe: {rec.precision}{' + GradScaler' if rec.grad_scaler else ''} "
          f"({rec.reason})")
    if hw.device == "cpu" and not hw.native_bf16:
        print("note: this CPU has no avx512_bf16/AMX instructions, so bf16 autocast is emulated "
              "and may run slower than fp32 here; its memory saving still holds.")
    try:
        df = compare(configs, min_run_time=default_min_run_time(size), steps=args.steps,
                     force=args.force)
    except ValueError as e:
        print(f"course-bench: {e}", file=sys.stderr)
        return 2
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summary(df).to_string())
    print("time x, peak x, saved x: ratio to the first row. est: the analytic estimate "
          "(course_utils.memory_model). saved = activations + autocast weight copies + logits.")
    for notes in sorted(set(n for n in df["notes"] if n)):
        print(f"note: {notes}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        payload = {"command": "course-bench " + " ".join(argv if argv is not None else sys.argv[1:]),
                   "size": size, "hardware": hw.as_dict(),
                   "recommendation": {"precision": rec.precision, "grad_scaler": rec.grad_scaler,
                                      "reason": rec.reason},
                   "rows": _rows_for_json(df)}
        (args.out / "bench.json").write_text(json.dumps(payload, indent=2, default=str))
        from .plots import comparison_chart
        fig = comparison_chart(df, title=f"{hw.name}, size '{size}'")
        fig.savefig(args.out / "bench.png", dpi=120, bbox_inches="tight")
        print(f"wrote {args.out / 'bench.json'} and {args.out / 'bench.png'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
