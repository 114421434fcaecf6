"""The lesson benchmark: run every lesson and exercise solution top to bottom in a fresh kernel
and write how long each took, with its slowest cells (a benchmark, not a test).

    python tools/bench_lessons.py --out results/lesson-timings-<machine>-<date>
    python tools/bench_lessons.py --emulate-avx2 ...   # on a CPU with bf16 instructions: plan
                                                        # and run as on an AVX2-only CPU

Each notebook runs with nbclient in a new kernel of this Python, in its own folder, with the
environment of this process (so ``COURSE_SIZE`` unset means the default size profile);
``--emulate-avx2`` sets ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` for the kernels
(torch reads them at import). Per-cell times come from the kernel's execution timestamps
(``record_timing``). Writes ``lesson-timings.json`` and ``lesson-timings.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
import time
from html import unescape
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def default_notebooks() -> list[Path]:
    """The lessons (``notebooks/NN_*.ipynb``) and the exercise solutions
    (``solutions/NN_*.ipynb``), in order."""
    return (sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
            + sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")))


def _seconds(cell) -> float | None:
    t = cell.get("metadata", {}).get("execution", {})
    start, end = t.get("iopub.execute_input"), t.get("shell.execute_reply")
    if not (start and end):
        return None
    parse = dt.datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def _name(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def _html_table_text(html: str) -> str:
    """An HTML table's rows as text, cells joined by `` | `` (tags and the Styler's CSS dropped)."""
    rows = []
    for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", html, flags=re.S):
        cells = re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", tr, flags=re.S)
        rows.append(" | ".join(unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in cells))
    return "\n".join(rows)


def transcript(nb) -> str:
    """An executed notebook's text outputs, cell by cell (``--- [cell id]`` headings; a chart is
    ``<chart>``, colour codes removed): what a learner read, in a file that diffs and reads
    anywhere."""
    out = []
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        parts = []
        for o in c.get("outputs", []):
            if o.get("output_type") == "stream":
                parts.append(o["text"])
            elif o.get("output_type") == "error":
                parts.append(f"{o['ename']}: {o['evalue']}\n")
            elif "image/png" in o.get("data", {}):
                parts.append("<chart>\n")
            elif "text/plain" in o.get("data", {}):
                plain = o["data"]["text/plain"]
                if plain.startswith("<pandas.io.formats.style.Styler") and "text/html" in o["data"]:
                    plain = _html_table_text(o["data"]["text/html"])  # a Styler has no text form
                parts.append(plain + "\n")
        out.append(f"--- [{c.get('id')}]\n" + re.sub(r"\x1b\[[0-9;]*m", "", "".join(parts)))
    return "\n".join(out)


def run_notebook(path: Path, timeout: float, env: dict, save_to: Path | None = None,
                 limit: float | None = None) -> dict:
    """Execute ``path`` in a fresh kernel; return its wall time (s), per-cell times and status.

    Errors in a cell stop the notebook (as "Restart and Run All" would) and are reported, not
    raised. ``timeout``: seconds per cell. ``limit``: seconds for the whole notebook, after which
    the kernel is interrupted (SIGINT, as the Stop button does) and the status says so.
    ``save_to``: a file that receives the executed notebook, outputs kept, rewritten after
    every cell (so a run cut off from outside keeps the cells that ran), and beside it its
    `transcript` (``.txt``).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = nbformat.read(path, as_version=4)
    hook = None
    if save_to is not None:
        save_to.parent.mkdir(parents=True, exist_ok=True)

        def hook(**_):
            nbformat.write(nb, save_to)
            save_to.with_suffix(".txt").write_text(transcript(nb))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=True,
                            resources={"metadata": {"path": str(path.parent)}},
                            on_cell_executed=hook)
    status, t0, stopped = "ok", time.perf_counter(), threading.Event()

    def interrupt():
        pid = getattr(getattr(client.km, "provisioner", None), "pid", None)
        if pid:
            stopped.set()
            os.kill(pid, signal.SIGINT)
    timer = threading.Timer(limit, interrupt) if limit else None
    try:
        with mock.patch.dict(os.environ, env):  # the kernel inherits this process's environment
            if timer:
                timer.start()
            client.execute()
    except (CellExecutionError, CellTimeoutError) as e:
        status = "error: " + re.sub(r"\x1b\[[0-9;]*m", "", str(e).strip().splitlines()[-1])[:200]
    finally:
        if timer:
            timer.cancel()
    if stopped.is_set():
        status = f"stopped at the {limit:.0f} s limit (--limit)"
    wall = time.perf_counter() - t0
    cells = [{"id": c.get("id"), "seconds": _seconds(c)} for c in nb.cells
             if c.cell_type == "code"]
    timed = sorted((c for c in cells if c["seconds"] is not None), key=lambda c: -c["seconds"])
    return {"notebook": _name(path), "seconds": round(wall, 1),
            "status": status, "cells": cells,
            "slowest": [{"id": c["id"], "seconds": round(c["seconds"], 1)} for c in timed[:3]]}


def machine() -> dict:
    """What the numbers were measured on: CPU, ISA flags torch sees, threads, load."""
    code = ("import json, torch; from course_utils import hardware as h; "
            "hw = h.detect('cpu'); gpu = h.detect() if torch.cuda.is_available() else None; "
            "print(json.dumps({'name': hw.name, 'native_bf16': "
            "hw.native_bf16, 'flags': [k for k, v in hw.cpu_features.items() if v], "
            "'isa_cap': hw.isa_cap, 'torch': torch.__version__, 'threads': "
            "torch.get_num_threads(), 'gpu': gpu and gpu.name, "
            "'gpu_memory_gib': gpu and round(gpu.total_memory_bytes / 2**30, 1)}))")
    info = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                     text=True, check=True).stdout)
    info["cpus"] = os.cpu_count()
    info["platform"] = platform.platform()
    return info


def markdown(report: dict) -> str:
    """The timing table as Markdown."""
    m = report["machine"]
    where = f"{m['gpu']} ({m['gpu_memory_gib']} GiB), " if m.get("gpu") else ""
    lines = [f"# Lesson timings: {where}{m['name']} ({m['cpus']} CPUs), {report['date']}", "",
             f"- command: `{report['command']}` at commit `{report['commit']}`",
             f"- CPU flags torch uses: {', '.join(m['flags']) or 'none'}"
             + (f" (capped: {m['isa_cap']})" if m["isa_cap"] else "")
             + f"; native bf16: {m['native_bf16']}; torch {m['torch']}",
             f"- size profile: {report['size']}; load average before/after: "
             f"{report['load_before']} / {report['load_after']}", "",
             "| notebook | seconds | status | slowest cells (s) |", "|---|---:|---|---|"]
    for r in report["notebooks"]:
        slow = ", ".join(f"`{c['id']}` {c['seconds']}" for c in r["slowest"])
        lines.append(f"| {r['notebook']} | {r['seconds']} | {r['status']} | {slow} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark. Exit status 0 when every notebook ran, 1 when one failed, 2 on bad
    arguments."""
    p = argparse.ArgumentParser(prog="bench_lessons", description=__doc__.splitlines()[0])
    p.add_argument("notebooks", nargs="*", type=Path, help="default: every lesson and solution")
    p.add_argument("--out", type=Path, required=True, help="folder for the JSON and Markdown")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per cell")
    p.add_argument("--limit", type=float, default=None,
                   help="seconds per notebook, after which its kernel is interrupted")
    p.add_argument("--save-executed", type=Path, default=None, metavar="DIR",
                   help="also write each executed notebook, outputs kept, into DIR (after "
                        "every cell)")
    p.add_argument("--emulate-avx2", action="store_true",
                   help="set ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 for the kernels")
    args = p.parse_args(argv)
    paths = [n.resolve() for n in args.notebooks] or default_notebooks()
    missing = [str(n) for n in paths if not n.is_file()]
    if missing:
        print(f"bench_lessons: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.out.exists() and not args.out.is_dir():
        print(f"bench_lessons: --out {args.out} is a file", file=sys.stderr)
        return 2
    env = dict(AVX2) if args.emulate_avx2 else {}
    with mock.patch.dict(os.environ, env):
        info = machine()
    report = {"command": "python tools/bench_lessons.py " + " ".join(sys.argv[1:] if argv is None
                                                                     else argv),
              # $COURSE_COMMIT first: a copy of the tree (a GPU machine's) may have its own .git
              "commit": os.environ.get("COURSE_COMMIT") or subprocess.run(
                  ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                  text=True).stdout.strip() or "unknown",
              "date": dt.date.today().isoformat(), "machine": info,
              "size": os.environ.get("COURSE_SIZE") or "default (size_profile())",
              "load_before": [round(x, 2) for x in os.getloadavg()], "notebooks": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        print(f"running {_name(path)} ...", flush=True)
        r = run_notebook(path, args.timeout, env,
                         # notebooks/03_x, solutions/03_x and ko/notebooks/03_x share a name:
                         # keep their folders
                         args.save_executed / (_name(path) if not Path(_name(path)).is_absolute()
                                               else Path(path.parent.name, path.name))
                         if args.save_executed else None,
                         args.limit)
        report["notebooks"].append(r)
        print(f"  {r['seconds']} s, {r['status']}", flush=True)
        report["load_after"] = [round(x, 2) for x in os.getloadavg()]
        # written after every notebook: a run cut off from outside keeps the ones that finished
        (args.out / "lesson-timings.json").write_text(json.dumps(report, indent=2))
        (args.out / "lesson-timings.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if all(r["status"] == "ok" for r in report["notebooks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
