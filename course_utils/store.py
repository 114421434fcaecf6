"""This machine's results store: what each lesson measured here, kept between kernels.

A kernel shares no variables with the other lessons, so without a store lesson 03's claims
ledger would have to measure lessons 01-02's claims again, on another model, and print other
numbers than those lessons did. Instead every lesson's verdict (`course_utils.claims.verdict`,
run in a notebook kernel) is written here with its evidence, and lesson 03 shows it as the
lesson printed it. The thread count the first lesson chose (`course_utils.hardware.use_threads`)
is kept too, so that every lesson on this machine times with the same threads.

The store is one JSON file, ``results.json``, in the learner's cache folder:
``$COURSE_RESULTS_DIR`` if set (tests point it at a temporary folder), else
``$XDG_CACHE_HOME/amp-course``, else ``~/.cache/amp-course`` (the XDG base-directory
convention that ``platformdirs.user_cache_dir`` follows on Linux). Its records are keyed by
`context_key`: the machine (device name and any ISA cap), the torch version and the size
profile, so a result measured on another machine, torch or size is never shown as this one's.
Deleting the file forgets everything; nothing else depends on it.

The store knows files and keys, nothing of the hardware: a caller builds the key from what it
detected (`context_key`; `course_utils.claims.this_context` for a lesson's verdicts), so this
module sits below `course_utils.hardware` and `course_utils.config`, which use it.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

__all__ = ["store_dir", "store_path", "context_key", "load", "record", "lookup",
           "in_notebook"]

_FILE = "results.json"


def store_dir() -> Path:
    """The folder of the store (see the module docstring); not created here."""
    env = os.environ.get("COURSE_RESULTS_DIR", "").strip()
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join("~", ".cache")
    return Path(cache).expanduser() / "amp-course"


def store_path() -> Path:
    """``store_dir() / "results.json"``."""
    return store_dir() / _FILE


def context_key(size: str, hw) -> str:
    """``"<device> <name>[ <ISA cap>] | torch <version> | size <profile>"``: what a stored result
    must match to be shown as this run's.

    Args:
        size: the size profile (``"any"`` for a record that holds at every size).
        hw: a `course_utils.hardware.HardwareInfo` (its ``device``, ``name`` and ``isa_cap``).
    """
    cap = f" {hw.isa_cap}" if hw.isa_cap else ""
    return f"{hw.device} {hw.name}{cap} | torch {torch.__version__} | size {size}"


def load() -> dict:
    """The whole store ``{context_key: {section: {name: record}}}`` (empty when there is no
    file, or it cannot be read: a damaged store is ignored, never an error in a lesson)."""
    try:
        data = json.loads(store_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record(section: str, name: str, value: dict, key: str) -> bool:
    """Write ``value`` (JSON-serialisable) as ``store[key][section][name]``, with the time it
    was recorded (``recorded_at``, seconds since the epoch). Atomic (a temporary file renamed).

    Returns:
        True if written; False where the folder cannot be written (a read-only home, a
        sandbox): the lesson goes on, and the next lesson simply finds nothing.
    """
    data = load()
    data.setdefault(key, {}).setdefault(section, {})[name] = {**value,
                                                              "recorded_at": time.time()}
    folder = store_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(f.name, store_path())
    except OSError:
        return False
    return True


def lookup(section: str, name: str, key: str) -> dict | None:
    """The record ``store[key][section][name]``, or None."""
    return load().get(key, {}).get(section, {}).get(name)


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where a lesson runs), False in a script or under pytest:
    only a lesson's results are recorded by default."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules:
        return False
    shell = ipython.get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"
