"""The grading benchmark: grade one class folder with ``-j 1`` and with ``-j N`` and write how
long each took, per exercise and in all, and whether the scores agree (a benchmark, not a test).

    python tools/bench_grading.py --out results/grading-times-<machine>-<date> [--jobs 2]
        [--copies 3] [--sandbox | --no-sandbox]

The class folder holds ``--copies`` copies of each solution and of each released exercise
(3 x (4 + 4) = 24 submissions for the course's four exercises), built in a temporary folder.
Each run is ``course-grade grade FOLDER --json -j J`` in a child process with this process's
environment (``COURSE_SIZE=smoke`` unless set: the size the grader's kernels run at by default),
so the times include everything an instructor waits for. The scores of the two runs must be
identical, submission by submission (exit status 1 otherwise). Writes ``grading-times.json``
and ``grading-times.md`` into ``--out``, with the command, the machine, and the load average
before each run (``os.getloadavg``), so that a figure measured on a busy machine says so.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_name() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_class(folder: Path, copies: int) -> list[str]:
    """Copies of every solution (full marks) and released exercise (0 points) in ``folder``;
    returns the exercise names."""
    names = sorted(p.name for p in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    for copy in range(1, copies + 1):
        for name in names:
            for kind, where in (("solution", ROOT / "solutions"), ("exercise", ROOT / "exercises")):
                target = folder / f"{kind}{copy}" / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(where / name, target)
    return names


def grade(folder: Path, jobs: int, sandbox: list[str]) -> dict:
    """One ``course-grade grade`` run: wall time (s), load before it, and its results."""
    load = os.getloadavg()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.setdefault("COURSE_SIZE", "smoke")
    command = [sys.executable, "-m", "course_grade", "grade", str(folder), "--source",
               str(ROOT / "solutions"), "--json", "-j", str(jobs), *sandbox]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"-j {jobs}: course-grade exited with {done.returncode}:\n{done.stderr}")
    results = json.loads(done.stdout)
    return {"jobs": jobs, "seconds": round(seconds, 1), "load_before": [round(x, 2) for x in load],
            "sandbox": ("bubblewrap sandbox" if done.stderr.startswith("sandbox: bubblewrap")
                        else "unsandboxed"),
            "results": results}


def per_exercise(run: dict, folder: Path) -> dict:
    """Sum and mean of the submissions' own grading times per exercise (s)."""
    out: dict[str, list[float]] = {}
    for r in run["results"]:
        out.setdefault(r["source"] or "?", []).append(r["seconds"])
    return {name: {"submissions": len(times), "sum_s": round(sum(times), 1),
                   "mean_s": round(sum(times) / len(times), 1)} for name, times in sorted(out.items())}


def scores(run: dict, folder: Path) -> dict:
    return {str(Path(r["submission"]).relative_to(folder)): [r["score"], r["max_score"], r["graded"]]
            for r in run["results"]}


def markdown(report: dict) -> str:
    runs = report["runs"]
    lines = [f"# Grading times: {report['submissions']} submissions", "",
             f"Command: `{report['command']}`", "",
             f"Machine: {report['machine']}; {report['cores']} usable cores; "
             f"python {report['python']}; COURSE_SIZE={report['course_size']}; "
             f"OMP_NUM_THREADS={report['omp_num_threads']}; "
             f"{report['sandbox']}", "",
             "| -j | wall time (s) | load average before (1, 5, 15 min) |", "|---|---|---|"]
    lines += [f"| {r['jobs']} | {r['seconds']} | {', '.join(map(str, r['load_before']))} |"
              for r in runs]
    lines += ["", f"Speed-up of -j {runs[-1]['jobs']} over -j 1: "
              f"{runs[0]['seconds'] / runs[-1]['seconds']:.2f}x; identical scores: "
              f"{report['identical_scores']}.", "",
              "Per exercise (each submission's own time, kernel start to last cell; with -j, "
              "submissions overlap):", "",
              "| exercise | submissions | -j 1 mean (s) | " + " | ".join(
                  f"-j {r['jobs']} mean (s)" for r in runs[1:]) + " |",
              "|---|---|---|" + "---|" * (len(runs) - 1)]
    for name, one in report["per_exercise"][0].items():
        others = " | ".join(str(p[name]["mean_s"]) for p in report["per_exercise"][1:])
        lines.append(f"| {name} | {one['submissions']} | {one['mean_s']} | {others} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for grading-times.json/.md")
    parser.add_argument("--jobs", type=int, default=2, help="the parallel run's -j (default 2)")
    parser.add_argument("--copies", type=int, default=3, help="copies of each notebook (3)")
    box = parser.add_mutually_exclusive_group()
    box.add_argument("--sandbox", dest="sandbox", action="store_const", const=["--sandbox"])
    box.add_argument("--no-sandbox", dest="sandbox", action="store_const", const=["--no-sandbox"])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        folder = Path(tmp) / "class"
        build_class(folder, args.copies)
        runs = [grade(folder, jobs, args.sandbox or []) for jobs in (1, args.jobs)]
        same = scores(runs[0], folder) == scores(runs[1], folder)
        report = {
            "command": "python tools/bench_grading.py " + " ".join(argv or sys.argv[1:]),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{cpu_name()} ({platform.platform()})",
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(),
            "python": platform.python_version(),
            "course_size": os.environ.get("COURSE_SIZE", "smoke"),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
            "sandbox": runs[0]["sandbox"],
            "submissions": len(runs[0]["results"]),
            "identical_scores": same,
            "per_exercise": [per_exercise(r, folder) for r in runs],
            "runs": [{k: v for k, v in r.items() if k != "results"} for r in runs],
            "scores": scores(runs[0], folder),
        }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grading-times.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "grading-times.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
