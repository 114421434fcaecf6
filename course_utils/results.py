"""Benchmark results on disk: ``bench.json`` as ``course-bench --out`` writes it, and the runs
committed under ``results/`` (GPU runs, lesson timings) as the lessons read them.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from .cli_args import check_out_folder
from .config import SIZE_PROFILES, config_for
from .experiments import plain_label, time_cell
from .measure import MEMORY_FIELDS
from .step_timing import band_verdict
from .terms import MiB

__all__ = ["committed_results", "committed_runs", "committed_memory_tools", "find_results",
           "bench_rows", "check_out_dir", "write_bench"]

_RESULT_COLUMNS = ["run", "device", "size", "config", "step ms", "time x", "peak MiB", "peak x",
                   "saved MiB"]


#: The copy of the course this module was imported from (a clone, an unpacked zip, a folder;
#: site-packages for a wheel, which has no results/).
_COURSE_ROOT = Path(__file__).resolve().parents[1]


def find_results(start: str | Path | None = None) -> Path | None:
    """The ``results/`` folder committed with the course: the one beside the imported
    `course_utils` (the clone the setup cell fetched into ``/content/<repository>`` on Colab, or
    a checkout), else the first ``results/`` beside a ``course_utils/`` folder in ``start``
    (default: the working folder) or one of its parents. None if there is none (a wheel install
    run outside a copy of the course)."""
    here = Path.cwd() if start is None else Path(start)
    for folder in (_COURSE_ROOT, here, *here.parents):
        if (folder / "results").is_dir() and (folder / "course_utils").is_dir():
            return folder / "results"
    return None


def committed_results(folder: str | Path | None = None,
                      devices: tuple[str, ...] | None = ("cuda",)) -> pd.DataFrame:
    """The runs committed under ``results/*/bench.json`` (``course-bench --out``) on the given
    kinds of device (default: GPUs only; the maintainers' CPU runs sit there too), one row per
    configuration.

    Args:
        folder: the ``results`` folder (default: `find_results`, the one committed with the
            course this module was imported from).
        devices: device kinds to keep (``"cuda"``, ``"cpu"``, ``"mps"``), or None for every run.

    Returns:
        Columns ``run`` (the run's folder name), ``device``, ``size``, ``config``, ``step ms``,
        ``time x``, ``peak MiB``, ``peak x``, ``saved MiB``; empty (same columns) when there is
        no run.

    Raises:
        ValueError: a ``bench.json`` that is not `course-bench` output (the file is named).
    """
    rows = []
    for path, payload, hw in _bench_runs(folder, devices):
        try:
            for r in payload["rows"]:
                meas, ratios = r["measured"], r["ratios"]
                rows.append({
                    "run": path.parent.name, "device": hw.get("name"),
                    "size": payload.get("size"), "config": r["label"],
                    "step ms": None if meas.get("step_time_s") is None
                    else meas["step_time_s"] * 1e3,
                    "time x": ratios.get("time_ratio"),
                    "peak MiB": None if meas.get("peak_allocated") is None
                    else meas["peak_allocated"] / MiB,
                    "peak x": ratios.get("peak_ratio"),
                    "saved MiB": None if meas.get("saved_total") is None
                    else meas["saved_total"] / MiB})
        except (KeyError, TypeError) as e:
            raise ValueError(f"{path} is not course-bench output ({e!r}).") from e
    return pd.DataFrame(rows, columns=_RESULT_COLUMNS)


def _bench_runs(folder, devices):
    """``(path, payload, hardware)`` of each ``*/bench.json`` under ``folder`` (default
    `find_results`) whose device kind is one of ``devices`` (None: every run), in name order.

    Raises:
        ValueError: a file that is not JSON or has no ``hardware`` (the file is named).
    """
    root = Path(folder) if folder is not None else find_results()
    for path in sorted(root.glob("*/bench.json")) if root is not None and root.is_dir() else []:
        try:
            payload = json.loads(path.read_text())
            hw = payload["hardware"]
            kind = str(hw["device"]).split(":")[0]
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path} is not course-bench output ({e!r}).") from e
        if devices is None or kind in devices:
            yield path, payload, hw


def _ratio_between(row: dict, ref: dict) -> tuple[float | None, str]:
    """``row``'s step time over ``ref``'s, both stored as ratios to the run's first row, and its
    verdict: from the two stored noise bands, the quotient lies within ``[low_r / high_ref,
    high_r / low_ref]`` (a band at least as wide as one measured directly); a ratio is called
    faster or slower only when that band, as printed, excludes 1.00."""
    a, b = row["ratios"], ref["ratios"]
    if a.get("time_ratio") is None or not b.get("time_ratio"):
        return None, "not timed"
    ratio = a["time_ratio"] / b["time_ratio"]
    if row is ref:
        return ratio, "reference"
    if row.get("emulated") or ref.get("emulated"):
        return ratio, "emulated"
    parts = (a.get("time_ratio_low"), a.get("time_ratio_high"), b.get("time_ratio_low"),
             b.get("time_ratio_high"))
    if not all(parts):
        return ratio, "too few rounds"
    return ratio, band_verdict(ratio, parts[0] / parts[3], parts[1] / parts[2])


def committed_runs(folder: str | Path | None = None,
                   devices: tuple[str, ...] | None = ("cuda",)) -> list[tuple[str, pd.DataFrame]]:
    """The runs of `committed_results`, one readable table each: ``(title, table)`` with the
    title naming the device, size profile, torch and date (from the run's folder name), and the
    table, indexed by the configuration in words (`course_utils.experiments.plain_label`), giving
    ``step ms``, the time against the run's recommended precision without checkpointing
    (``time vs bf16``: a ratio only outside the noise, `course_utils.experiments.time_cell`),
    ``peak MiB`` and ``saved MiB``.

    Raises:
        ValueError: a ``bench.json`` that is not `course-bench` output (the file is named).
    """
    out = []
    for path, payload, hw in _bench_runs(folder, devices):
        try:
            rows = payload["rows"]
            want = (payload.get("recommendation") or {}).get("precision")
            ref = next((r for r in rows if r["config"].get("precision") == want
                        and r["config"].get("checkpoint") == "none"), rows[0])
            table = []
            for r in rows:
                ratio, verdict = _ratio_between(r, ref)
                meas = r["measured"]
                table.append({
                    "config": plain_label(r["label"]),
                    "step ms": None if meas.get("step_time_s") is None
                    else round(meas["step_time_s"] * 1e3, 1),
                    f"time vs {ref['label']}": time_cell(ratio, verdict),
                    "peak MiB": None if meas.get("peak_allocated") is None
                    else round(meas["peak_allocated"] / MiB),
                    "saved MiB": None if meas.get("saved_total") is None
                    else round(meas["saved_total"] / MiB)})
        except (KeyError, TypeError, IndexError) as e:
            raise ValueError(f"{path} is not course-bench output ({e!r}).") from e
        date = re.search(r"\d{4}-\d{2}-\d{2}$", path.parent.name)
        title = (f"{hw.get('name')}, size '{payload.get('size')}', torch "
                 f"{hw.get('torch_version', '?')}" + (f", {date.group(0)}" if date else "") + ":")
        out.append((title, pd.DataFrame(table).set_index("config")))
    return out


#: The rows of lesson 04's ``cuda-memory-tools`` table that `committed_memory_tools` reads, by
#: the start of their label (pandas cuts long labels short in a transcript).
_MEMORY_TOOLS_ROWS = {"peak allocated in the step": "peak_allocated",
                      "reserved now": "reserved",
                      "of which split blocks": "split_blocks",
                      "used outside PyTorch's allocator": "outside_allocator"}


def _section(text: str, cell_id: str) -> str:
    """The output of cell ``cell_id`` in a lesson transcript (``--- [cell-id]`` headers, as
    ``tools/bench_lessons.py`` writes them); "" if absent."""
    head = f"--- [{cell_id}]\n"
    if head not in text:
        return ""
    body = text.split(head, 1)[1]
    return body.split("\n--- [", 1)[0]


def _gpu_model(setup: str) -> str | None:
    """The model lesson 04's GPU cell trains (``config_for(size)`` in the recipe precision), in
    words, from a transcript's setup section; None where it names no size profile."""
    size = re.search(r"size profile '([^']+)'", setup)
    recipe = re.search(r"^recipe\s*:\s*(\S+)", setup, re.MULTILINE)
    if not size or size.group(1) not in SIZE_PROFILES:
        return None
    c = config_for(size.group(1), device="cpu")
    return (f"the '{size.group(1)}' model ({c.n_layers} layers, d_model {c.d_model}, "
            f"{c.shape.n_parameters / 1e6:,.0f}M parameters, micro-batch {c.batch_size}"
            + (f", {recipe.group(1)}" if recipe else "") + ")")


def committed_memory_tools(folder: str | Path | None = None) -> dict | None:
    """What lesson 04's ``cuda-memory-tools`` cell measured on the newest GPU run committed
    under ``results/lesson-timings-*/transcripts/04_scaling_out.txt``, for a machine without a
    GPU to show in one line.

    Returns:
        ``{"run", "device", "torch", "model", "peak_allocated", "reserved", "split_blocks",
        "outside_allocator"}`` (the four values in MiB; ``model``: the model that cell trained,
        in words, from the transcript's size profile and recipe, as "the 'h100' model (12
        layers, d_model 1536, 342M parameters, micro-batch 16, bf16)", or None where the
        transcript does not say), or None when no committed transcript holds the cell's table.
    """
    root = Path(folder) if folder is not None else find_results()
    paths = sorted(root.glob("lesson-timings-*/transcripts/04_scaling_out.txt")) if root else []
    for path in reversed(paths):
        text = path.read_text(errors="replace")
        found = {}
        for line in _section(text, "cuda-memory-tools").splitlines():
            m = re.match(r"^(.+?)\s{2,}(-?[\d,]*\.?\d+)\s*$", line)
            for start, key in _MEMORY_TOOLS_ROWS.items():
                if m and m.group(1).startswith(start):
                    found[key] = float(m.group(2).replace(",", ""))
        if len(found) < len(_MEMORY_TOOLS_ROWS):
            continue
        setup = _section(text, "setup")
        device = re.search(r"^device\s*:\s*cuda \((.+)\)\s*$", setup, re.MULTILINE)
        torch_v = re.search(r"^torch\s*:\s*(\S+)", setup, re.MULTILINE)
        return {"run": path.parents[1].name, "device": device.group(1) if device else "a GPU",
                "torch": torch_v.group(1) if torch_v else None, "model": _gpu_model(setup),
                **found}
    return None


def bench_rows(df: pd.DataFrame) -> list[dict]:
    """`course_utils.experiments.compare`'s table as ``bench.json`` rows: per configuration its
    ``label``, ``config``, ``measured`` and ``estimated`` bytes and seconds, ``ratios``,
    ``time_verdict``, ``emulated``, ``oom``, ``error``, ``notes`` (JSON-ready: NaN -> None)."""
    rows = []
    for rec in df.to_dict(orient="records"):
        c = {k: (None if isinstance(v, float) and pd.isna(v) else v) for k, v in rec.items()}
        measured = {f: c[f] for f in MEMORY_FIELDS + ("saved_total",)}
        measured.update({k: c[k] for k in ("peak_reserved", "peak_method", "step_time_s",
                                            "step_time_iqr_s", "tokens_per_s", "timing")})
        estimated = {f: c[f"est_{f}"] for f in MEMORY_FIELDS + ("saved_total",)}
        estimated["recompute"] = c["est_recompute"]
        config = {k: c[k] for k in ("precision", "checkpoint", "compile", "batch_size",
                                    "seq_len", "n_layers", "d_model", "n_heads",
                                    "grad_accum_steps", "device")}
        rows.append({"label": c["label"], "config": config, "measured": measured,
                     "estimated": estimated,
                     "ratios": {k: c[k] for k in ("time_ratio", "time_ratio_low",
                                                  "time_ratio_high", "peak_ratio",
                                                  "saved_ratio")},
                     "time_verdict": c["time_verdict"], "emulated": bool(c["emulated"]),
                     "oom": bool(c["oom"]), "error": c["error"], "notes": c["notes"]})
    return rows


def check_out_dir(folder: str | Path) -> Path:
    """Check, before any work, that ``folder`` can receive result files
    (`course_utils.cli_args.check_out_folder`, for ``--out``).

    Raises:
        ValueError: ``folder`` is an existing file, its parent is missing or not a folder, or
            it is not writable (the message says which).
    """
    return check_out_folder(folder)


def write_bench(folder: str | Path, payload: dict, figure=None) -> list[Path]:
    """Write ``bench.json`` (``payload``) and, if given, ``bench.png`` (``figure``) into
    ``folder`` (made if missing); returns the paths written.

    Raises:
        ValueError: as `check_out_dir`.
    """
    out = check_out_dir(folder)
    out.mkdir(exist_ok=True)
    paths = [out / "bench.json"]
    paths[0].write_text(json.dumps(payload, indent=2, default=str))
    if figure is not None:
        paths.append(out / "bench.png")
        figure.savefig(paths[1], dpi=120, bbox_inches="tight")
    return paths
