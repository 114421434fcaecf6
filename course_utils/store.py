"""This machine's results store: what each lesson measured here, kept between kernels, so that
lesson 03's claims ledger shows each lesson's verdict (`course_utils.claims.verdict`) as that
lesson printed it, and every lesson times with the threads the first one chose
(`course_utils.hardware.use_threads`).

One JSON file, ``results.json``, in ``$COURSE_RESULTS_DIR``, else ``$XDG_CACHE_HOME/amp-course``,
else ``~/.cache/amp-course`` (the XDG base-directory convention), keyed by `context_key`
(docs/method.md#the-results-store). It knows files and keys, nothing of the hardware: callers
build the key, so this module sits below `course_utils.hardware` and `course_utils.config`.
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


def store_dir() -> Path:
    """The folder of the store (the module docstring); not created here."""
    env = os.environ.get("COURSE_RESULTS_DIR", "").strip()
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join("~", ".cache")
    return Path(cache).expanduser() / "amp-course"


def store_path() -> Path:
    """``store_dir() / "results.json"``."""
    return store_dir() / "results.json"


def context_key(size: str, hw) -> str:
    """``"<device> <name>[ <ISA cap>] | torch <version> | size <profile>"``: what a stored result
    must match to be shown as this run's. ``size``: the size profile (``"any"``: every size);
    ``hw``: a `course_utils.hardware.HardwareInfo`."""
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
    """Write ``value`` (JSON-serialisable) as ``store[key][section][name]`` with ``recorded_at``
    (seconds since the epoch), atomically (a temporary file renamed). Returns False, and the
    lesson goes on, where the folder cannot be written (a read-only home, a sandbox)."""
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
    """True inside a Jupyter kernel (where a lesson runs), False in a script or under pytest."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules:
        return False
    shell = ipython.get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"
