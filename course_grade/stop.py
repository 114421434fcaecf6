"""Stopping a grading run cleanly on Ctrl-C (SIGINT) or SIGTERM.

The command installs :meth:`Stop.handling_signals`: a signal then records a stop request instead
of killing the grader, and cancels every execution in progress (``-j N`` runs several at once),
which kills their kernels and raises :class:`GradingInterrupted`; :func:`course_grade.grade` adds
the results finished so far. The command writes them (log, CSV, tables) and exits with 128 + the
signal's number.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal


class GradingInterrupted(Exception):
    """Grading was stopped by a signal (``signum``: SIGINT for Ctrl-C, or SIGTERM).

    ``results`` holds the submissions graded before the stop (set by :func:`course_grade.grade`)
    and ``remaining`` the paths not graded.
    """

    def __init__(self, signum: int, results=None, remaining=None):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.results = list(results or [])
        self.remaining = list(remaining or [])


class Stop:
    """A stop request from Ctrl-C (SIGINT) or SIGTERM, shared by the grader and the executor.

    :meth:`handling_signals` installs handlers that record the signal (a second one exits at
    once); :meth:`watching` lets the handler cancel the executions in progress (one per job), so
    that grading stops at once, cleanly, instead of skipping one submission.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._watched: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Task]] = {}

    @property
    def requested(self) -> bool:
        """True once a stop was requested."""
        return self.signum is not None

    def request(self, signum: int = signal.SIGINT) -> None:
        """Ask grading to stop; cancels the execution being watched, if any."""
        if self.signum is not None:  # a second Ctrl-C: the user insists
            raise KeyboardInterrupt
        self.signum = signum
        for loop, task in list(self._watched.values()):
            loop.call_soon_threadsafe(task.cancel)

    @contextlib.contextmanager
    def watching(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task):
        """While inside, a stop request cancels ``task`` (running on ``loop``); several tasks
        may be watched at once."""
        key = id(task)
        self._watched[key] = (loop, task)
        try:
            yield
        finally:
            self._watched.pop(key, None)

    @contextlib.contextmanager
    def handling_signals(self, signums=(signal.SIGINT, signal.SIGTERM)):
        """While inside, ``signums`` request a stop instead of killing the process (main thread
        only; elsewhere this does nothing)."""
        previous = {}
        try:
            for signum in signums:
                previous[signum] = signal.signal(signum, lambda number, frame: self.request(number))
        except ValueError:  # not the main thread
            pass
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
