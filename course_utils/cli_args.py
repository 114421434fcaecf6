"""The argument types of the course's commands (``course-bench``, ``course-profile``): each
parses one command-line string and raises ``argparse.ArgumentTypeError`` with what was expected,
so that every argument is checked before anything is measured.
"""
from __future__ import annotations

import argparse
import re
from typing import Callable, Sequence

from .terms import PRECISIONS, GiB, MiB, check_positive_int

__all__ = ["comma_list", "positive_int", "parse_bytes", "add_precisions_and_policies"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": MiB,
          "gib": GiB}


def comma_list(valid: Sequence[str] | None = None, what: str = "value") -> Callable[[str], list]:
    """An argument type for ``"fp32,bf16"``: the comma-separated items, each one of ``valid``
    (any, if None); ``what`` names them in the error (``"precision"``).

    The type raises ``argparse.ArgumentTypeError`` for an empty list or an unknown item (the
    message lists the valid ones).
    """
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"no {what} given")
        bad = [t for t in items if valid is not None and t not in valid]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad}: expected {', '.join(valid)}")
        return items
    return parse


def add_precisions_and_policies(parser, *, precisions_help: str, policies_help: str,
                                policies_default: list | None = None) -> None:
    """The two options both commands take: ``--precisions`` (comma-separated `PRECISIONS`) and
    ``--policies`` (comma-separated checkpoint policies, checked later against the model), with
    each command's help and default."""
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
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    return value


def parse_bytes(text: str) -> int:
    """``"14GiB"`` -> 15032385536; units B, KB, MB, GB (powers of 10), KiB, MiB, GiB (of 2).

    Raises:
        argparse.ArgumentTypeError: not a positive size with a known unit.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"expected a size such as 14GiB, 512MiB or 2e9 bytes, got "
                                         f"{text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
