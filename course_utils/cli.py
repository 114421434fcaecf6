"""``course-bench``: the course's comparison, headless, planned for this machine: the table of
`course_utils.experiments.compare` over `ladder` (or a grid of precisions x checkpoint policies),
each measurement next to its estimate. ``--out DIR`` writes ``bench.json`` and ``bench.png``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from .cli_args import add_precisions_and_policies, positive_int, positive_seconds
from .config import SIZE_PROFILES, config_for, size_profile
from .experiments import compare, ladder, summary
from .hardware import detect, recommend_precision, report, use_threads
from .i18n import tr
from .measure import accept
from .results import bench_rows, check_out_dir, write_bench

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="course-bench",
        description=tr("Train the course's byte-level transformer on real text in the "
                       "configurations this machine should compare (fp32, the recommended "
                       "precision, activation checkpointing full and selective); print measured "
                       "step time, peak memory and saved-activation bytes next to the analytic "
                       "estimate."))
    p.add_argument("--size", choices=list(SIZE_PROFILES), default=None,
                   help=tr("size profile (default: $COURSE_SIZE, else chosen from the hardware)"))
    p.add_argument("--device", default=None, help=tr("cpu, cuda, cuda:N or mps (default: best)"))
    add_precisions_and_policies(
        p, precisions_help=tr("comma-separated, e.g. fp32,bf16 (with --policies: a grid)"),
        policies_help=tr("comma-separated checkpoint policies: none, full, every-K, segments:N, "
                         "selective, memory-budget:B"))
    for flag, kind, what in (
            ("--steps", positive_int, tr("timed rounds (default: as many as fit in the size's "
                                         "time budget)")),
            ("--budget", positive_seconds, tr("seconds of timed steps (default: per size "
                                              "profile)")),
            ("--batch-size", positive_int, tr("sequences per micro-batch (default: the size's)")),
            ("--seq-len", positive_int, tr("tokens per sequence (default: the size's)"))):
        p.add_argument(flag, type=kind, default=None, help=what)
    p.add_argument("--out", type=Path, default=None,
                   help=tr("folder for bench.json and bench.png"))
    p.add_argument("--force", action="store_true",
                   help=tr("run configurations that would be refused (fp16 on a CPU, emulated "
                           "bf16 on a GPU, an estimated peak above the free memory)"))
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``course-bench``: exit status 0, or 2 on bad arguments or a refused configuration."""
    args = _parser().parse_args(argv)
    try:
        if args.out is not None:
            check_out_dir(args.out)
        size = args.size or size_profile()
        overrides = {k: v for k, v in (("device", args.device), ("batch_size", args.batch_size),
                                       ("seq_len", args.seq_len)) if v is not None}
        base = config_for(size, **overrides)
        hw = detect(base.device)
        if args.precisions or args.policies:
            precs = args.precisions or ["fp32", recommend_precision(hw).low]
            pols = args.policies or ["none"]
            configs = [base.replace(precision="fp32", checkpoint="none")]
            configs += [base.replace(precision=pr, checkpoint=po) for pr in precs for po in pols
                        if not (pr == "fp32" and po == "none")]
        else:
            configs = ladder(base, hw)
        configs = [accept(cfg, hw, force=args.force) for cfg in configs]
    except ValueError as e:
        print(f"course-bench: {e}", file=sys.stderr)
        return 2

    threads = use_threads()
    print("course-bench: " + tr("size '{size}': {n_layers} layers, d_model {d_model}, {n_heads} "
                                "heads, seq {seq_len}, batch {batch}; threads: {threads} "
                                "({reason})", size=size, n_layers=base.n_layers,
                                d_model=base.d_model, n_heads=base.n_heads, seq_len=base.seq_len,
                                batch=base.batch_size, threads=threads.threads,
                                reason=tr(threads.reason)))
    print(report(hw))
    df = compare(configs, budget_s=args.budget, steps=args.steps, force=args.force, hw=hw)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summary(df).to_string())
    print(tr("time vs first: the median of per-round step-time ratios to the first row, shown only "
             "outside the noise (its noise band, as printed, excludes 1.00). est: the analytic "
             "estimate (course_utils.memory_model). saved: saved tensors = activations + autocast "
             "weight copies + logits. MiB = 2^20 bytes."))
    for note in sorted(set(n for n in df["notes"] if n)):
        print(tr("note: {note}", note=note))
    if args.out:
        from .plots import comparison_chart  # lazy: matplotlib loads only when a chart is written
        rec = recommend_precision(hw)
        payload = {"command": "course-bench " + " ".join(sys.argv[1:] if argv is None else argv),
                   "size": size, "hardware": hw.as_dict(), "threads": threads.threads,
                   "recommendation": {"precision": rec.precision, "grad_scaler": rec.grad_scaler,
                                      "reason": rec.reason},
                   "rows": bench_rows(df)}
        fig = comparison_chart(df, title=hw.name, size=size)
        paths = write_bench(args.out, payload, fig)
        print(tr("wrote {paths}", paths=tr(" and ").join(str(p) for p in paths)))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
