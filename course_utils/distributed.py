"""Run a training script under ``torchrun`` from a notebook and collect what each rank reports
(lesson 04 and its exercise). Each rank ends with ``os._exit`` after its script: gloo's threads
outlive ``destroy_process_group()`` while a DDP model holds the group, and tearing the interpreter
down beside them aborted a rank now and then (``terminate called without an active exception``).

Sources: PyTorch docs "torchrun (Elastic Launch)" (workers start their own sessions, so a
time-out stops them one by one), "Getting Started with Distributed Data Parallel", FSDP2's
``fully_shard`` (parameters are ``DTensor`` shards).

Over 400 lines because launching, stopping and reading ``torchrun``'s ranks is one
process-management protocol (the rank runner, time limits, the ranks' last error, their reports).
"""
from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from .hardware import usable_cores
from .i18n import LANG_ENV, language, tr
from .memory_model import sharded_estimate
from .terms import MiB, check_positive_int

__all__ = ["REPORT_ENV", "Launch", "LaunchError", "default_backend", "launch", "max_world_size",
           "rank_report", "sharding_table", "state_bytes", "threads_per_rank",
           "write_module"]

#: Where a rank writes its report (set by `launch`).
REPORT_ENV = "COURSE_DIST_OUT"

#: Lines of the ranks' stderr that a `LaunchError` quotes.
STDERR_TAIL_LINES = 30

_BACKENDS = ("gloo", "nccl")
_SIGKILL = getattr(signal, "SIGKILL", signal.SIGTERM)  # Windows has no SIGKILL


class LaunchError(RuntimeError):
    """``torchrun`` failed, timed out, or a rank wrote no report: the first line says which,
    with a rank's last exception line; the tail of the ranks' stderr follows. Attributes:
    ``returncode`` (``None`` after a time-out), ``stdout``, ``stderr_tail``."""

    def __init__(self, message: str, returncode: int | None = None, stdout: str = "",
                 stderr_tail: str = ""):
        super().__init__(message)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr_tail = stderr_tail


@dataclass
class Launch:
    """One finished ``torchrun`` run: the ``command`` (a list of strings), ``nproc`` ranks, the
    ``backend``, ``OMP_NUM_THREADS`` per rank, ``returncode`` (0), ``stdout`` (ranks' lines may
    interleave), ``stderr``, ``seconds`` (wall time, process start-up included) and ``reports``
    (``reports[r]``: rank ``r``'s `rank_report`)."""

    command: list
    nproc: int
    backend: str
    threads_per_rank: int
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    reports: list = field(default_factory=list)

    @property
    def command_line(self) -> str:
        """The command as the learner would type it: ``torchrun``, without the rank runner."""
        args = [str(a) for a in self.command]
        if args[1:3] == ["-m", "torch.distributed.run"]:
            args = ["torchrun", *args[3:]]
        if _RUNNER in args:
            at = args.index(_RUNNER)
            if args[at - 1] == "-m":
                args = args[:at - 1] + args[at + 1:]
        return " ".join(args)

    @property
    def output(self) -> str:
        """The ranks' printed output, lines that start ``[rank N]`` sorted by rank."""
        def rank(line):
            m = re.match(r"\[rank (\d+)\]", line)
            return int(m.group(1)) if m else -1

        return "\n".join(sorted(self.stdout.rstrip().splitlines(), key=rank))  # a stable sort


def default_backend() -> str:
    """``"nccl"`` with two or more CUDA GPUs and NCCL, else ``"gloo"`` (CPU ranks: one GPU
    cannot host two NCCL ranks)."""
    if (torch.cuda.is_available() and torch.cuda.device_count() >= 2
            and torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        return "nccl"
    return "gloo"


def max_world_size(backend: str) -> int:
    """The most ranks `launch` runs here: one GPU each for ``nccl``, one of
    `course_utils.hardware.usable_cores` each for ``gloo``.

    Raises:
        ValueError: an unknown backend.
    """
    if backend == "nccl":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "gloo":
        return usable_cores()
    raise ValueError(tr("unknown backend {backend!r}: expected one of {names}.", backend=backend,
                        names=", ".join(_BACKENDS)))


def threads_per_rank(nproc: int) -> int:
    """``OMP_NUM_THREADS`` for each of ``nproc`` ranks, at least 1: this process's budget (its own
    positive ``OMP_NUM_THREADS``, else the usable cores) shared out."""
    try:
        budget = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        budget = 0
    cores = usable_cores()
    return max(1, min(budget if budget > 0 else cores, cores) // max(1, nproc))


def _check_nproc(nproc, backend: str) -> None:
    limit = max_world_size(backend)  # an unknown backend first
    check_positive_int("nproc (ranks)", nproc)
    if nproc > limit:
        if backend == "nccl":
            raise ValueError(tr("{nproc} NCCL ranks need {nproc} GPUs; this machine has {limit}. "
                                "Use fewer ranks, or backend='gloo' to run the ranks on the CPU.",
                                nproc=nproc, limit=limit))
        raise ValueError(tr("{nproc} gloo ranks need {nproc} CPU cores (one each); this machine "
                            "lets this process use {limit}. Use at most {limit} ranks.",
                            nproc=nproc, limit=limit))


def _children(pid: int) -> list[int]:
    """Descendant process ids of ``pid`` (Linux ``/proc``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> tuple[str, str]:
    """SIGTERM torchrun (which stops its ranks); after ``grace`` seconds SIGKILL what is left."""
    ranks = _children(proc.pid)
    _kill(proc.pid, signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *ranks]:
            _kill(pid, _SIGKILL)
        out, err = proc.communicate()
    for pid in ranks:  # the agent is gone; make sure no rank outlives it
        _kill(pid, _SIGKILL)
    return out or "", err or ""


_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))"
                         r"(?::\s*(.*))?$")
# A C++ or interpreter abort (no Python exception line).
_FATAL_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?(terminate called .*|Fatal Python error: .*"
                         r"|what\(\):\s+.*|Segmentation fault.*|Killed)$")
# torchrun's record of a rank that failed: "failed (exitcode: -6) local_rank: 1 (pid: ...)".
_FAILED_RANK = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")


def _last_error(stderr: str) -> str:
    """The signal that killed a rank, then a rank's last exception line, else its C++ abort."""
    found = fatal = died = ""
    for line in stderr.splitlines():
        m = _ERROR_LINE.match(line.strip())
        if m and "ChildFailedError" not in m.group(1) and "elastic" not in m.group(1):
            found = m.group(1).split(".")[-1] + (f": {m.group(2)}" if m.group(2) else "")
        f = _FATAL_LINE.match(line.strip())
        if f:
            fatal = f.group(1)
        d = _FAILED_RANK.search(line)
        if d and not died and int(d.group(1)) < 0:
            try:
                name = signal.Signals(-int(d.group(1))).name
            except ValueError:
                name = f"signal {-int(d.group(1))}"
            died = tr("rank {rank} died of {signal}", rank=d.group(2), signal=name)
    return ": ".join(p for p in (died, found or fatal) if p)


def _tail(text: str, n: int = STDERR_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


def _ranks_stderr_tail(stderr: str, n: int = STDERR_TAIL_LINES) -> str:
    """The tail of the ranks' stderr before torchrun's traceback, then its "failed" record."""
    lines = stderr.rstrip().splitlines()
    agent = next((i for i, line in enumerate(lines)
                  if "torch/distributed/elastic" in line and "failed (exitcode" in line), None)
    if agent is None:
        return _tail(stderr, n)
    return "\n".join(lines[:agent][-(n - 1):] + [lines[agent]])


def launch(script: str | os.PathLike, nproc: int, args: Sequence = (), *,
           backend: str | None = None, timeout: float = 300.0, cwd: str | os.PathLike | None = None,
           env: dict | None = None, expect_reports: bool = True) -> Launch:
    """Run ``script`` on ``nproc`` ranks (1 to `max_world_size`) with ``torchrun --standalone``,
    wait for it and return the `Launch`. ``args`` (passed with ``str``) go to the script;
    ``backend`` (default `default_backend()`) is only checked against the machine here, so pass
    it in ``args`` too; after ``timeout`` seconds the run and its ranks are stopped; ``cwd``
    defaults to the script's folder; ``env`` adds variables for the ranks (they win,
    ``OMP_NUM_THREADS`` included); ``expect_reports`` requires a `rank_report` from every rank.

    Raises:
        ValueError: ``nproc`` not a positive integer or more than the machine runs; an unknown
            backend; a non-positive timeout.
        FileNotFoundError: ``script`` does not exist.
        LaunchError: torchrun failed, ran past ``timeout``, or a rank wrote no report.
    """
    backend = backend or default_backend()
    _check_nproc(nproc, backend)
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(tr("timeout must be a positive number of seconds, got {timeout!r}.",
                            timeout=timeout))
    script = Path(script).resolve()
    if not script.is_file():
        raise FileNotFoundError(tr("no script at {script}: write it first (e.g. with "
                                   "%%writefile).", script=script))
    threads = int((env or {}).get("OMP_NUM_THREADS", threads_per_rank(nproc)))
    with tempfile.TemporaryDirectory(prefix="torchrun-reports-") as out_dir:
        package_root = str(Path(__file__).resolve().parent.parent)
        # block-buffered ranks (no PYTHONUNBUFFERED) write whole lines, not fragments
        run_env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {
            "OMP_NUM_THREADS": str(threads),   # N ranks x threads <= cores: no oversubscription
            REPORT_ENV: out_dir,
            "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
            LANG_ENV: language(),  # the ranks start in the script's folder: tell them the edition
        } | {k: str(v) for k, v in (env or {}).items()}  # the caller's word is last
        return _run(script, nproc, backend, threads, [str(a) for a in args], timeout,
                    cwd or script.parent, run_env, Path(out_dir), expect_reports)


_RUNNER = "course_utils.distributed"  # python -m course_utils.distributed SCRIPT ARGS: a rank


def _run_rank(argv: Sequence[str]) -> None:
    """Run ``python SCRIPT ARGS`` in this process, flush, and ``os._exit`` with its status."""
    script, *args = argv
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    status = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code
        if code is None or isinstance(code, int):
            status = code or 0
        else:
            print(code, file=sys.stderr)
            status = 1
    except BaseException:  # noqa: BLE001 - reported as Python would, then a failing status
        traceback.print_exc()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


def _run(script: Path, nproc: int, backend: str, threads: int, args: list, timeout: float, cwd,
         run_env: dict, out_dir: Path, expect_reports: bool) -> Launch:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", "-m", _RUNNER, str(script), *args]
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=run_env, cwd=str(cwd), start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stdout, stderr = _stop(proc)
        raise LaunchError(
            tr("torchrun did not finish within {timeout:g} s ({nproc} ranks, {script}); it and "
               "its ranks were stopped. Last lines of stderr:\n{tail}", timeout=timeout,
               nproc=nproc, script=script.name, tail=_tail(stderr)),
            None, stdout, _tail(stderr)) from None
    except BaseException:  # KeyboardInterrupt (the notebook's stop button): leave no rank behind
        _stop(proc, grace=5.0)
        raise
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        fields = {"status": proc.returncode, "nproc": nproc, "script": script.name,
                  "last": _last_error(stderr), "tail": _ranks_stderr_tail(stderr)}
        raise LaunchError(
            tr("torchrun exited with status {status} ({nproc} ranks, {script}); the ranks' last "
               "error: {last}\nLast lines of the ranks' stderr:\n{tail}", **fields)
            if fields["last"] else
            tr("torchrun exited with status {status} ({nproc} ranks, {script})\nLast lines of "
               "the ranks' stderr:\n{tail}", **fields),
            proc.returncode, stdout, fields["tail"])
    reports = []
    for rank in range(nproc):
        path = out_dir / f"rank{rank}.json"
        if path.is_file():
            reports.append(json.loads(path.read_text()))
        elif expect_reports:
            raise LaunchError(tr("rank {rank} wrote no report (call rank_report(...) in {script} "
                                 "on every rank). Last lines of stderr:\n{tail}", rank=rank,
                                 script=script.name, tail=_tail(stderr)),
                              proc.returncode, stdout, _tail(stderr))
    return Launch(command, nproc, backend, threads, proc.returncode, stdout, stderr, seconds,
                  reports)


def rank_report(payload: dict) -> Path | None:
    """Inside a script run by `launch`: write this rank's results (a JSON-ready dict) to
    ``$COURSE_DIST_OUT/rank{RANK}.json``, its path returned (``None`` under plain ``torchrun``).

    Raises:
        TypeError: ``payload`` is not a dict or holds values JSON cannot encode.
    """
    if not isinstance(payload, dict):
        raise TypeError(tr("rank_report takes a dict, got {type}.", type=type(payload).__name__))
    text = json.dumps(payload)
    folder = os.environ.get(REPORT_ENV)
    if not folder:
        return None
    path = Path(folder) / f"rank{int(os.environ.get('RANK', '0'))}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: launch never reads half a file
    return path


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)  # DTensor (FSDP2): this rank's shard
    return to_local() if callable(to_local) else t


def _bytes(tensors: Iterable) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors if t is not None)


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Bytes this rank holds: ``parameters``, ``gradients`` (those present now) and
    ``optimizer_state`` (every tensor in it: AdamW's moments and step counters). A ``DTensor``
    (FSDP2) counts its local shard; a ``ZeroRedundancyOptimizer`` its local ``.optim``."""
    local_opt = getattr(optimizer, "optim", optimizer)
    params = list(model.parameters())
    return {
        "parameters": _bytes(params),
        "gradients": _bytes(p.grad for p in params),
        "optimizer_state": _bytes(v for s in local_opt.state.values() for v in s.values()
                                  if isinstance(v, torch.Tensor)),
    }


_MODULE_HEADER = ('"""Written by course_utils.distributed.write_module from notebook cells."""\n'
                  "import contextlib  # noqa: F401\nimport math  # noqa: F401\n"
                  "from contextlib import nullcontext  # noqa: F401\n\n"
                  "import torch  # noqa: F401\nimport torch.nn.functional as F  # noqa: F401\n")


def write_module(path: str | os.PathLike, *functions, header: str = _MODULE_HEADER) -> Path:
    """Write the source of ``functions`` to ``path``, a module ``torchrun`` ranks can import,
    after ``header`` (default: imports of ``contextlib``, ``nullcontext``, ``math``, ``torch``
    and ``F``): the functions may use those names and their arguments, nothing else.

    Raises:
        TypeError: an argument is not a plain function.
        ValueError: no source can be found for a function (defined with ``exec``, say).
    """
    parts = [header]
    for fn in functions:
        if not inspect.isfunction(fn):
            raise TypeError(tr("write_module takes functions, got {type} {fn!r}.",
                               type=type(fn).__name__, fn=fn))
        try:
            parts.append(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError) as e:
            raise ValueError(tr("cannot read the source of {name}: define it in a notebook cell "
                                "or a file ({error}).", name=fn.__name__, error=e)) from None
    path = Path(path)
    path.write_text("\n\n".join(parts))
    return path


def sharding_table(reports: Iterable[dict], config, labels: dict | None = None):
    """Measured per-rank bytes beside `memory_model.sharded_estimate` of ``config``'s model, one
    row per (world size, ZeRO stage, rank) of ``reports``, each ``{"world_size": K, "rank": r,
    "stages": {stage: {"parameters": b, "gradients": b, "optimizer_state": b}}}`` (bytes; stage
    0-3, str or int). Columns: ``ranks``, ``ZeRO stage``, ``what ran`` (with ``labels``, ``{stage:
    name}``), ``rank``, in MiB ``parameters``, ``gradients``, ``optimizer state``, ``total``,
    ``estimate``, then ``total / estimate`` and ``worst part / estimate`` (the part furthest from
    its own estimate).

    Raises:
        ValueError: a report without those fields.
    """
    rows = []
    for rep in reports:
        try:
            K, rank, stages = int(rep["world_size"]), int(rep["rank"]), rep["stages"]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(tr("a rank report needs world_size, rank and stages; got {report!r}",
                                report=rep)) from e
        for stage, measured in sorted(stages.items(), key=lambda kv: int(kv[0])):
            est = sharded_estimate(config, K, int(stage))
            parts = {k: int(measured[k]) for k in ("parameters", "gradients", "optimizer_state")}
            worst = max((abs(parts[k] / getattr(est, k) - 1), parts[k] / getattr(est, k))
                        for k in parts)[1]
            total = sum(parts.values())
            row = {"ranks": K, "ZeRO stage": int(stage)}
            if labels:
                row["what ran"] = labels.get(int(stage), labels.get(str(stage), ""))
            rows.append({**row, "rank": rank, "parameters": parts["parameters"] / MiB,
                         "gradients": parts["gradients"] / MiB,
                         "optimizer state": parts["optimizer_state"] / MiB,
                         "total": total / MiB, "estimate": est.total / MiB,
                         "total / estimate": total / est.total, "worst part / estimate": worst})
    return pd.DataFrame(rows)


if __name__ == "__main__":  # a rank started by `launch` (see _run_rank)
    _run_rank(sys.argv[1:])
