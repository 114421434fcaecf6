"""Grading several submissions at once (``course-grade grade -j N``).

Each job grades one submission at a time, in its own kernel, sandbox and throwaway folder (see
:func:`course_grade.sandbox.make_workdir`: its own ``HOME`` and ``TMPDIR``); kernels talk to the
grader over unix sockets in that folder, and a sandboxed kernel has a network namespace of its
own, so two jobs share no port, no file and no temporary folder. The CPU is shared out:
each kernel's ``OMP_NUM_THREADS`` is the grader's thread budget divided by the number of jobs.

All jobs run on one asyncio event loop in the grader's process (the kernels are other
processes; the grader itself only waits for their replies), so results are handed over one at
a time, as each finishes, and a stop request (Ctrl-C, SIGTERM) cancels every job at once.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Awaitable, Callable, Sequence

from .results import SubmissionResult
from .stop import GradingInterrupted, Stop

#: Memory one job may need at its peak, for the default number of jobs: exercise 04's kernel,
#: torchrun's agent and two ranks each importing torch (~0.4 GiB resident apiece, measured
#: with ``VmHWM`` at the smoke size) plus headroom.
MEMORY_PER_JOB = 2 * 2**30  # bytes


def usable_cores() -> int:
    """CPU cores this process may run on (``os.sched_getaffinity`` where it exists)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def physical_memory() -> int | None:
    """Bytes of physical memory (``sysconf``), or None where it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def default_jobs(submissions: int | None = None) -> int:
    """The default of ``-j``: one job per usable core, at most one per
    :data:`MEMORY_PER_JOB` of physical memory, at most one per submission, at least 1."""
    jobs = usable_cores()
    memory = physical_memory()
    if memory:
        jobs = min(jobs, max(1, memory // MEMORY_PER_JOB))
    if submissions is not None:
        jobs = min(jobs, max(1, submissions))
    return max(1, jobs)


def check_jobs(jobs) -> int:
    """``jobs`` as a positive int; raises ValueError otherwise."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, not {jobs!r}")
    return jobs


def thread_budget() -> int:
    """OpenMP threads the grader may use in all: its own ``OMP_NUM_THREADS`` if set to a
    positive integer, else the usable cores."""
    try:
        value = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        value = 0
    return value if value > 0 else usable_cores()


def threads_per_job(jobs: int) -> int:
    """``OMP_NUM_THREADS`` of each kernel when ``jobs`` run at once: the thread budget
    (:func:`thread_budget`) divided among them, at least 1."""
    return max(1, thread_budget() // max(1, jobs))


async def run_jobs(
    files: Sequence[Path],
    grade_one: Callable[[Path], Awaitable[SubmissionResult]],
    jobs: int,
    progress: Callable[[int, SubmissionResult], None] | None = None,
    stop: Stop | None = None,
) -> list[SubmissionResult]:
    """Grade ``files`` with ``grade_one``, ``jobs`` at a time; return the results in the order
    of ``files`` (a stable order, whatever order they finished in).

    ``progress(index, result)`` is called as each one finishes (``index`` into ``files``).
    Raises GradingInterrupted, with the results finished so far (in the order of ``files``)
    and the files not graded, when ``stop`` is requested; any other exception of a job is
    raised once every job has ended.
    """
    results: dict[int, SubmissionResult] = {}
    queue = iter(enumerate(files))

    async def worker() -> None:
        for index, path in queue:  # one iterator: each job takes the next file
            if stop is not None and stop.requested:
                raise GradingInterrupted(stop.signum)
            result = await grade_one(path)
            results[index] = result
            if progress is not None:
                progress(index, result)

    workers = [asyncio.ensure_future(worker()) for _ in range(max(1, min(jobs, len(files))))]
    outcomes = await asyncio.gather(*workers, return_exceptions=True)
    ordered = [results[index] for index in sorted(results)]
    requested = stop is not None and stop.requested
    stopped = [o for o in outcomes if isinstance(o, GradingInterrupted)
               or (requested and isinstance(o, asyncio.CancelledError))]
    failed = [o for o in outcomes if isinstance(o, BaseException) and o not in stopped]
    if failed:
        raise failed[0]
    if stopped or (requested and len(results) < len(files)):
        signum = stop.signum if requested else stopped[0].signum
        remaining = [path for index, path in enumerate(files) if index not in results]
        raise GradingInterrupted(signum, ordered, remaining)
    return ordered
