"""The argument types of the course's commands (``course-bench``, ``course-profile``): each parses
one command-line string and raises ``argparse.ArgumentTypeError`` with what was expected; with
`check_out_file` and `check_out_folder`, every argument is checked before anything is measured.
"""
from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path
from typing import Callable, Sequence

from .i18n import tr
from .terms import PRECISIONS, GiB, MiB, check_positive_int

__all__ = ["comma_list", "positive_int", "positive_seconds", "parse_bytes",
           "add_precisions_and_policies", "check_out_folder", "check_out_file", "cannot_write"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": MiB,
          "gib": GiB}


def comma_list(valid: Sequence[str] | None = None, what: str = "value") -> Callable[[str], list]:
    """An argument type for ``"fp32,bf16"``: the comma-separated items, each one of ``valid``
    (any, if None); it raises ``argparse.ArgumentTypeError`` for an empty list or an unknown item,
    naming them ``what`` (``"precision"``) and listing the valid ones.
    """
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(tr("no {what} given", what=tr(what)))
        bad = [t for t in items if valid is not None and t not in valid]
        if bad:
            raise argparse.ArgumentTypeError(tr("unknown {what} {bad}: expected {valid}",
                                                what=tr(what), bad=bad, valid=", ".join(valid)))
        return items
    return parse


def add_precisions_and_policies(parser, *, precisions_help: str, policies_help: str,
                                policies_default: list | None = None) -> None:
    """The options both commands take: ``--precisions`` (comma-separated `PRECISIONS`) and
    ``--policies`` (checkpoint policies, checked later against the model)."""
    parser.add_argument("--precisions", type=comma_list(PRECISIONS, "precision"), default=None,
                        help=precisions_help)
    parser.add_argument("--policies", type=comma_list(None, "policy"), default=policies_default,
                        help=policies_help)


def positive_int(text: str) -> int:
    """``"8"`` -> 8.

    Raises:
        argparse.ArgumentTypeError: not an integer >= 1 (`course_utils.terms.check_positive_int`).
    """
    try:
        value = int(text)
        check_positive_int("value", value)
    except ValueError:
        raise argparse.ArgumentTypeError(tr("expected a positive integer, got {text!r}",
                                            text=text)) from None
    return value


def positive_seconds(text: str) -> float:
    """``"0.5"`` -> 0.5 (seconds).

    Raises:
        argparse.ArgumentTypeError: not a finite number > 0.
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(tr("expected a positive number of seconds, got {text!r}",
                                            text=text))
    return value


def cannot_write(path: str | os.PathLike) -> str | None:
    """Why a file cannot be written into the folder ``path`` (or an existing file rewritten), or
    None: found by doing it, since permission bits do not bind root and a read-only or virtual
    file system (``/proc``) refuses what they allow."""
    path = Path(path)
    try:
        if path.is_dir():
            probe = path / f".course-write-probe-{os.getpid()}"
            with open(probe, "x"):
                pass
            probe.unlink()
        else:
            with open(path, "ab"):
                pass
    except OSError as error:
        return error.strerror or type(error).__name__
    return None


def check_out_folder(folder: str | os.PathLike, flag: str = "--out") -> Path:
    """Check that ``folder`` is a folder, or can be made as one, where a file can be written.

    Raises:
        ValueError: naming ``flag`` and what is wrong.
    """
    out = Path(folder)
    if out.exists() and not out.is_dir():
        raise ValueError(tr("{flag} {path!r} is an existing file, not a folder.", flag=flag,
                            path=str(out)))
    parent = out if out.exists() else out.parent
    if not parent.exists():
        raise ValueError(tr("{flag} {path!r}: its parent folder {parent!r} does not exist.",
                            flag=flag, path=str(out), parent=str(parent)))
    if not parent.is_dir():
        raise ValueError(tr("{flag} {path!r}: {parent!r} is not a folder.", flag=flag,
                            path=str(out), parent=str(parent)))
    if why := cannot_write(parent):
        raise ValueError(tr("{flag} {path!r}: {parent!r} is not writable ({why}).", flag=flag,
                            path=str(out), parent=str(parent), why=why))
    return out


def check_out_file(out: str | os.PathLike, default_name: str, flag: str = "--out") -> Path:
    """The path of a command's result file, checked before anything runs: ``out/default_name``
    where ``out`` is a folder (or a new one, named with a trailing ``/``), else ``out`` itself.

    Raises:
        ValueError: naming ``flag`` and what is wrong (a missing or non-folder parent, a folder
            where the file would go, a place that is not writable).
    """
    text = os.fspath(out)
    path = Path(text)
    if path.is_dir() or text.endswith(("/", os.sep)):
        path = check_out_folder(path, flag) / default_name
        if path.is_dir():
            raise ValueError(tr("{flag} {path!r}: {file!r} is a folder: give a file name.",
                                flag=flag, path=text, file=str(path)))
    folder = path.parent
    for parent in (folder, *folder.parents):  # the nearest that exists
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(tr("{flag} {path!r}: {parent!r} is a file, not a folder.",
                                    flag=flag, path=text, parent=str(parent)))
            break
    if not folder.exists() and not text.endswith(("/", os.sep)):
        raise ValueError(tr("{flag} {path!r}: the folder {folder!r} does not exist.", flag=flag,
                            path=text, folder=str(folder)))
    if folder.exists() and (why := cannot_write(folder)):
        raise ValueError(tr("{flag} {path!r}: cannot write into the folder {folder!r} ({why}).",
                            flag=flag, path=text, folder=str(folder), why=why))
    if path.exists() and (why := cannot_write(path)):
        raise ValueError(tr("{flag} {path!r}: cannot rewrite {file!r} ({why}).", flag=flag,
                            path=text, file=str(path), why=why))
    return path


def parse_bytes(text: str) -> int:
    """``"14GiB"`` -> 15032385536; units B, KB, MB, GB (powers of 10), KiB, MiB, GiB (of 2).

    Raises:
        argparse.ArgumentTypeError: not a positive size with a known unit.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(tr("expected a size such as 14GiB, 512MiB or 2e9 bytes, "
                                            "got {text!r}", text=text))
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
