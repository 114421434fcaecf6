"""The grader's files: the unit of its size limits (`MiB`), output checked before any work
(`check_output`, `check_input`), and output written atomically, so that a reader never sees half
a file.

The text goes to a temporary file in the target's folder, flushed to disk, then is renamed over
the target (``os.replace``, atomic on POSIX and Windows): a failure leaves any previous file
intact and no temporary file behind.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, TextIO

__all__ = ["MiB", "write_atomically", "check_output", "check_input", "cannot_write"]

#: Bytes in a mebibyte (2^20): the unit of --memory, --max-size and their messages. (The grader
#: imports no torch, so it keeps this one constant rather than import course_utils.terms.)
MiB = 2**20


def cannot_write(path: str | os.PathLike) -> str | None:
    """Why nothing can be written into the folder ``path`` (or an existing file ``path`` be
    rewritten), or None: found by doing it (an empty file made and removed, the file opened for
    appending), since permission bits do not bind root and ``/proc`` refuses what they allow.
    (course_utils.cli_args has the same check; the grader imports no torch.)"""
    path = Path(path)
    try:
        if path.is_dir():
            probe = path / f".course-grade-probe-{os.getpid()}"
            with open(probe, "x"):
                pass
            probe.unlink()
        else:
            with open(path, "ab"):
                pass
    except OSError as error:
        return error.strerror or type(error).__name__
    return None


def check_output(path: str | os.PathLike, flag: str, *, folder: bool = False) -> Path:
    """Check, before any work, that ``path`` can be written: a file (``folder`` False) or a
    folder of files (True). Missing folders on the way are fine (they are made when written);
    the nearest existing one must be a folder where something can be written.

    Raises:
        ValueError: a folder given as a file or a file as a folder, a file on the way where a
            folder is needed, or a place that cannot be written (the message names ``flag``).
    """
    path = Path(path)
    said = f"{flag} {str(path)!r}"
    if path.exists():
        if folder and not path.is_dir():
            raise ValueError(f"{said} is a file, not a folder")
        if not folder and path.is_dir():
            raise ValueError(f"{said} is a folder: give a file name")
    nearest = path if folder and path.is_dir() else path.parent
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if not nearest.is_dir():
        raise ValueError(f"{said}: {str(nearest)!r} is a file, not a folder")
    why = cannot_write(nearest) or (cannot_write(path) if path.is_file() else None)
    if why:
        raise ValueError(f"{said}: cannot write into {str(nearest)!r} ({why})")
    return path


def check_input(path: str | os.PathLike, what: str) -> Path:
    """Check, before any work, that ``path`` is a file that can be read.

    Raises:
        ValueError: it does not exist, is a folder, or cannot be opened (naming ``what``).
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{what} {str(path)!r}: no such file")
    if path.is_dir():
        raise ValueError(f"{what} {str(path)!r} is a folder, not a file")
    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        raise ValueError(f"{what} {str(path)!r}: cannot read it ({error.strerror})") from None
    return path


def write_atomically(path: str | os.PathLike, write: Callable[[TextIO], object]) -> Path:
    """Call ``write(handle)`` on a UTF-8 text file (``newline=""``, as the csv module wants) that
    becomes ``path`` once written; the parent folder is created if needed.

    Returns:
        ``path`` as a Path.

    Raises:
        OSError: the file cannot be written (``IsADirectoryError`` where ``path`` is a folder);
            whatever ``write`` raises (the previous file, if any, is kept).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a file")
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile("w", encoding="utf-8", newline="", dir=path.parent,
                                         prefix=f".{path.name}.", suffix=".tmp", delete=False)
    try:
        with handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    return path
