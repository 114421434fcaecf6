"""The grader's files: the unit of its size limits (`MiB`), and output written atomically, so
that a reader never sees half a file.

The text goes to a temporary file in the target's folder, flushed to disk, then is renamed over
the target (``os.replace``, atomic on POSIX and Windows): a failure leaves any previous file
intact and no temporary file behind.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, TextIO

__all__ = ["MiB", "write_atomically"]

#: Bytes in a mebibyte (2^20): the unit of --memory, --max-size and their messages. (The grader
#: imports no torch, so it keeps this one constant rather than import course_utils.terms.)
MiB = 2**20


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
