"""Benchmark results on disk: ``bench.json`` as ``course-bench --out`` writes it, and the runs
committed under ``results/`` (GPU runs, lesson timings) as the lessons read them.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .cli_args import check_out_folder
from .config import SIZE_PROFILES, config_for
from .experiments import plain_label, time_cell
from .i18n import tr
from .measure import MEMORY_FIELDS
from .step_timing import band_verdict, emulated_factor
from .terms import MiB

__all__ = ["RUN_CLASSES", "BenchRun", "committed_runs", "committed_memory_tools", "find_results",
           "bench_rows", "check_out_dir", "write_bench"]

#: The copy of the course this module was imported from (site-packages for a wheel: no results/).
_COURSE_ROOT = Path(__file__).resolve().parents[1]


def find_results(start: str | Path | None = None) -> Path | None:
    """The ``results/`` folder beside the imported `course_utils`, else beside a ``course_utils/``
    folder in ``start`` (default: the working folder) or one of its parents; else None."""
    here = Path.cwd() if start is None else Path(start)
    for folder in (_COURSE_ROOT, here, *here.parents):
        if (folder / "results").is_dir() and (folder / "course_utils").is_dir():
            return folder / "results"
    return None


def _not_bench(path, error: Exception) -> ValueError:
    return ValueError(tr("{path} is not course-bench output ({error!r}).", path=path, error=error))


#: The classes of committed GPU run (``tools/gpu_results.sh``'s modes): a GPU at its own recipe and
#: size profile, and a bigger GPU standing in for a Colab T4 (`course_utils.stand_in`).
RUN_CLASSES = ("native", "t4")


@dataclass(frozen=True)
class BenchRun:
    """One committed ``bench.json``: ``name``, the run's folder; ``mode``, one of `RUN_CLASSES`;
    ``date``, the ``YYYY-MM-DD`` in ``name`` or ""; ``payload``, the parsed file."""

    path: Path
    name: str
    mode: str
    date: str
    payload: dict
    hardware: dict


def _bench_runs(folder, devices) -> list[BenchRun]:
    """The runs under ``folder`` (default `find_results`) on ``devices`` (None: all), in path
    order, in both layouts: ``<run>/bench.json`` (mode ``t4`` for a stand-in, else ``native``)
    and ``<run>/<mode>/course-bench/bench.json`` (``tools/gpu_results.sh``). ValueError, naming
    the file: not JSON, no ``hardware``, or a mode folder not in `RUN_CLASSES`."""
    root = Path(folder) if folder is not None else find_results()
    if root is None or not root.is_dir():
        return []
    runs = []
    for path in sorted({*root.glob("*/bench.json"), *root.glob("*/*/course-bench/bench.json")}):
        try:
            payload = json.loads(path.read_text())
            hw = payload["hardware"]
            kind = str(hw["device"]).split(":")[0]
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise _not_bench(path, e) from e
        new_layout = path.parent.name == "course-bench"
        name = path.parents[2].name if new_layout else path.parent.name
        mode = path.parents[1].name if new_layout else ("t4" if hw.get("stand_in") else "native")
        if mode not in RUN_CLASSES:
            raise ValueError(tr("{path}: the mode folder {mode!r} is not one of {modes} "
                                "(tools/gpu_results.sh's modes).", path=path, mode=mode,
                                modes=", ".join(RUN_CLASSES)))
        date = re.search(r"\d{4}-\d{2}-\d{2}", name)
        if devices is None or kind in devices:
            runs.append(BenchRun(path, name, mode, date.group(0) if date else "", payload, hw))
    return runs


def _ratio_between(row: dict, ref: dict) -> tuple[float | None, str]:
    """``row``'s step time over ``ref``'s (both stored as ratios to the run's first row) and its
    verdict, from the band ``[low_r / high_ref, high_r / low_ref]``."""
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


def _run_table(run: BenchRun) -> pd.DataFrame:
    """One run's rows as lesson 02 shows them (see `committed_runs`)."""
    rows = run.payload["rows"]
    want = (run.payload.get("recommendation") or {}).get("precision")
    ref = next((r for r in rows if r["config"].get("precision") == want
                and r["config"].get("checkpoint") == "none"), rows[0])
    ref_s = ref["measured"].get("step_time_s")
    table = []
    for r in rows:
        ratio, verdict = _ratio_between(r, ref)
        meas = r["measured"]
        if verdict == "emulated":
            ms, cell = None, tr("emulated: about {factor}", factor=emulated_factor(ratio))
        else:  # the reference's median times the row's ratio (docs/method.md#time)
            paired = ref_s is not None and ratio is not None and verdict != "too few rounds"
            own = meas.get("step_time_s")
            ms = ref_s * ratio * 1e3 if paired else (None if own is None else own * 1e3)
            cell = time_cell(ratio, verdict)
        table.append({
            "config": plain_label(r["label"]),
            "step ms": None if ms is None else round(ms, 1),
            f"time vs {ref['label']}": cell,
            "peak MiB": None if meas.get("peak_allocated") is None
            else round(meas["peak_allocated"] / MiB),
            "saved MiB": None if meas.get("saved_total") is None
            else round(meas["saved_total"] / MiB)})
    return pd.DataFrame(table).set_index("config")


def _run_title(run: BenchRun) -> str:
    hw, p = run.hardware, run.payload
    who = hw.get("stand_in") or hw.get("name") or tr("a GPU")
    fields = dict(who=who, size=p.get("size"), torch=hw.get("torch_version", "?"),
                  folder=f"results/{run.name}")
    if run.date:
        return tr("{who}; size '{size}', torch {torch}; run on {date} ({folder}):",
                  date=run.date, **fields)
    return tr("{who}; size '{size}', torch {torch} ({folder}):", **fields)


def committed_runs(folder: str | Path | None = None,
                   devices: tuple[str, ...] | None = ("cuda",),
                   newest: bool = True) -> list[tuple[str, pd.DataFrame]]:
    """The committed `course-bench` runs on ``devices`` as lesson 02 shows them, ``(title,
    table)`` each: the newest (by the date in its folder name) of each of `RUN_CLASSES`, or all
    with ``newest=False``, timed against the recommended precision without checkpointing.
    ValueError: a ``bench.json`` that is not `course-bench` output (the file is named)."""
    runs = _bench_runs(folder, devices)
    if newest:
        latest = {}
        for run in runs:
            if run.mode not in latest or (run.date, run.name) >= (latest[run.mode].date,
                                                                  latest[run.mode].name):
                latest[run.mode] = run
        runs = [latest[m] for m in RUN_CLASSES if m in latest]
    out = []
    for run in runs:
        try:
            out.append((_run_title(run), _run_table(run)))
        except (KeyError, TypeError, IndexError) as e:
            raise _not_bench(run.path, e) from e
    return out


#: The rows of lesson 04's ``cuda-memory-tools`` table `committed_memory_tools` reads, by the
#: start of their label (a transcript cuts long labels short).
_MEMORY_TOOLS_ROWS = {"peak allocated in the step": "peak_allocated",
                      "reserved now": "reserved",
                      "of which split blocks": "split_blocks",
                      "used outside PyTorch's allocator": "outside_allocator"}


def _section(text: str, cell_id: str) -> str:
    """The output of cell ``cell_id`` in a ``tools/bench_lessons.py`` transcript; "" if absent."""
    head = f"--- [{cell_id}]\n"
    if head not in text:
        return ""
    body = text.split(head, 1)[1]
    return body.split("\n--- [", 1)[0]


def _gpu_model(setup: str, run_dir: Path | None = None) -> str | None:
    """The model lesson 04's GPU cell trained, in words, from a transcript's setup section (None
    without a size profile), its dimensions from the same run's ``run_dir/bench.json`` if any."""
    size = re.search(r"size profile '([^']+)'", setup)
    recipe = re.search(r"^recipe\s*:\s*(\S+)", setup, re.MULTILINE)
    if not size or size.group(1) not in SIZE_PROFILES:
        return None
    c = config_for(size.group(1), device="cpu")
    bench = run_dir / "bench.json" if run_dir is not None else None
    if bench is not None and bench.is_file():
        data = json.loads(bench.read_text())
        if data.get("size") == size.group(1) and data.get("rows"):
            k = data["rows"][0]["config"]
            c = c.replace(**{f: k[f] for f in ("n_layers", "d_model", "n_heads", "seq_len",
                                               "batch_size") if f in k})
    fields = dict(size=size.group(1), layers=c.n_layers, d_model=c.d_model,
                  params=c.shape.n_parameters / 1e6, batch=c.batch_size)
    if recipe:
        return tr("the '{size}' model ({layers} layers, d_model {d_model}, {params:,.0f}M "
                  "parameters, micro-batch {batch}, {recipe})", recipe=recipe.group(1), **fields)
    return tr("the '{size}' model ({layers} layers, d_model {d_model}, {params:,.0f}M "
              "parameters, micro-batch {batch})", **fields)


def committed_memory_tools(folder: str | Path | None = None) -> dict | None:
    """``{"run", "device", "torch", "model", "peak_allocated", "reserved", "split_blocks",
    "outside_allocator"}`` (MiB) that lesson 04's ``cuda-memory-tools`` cell measured in the newest
    ``results/lesson-timings-*/transcripts/04_scaling_out.txt``; None where none holds it."""
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
        return {"run": path.parents[1].name,
                "device": device.group(1) if device else tr("a GPU"),
                "torch": torch_v.group(1) if torch_v else None,
                "model": _gpu_model(setup, root / path.parents[1].name.removeprefix(
                    "lesson-timings-")),
                **found}
    return None


def bench_rows(df: pd.DataFrame) -> list[dict]:
    """`course_utils.experiments.compare`'s table as ``bench.json`` rows (JSON-ready: NaN ->
    None)."""
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
    """``folder``, checked before any work (`course_utils.cli_args.check_out_folder`): ValueError,
    saying why, where it cannot receive result files."""
    return check_out_folder(folder)


def write_bench(folder: str | Path, payload: dict, figure=None) -> list[Path]:
    """Write ``bench.json`` (``payload``) and ``bench.png`` (``figure``, if given) into ``folder``
    (made if missing, else ValueError as `check_out_dir`); returns the paths written."""
    out = check_out_dir(folder)
    out.mkdir(exist_ok=True)
    paths = [out / "bench.json"]
    paths[0].write_text(json.dumps(payload, indent=2, default=str))
    if figure is not None:
        paths.append(out / "bench.png")
        figure.savefig(paths[1], dpi=120, bbox_inches="tight")
    return paths
