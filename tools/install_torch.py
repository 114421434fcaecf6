"""Install torch for this machine: `make course`'s first step (the Makefile runs it only where
torch does not import yet).

    python tools/install_torch.py torch==2.13.0            # decide, say why, install
    python tools/install_torch.py torch==2.13.0 --dry-run  # decide and say why; install nothing

The decision (`plan`):

- **Linux without an NVIDIA GPU** (no ``nvidia-smi`` on the PATH and no ``/proc/driver/nvidia``):
  the CPU build from PyTorch's CPU wheel index (`CPU_INDEX`), one wheel without NVIDIA's
  libraries, as PyTorch's own install selector says (``pip install torch --index-url
  https://download.pytorch.org/whl/cpu``). The standard Linux wheel on PyPI is the CUDA build,
  which pulls several GB of NVIDIA libraries that a machine without a GPU never uses. Where
  that index cannot be reached (a probe of its ``torch/`` page fails within ``--timeout``
  seconds) or the install from it fails, the standard wheel, with a warning saying what it
  costs; where pip is told of a local CPU build (as in the course's CI, through pip's
  ``find-links``), the standard install picks that.
- **Linux with an NVIDIA GPU**: the standard wheel (the CUDA build).
- **macOS**: the standard wheel (its build has MPS, Apple's GPU back end).
- **Windows and anything else**: the standard wheel (untested by the course: README.md says to
  use WSL or Colab there).

``--system``, ``--nvidia`` and ``--index-url`` replace what the script would find out, so that a
test can try every branch on any machine.
"""
from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: PyTorch's CPU wheel index (https://pytorch.org/get-started/locally/, "Compute Platform: CPU").
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def has_nvidia(which: Callable = shutil.which, driver: Path = Path("/proc/driver/nvidia")) -> bool:
    """True where an NVIDIA driver is installed: ``nvidia-smi`` on the PATH or, on Linux, the
    driver's ``/proc/driver/nvidia`` folder."""
    return which("nvidia-smi") is not None or driver.exists()


def index_reachable(index: str, timeout: float = 5.0) -> bool:
    """True if ``index``'s page for torch (``<index>/torch/``, the simple repository API that pip
    reads) answers within ``timeout`` seconds."""
    try:
        with urllib.request.urlopen(index.rstrip("/") + "/torch/", timeout=timeout) as r:
            return 200 <= r.status < 300
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class Plan:
    """The pip installs to try, in order (``attempts``: each a list of ``pip`` arguments; the
    first that succeeds ends it) and why (``reason``, one sentence per attempt)."""

    attempts: tuple[tuple[str, ...], ...]
    reason: str


def plan(spec: str, system: str, nvidia: bool, reachable: Callable[[], bool],
         index: str = CPU_INDEX) -> Plan:
    """Which torch build to install for ``spec`` (e.g. ``"torch==2.13.0"``) on ``system``
    (`platform.system`'s name: ``"Linux"``, ``"Darwin"``, ``"Windows"``), with or without an
    NVIDIA GPU (`has_nvidia`); ``reachable()`` probes the CPU ``index`` (`index_reachable`) and
    is called only on Linux without an NVIDIA GPU. See the module's docstring for the rules."""
    standard = ("install", "--quiet", spec)
    if system != "Linux":
        what = {"Darwin": "macOS: the standard wheel (with MPS, Apple's GPU back end)",
                "Windows": "Windows: the standard wheel (the course is untested on Windows: "
                           "README.md suggests WSL or Colab)"}
        return Plan((standard,), what.get(system, f"{system}: the standard wheel"))
    if nvidia:
        return Plan((standard,), "Linux with an NVIDIA GPU: the standard wheel (the CUDA build)")
    if not reachable():
        return Plan((standard,), f"Linux without an NVIDIA GPU, but PyTorch's CPU wheel index "
                    f"({index}) cannot be reached: the standard wheel, which from PyPI is the "
                    "CUDA build (several GB with its NVIDIA libraries) unless pip is given a "
                    "local CPU build")
    return Plan((("install", "--quiet", "--index-url", index, spec), standard),
                f"Linux without an NVIDIA GPU: the CPU build from {index} (no NVIDIA "
                "libraries; the standard wheel if that install fails)")


def _pip(args: Sequence[str]) -> int:
    return subprocess.run([sys.executable, "-m", "pip", *args]).returncode


def install(p: Plan, run: Callable[[Sequence[str]], int] = _pip,
            say: Callable[[str], None] = print) -> int:
    """Run ``p``'s attempts in order with ``run`` (pip's arguments -> exit status; tests pass a
    fake) until one succeeds; say each command. Returns the last exit status (0: installed)."""
    say(f"torch: {p.reason}")
    code = 1
    for n, args in enumerate(p.attempts):
        if n:
            say(f"torch: that failed (pip exit status {code}); trying the standard wheel")
        say("torch: pip " + " ".join(args))
        code = run(args)
        if code == 0:
            break
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/install_torch.py", description=__doc__
                                     .split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("spec", nargs="?", default="torch==2.13.0",
                        help="the requirement to install (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="say what would run; install nothing")
    parser.add_argument("--system", default=platform.system(),
                        help="the operating system as platform.system() names it (default: this one, "
                             "%(default)s)")
    parser.add_argument("--nvidia", choices=("yes", "no"),
                        help="whether an NVIDIA GPU is there (default: look for nvidia-smi and "
                             "/proc/driver/nvidia)")
    parser.add_argument("--index-url", default=CPU_INDEX,
                        help="the CPU wheel index to probe and use (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="seconds to wait for the index (default: %(default)s)")
    parser.add_argument("--pip-arg", action="append", default=[], metavar="ARG",
                        help="an extra argument for every pip command, e.g. --pip-arg=--dry-run "
                             "(repeat it for more)")
    args = parser.parse_args(argv)
    nvidia = has_nvidia() if args.nvidia is None else args.nvidia == "yes"
    p = plan(args.spec, args.system, nvidia,
             lambda: index_reachable(args.index_url, args.timeout), args.index_url)
    if args.pip_arg:
        p = Plan(tuple((*a, *args.pip_arg) for a in p.attempts), p.reason)
    if args.dry_run:
        print(f"torch: {p.reason}")
        for attempt in p.attempts:
            print("would run: pip " + " ".join(attempt))
        return 0
    return install(p)


if __name__ == "__main__":
    raise SystemExit(main())
