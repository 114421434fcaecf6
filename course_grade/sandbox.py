"""How the learner's kernel is started: in a bubblewrap sandbox, or plainly, with resource limits.

**Sandboxed** (Linux with bubblewrap, ``bwrap``): the kernel sees a new, empty root file system
holding only what it needs, read-only: ``/usr`` (and the ``/bin``, ``/lib*`` links), a few files
of ``/etc`` (the dynamic loader's cache, fonts, time zone), the grader's Python (its prefix and
base prefix) and the course's package (``course_utils``, the package folder only, never the
repository that also holds ``solutions/``). It writes only to a throwaway folder (its home and
working folder, ``/home/learner``, and its ``/tmp``). It runs in new user, PID, network, IPC, UTS
and cgroup namespaces as user ``nobody`` (65534) without capabilities, in its own session (it
cannot push keystrokes into the grader's terminal), with no network at all (not even the
grader's loopback: the grader talks to it over unix sockets, jupyter_client's ``ipc``
transport, in a folder bound into the sandbox), an environment of a few variables, and dies with
the grader. The source folder, the class folder, the CSV and the grader's processes do not exist
inside.

**Unsandboxed** (``--no-sandbox``, or a learner's own notebook where bubblewrap cannot be used):
the kernel runs as the grader's user with full access to the grader's files, processes and
network, but still in a throwaway working folder, with a minimal environment and the same
resource limits. Without a working sandbox, grading a class (more than one submission) or any
notebook that is not the learner's own (see :func:`own_work`) is refused before anything runs:
:func:`choose_sandbox` raises SandboxError with the install command and ``--no-sandbox`` as the
explicit way to accept the risk.

Either way the kernel's address space (``RLIMIT_AS``) and CPU time (``RLIMIT_CPU``) are capped by
a small wrapper that sets the limits and then executes ``python -m ipykernel_launcher``.

Over 400 lines because it is one security boundary, read and reviewed as a unit: what the
sandbox exposes, how a kernel starts inside it, the limits on what it can send back, and when
grading without it is refused.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .files import MiB

KERNEL_PACKAGES = ("course_utils",)  # imported by the graded notebooks: visible in the sandbox
LEARNER_HOME = "/home/learner"  # the kernel's home and working folder inside the sandbox
SANDBOX_UID = 65534  # nobody
DEFAULT_MEMORY = 4096 * MiB  # bytes of address space a kernel may map (RLIMIT_AS)
MAX_MESSAGE_BYTES = 8 * MiB  # larger kernel messages (a huge print) are never received
MAX_QUEUED_MESSAGES = 64  # messages zmq may queue for the grader per socket
_PROBE_SECONDS = 30.0  # how long the check that bubblewrap works may take
#: How to get the sandbox, in the words every refusal and warning prints.
INSTALL = ("install bubblewrap (Debian, Ubuntu: sudo apt-get install bubblewrap; Fedora: "
           "sudo dnf install bubblewrap)")

_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/fonts",
    "/etc/localtime",
)
# The sandbox's /etc/hosts: its own name and localhost resolve (torchrun's rendezvous and gloo
# look them up; with no file there, glibc asks DNS, which the empty network namespace lacks).
_HOSTS = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n"
# Sets the limits, then replaces itself by the kernel: argv = MEMORY CPU PROGRAM ARGS...
_LIMITS_WRAPPER = (
    "import os, resource, sys\n"
    "memory, cpu = int(sys.argv[1]), int(sys.argv[2])\n"
    "if memory > 0:\n"
    "    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))\n"
    "if cpu > 0:\n"
    "    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)


class SandboxError(RuntimeError):
    """The sandbox cannot be used: bubblewrap is missing or fails, or it would expose a path
    that learner code must not see."""


@dataclass(frozen=True)
class KernelLimits:
    """Resource limits of one kernel: ``memory`` bytes of address space (``RLIMIT_AS``) and
    ``cpu`` seconds of CPU time (``RLIMIT_CPU``); 0 means no limit."""

    memory: int = DEFAULT_MEMORY
    cpu: int = 0

    @classmethod
    def for_timeout(cls, memory: int, timeout: float) -> "KernelLimits":
        """Limits for a notebook allowed ``timeout`` seconds: CPU time twice that plus 30 s."""
        return cls(memory=int(memory), cpu=2 * math.ceil(timeout) + 30)


@dataclass(frozen=True)
class Sandbox:
    """A bubblewrap configuration: the ``bwrap`` program, the folders the kernel sees read-only,
    and the folders put on the kernel's ``PYTHONPATH`` (parents of packages outside the prefix)."""

    bwrap: str
    read_only: tuple[str, ...]
    pythonpath: tuple[str, ...]

    def describe(self) -> str:
        """One line for the report: what the sandbox allows."""
        return (
            "sandbox: bubblewrap (no network, read-only Python and course_utils, no view of the "
            "sources, the submissions, the CSV or the grader; writes only to a throwaway folder)"
        )


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _python_folders() -> list[Path]:
    """Folders of the grader's Python that the kernel needs: the prefixes and site folders."""
    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    folders = {Path(p).resolve() for p in prefixes}
    folders.add(Path(sys.executable).resolve().parent.parent)
    for entry in filter(None, sys.path):  # '' is the working folder: never
        path = Path(entry).resolve()
        if path.name in ("site-packages", "dist-packages") and path.is_dir():
            folders.add(path)
    return sorted(folders)


def _package_folders(names: Iterable[str]) -> list[Path]:
    """Where the grader's Python finds each package of ``names`` (without importing it)."""
    found = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        if spec.submodule_search_locations:
            found.extend(Path(p).resolve() for p in spec.submodule_search_locations)
        elif spec.origin and os.path.isfile(spec.origin):
            found.append(Path(spec.origin).resolve())
    return found


def plan_sandbox(hidden: Iterable[str | os.PathLike] = (), bwrap: str | None = None) -> Sandbox:
    """The sandbox for this Python: what the kernel sees, checked against ``hidden``.

    ``hidden`` are the paths learner code must not see (the source folder, the submissions, the
    CSV). Raises SandboxError if ``bwrap`` (default: found on ``PATH``) is missing, or if a
    folder the kernel needs (``/usr``, the Python prefix, a package folder) contains one of them.
    """
    program = bwrap or shutil.which("bwrap")
    if not program:
        raise SandboxError("bubblewrap (bwrap) is not installed")
    python = _python_folders()
    packages = [
        p for p in _package_folders(KERNEL_PACKAGES) if not any(_inside(p, f) for f in python)
    ]
    read_only = [Path("/usr"), *python, *packages]
    hidden_paths = [Path(os.path.abspath(p)) for p in hidden]
    for folder in read_only:
        for path in hidden_paths:
            if _inside(path, folder) or _inside(path.resolve(), folder):
                raise SandboxError(
                    f"the kernel needs to see {folder}, which contains {path}: learner code could "
                    "read it; move the sources, submissions and CSV out of that folder"
                )
    pythonpath = tuple(dict.fromkeys(str(p.parent) for p in packages))
    return Sandbox(
        bwrap=program,
        read_only=tuple(str(p) for p in read_only),
        pythonpath=pythonpath,
    )


def kernel_env(
    sandbox: Sandbox | None, workdir: Path, threads: int | None = None
) -> dict[str, str]:
    """The kernel's whole environment: a few variables, never the grader's secrets.

    ``COURSE_SIZE`` (default ``smoke``) and any other ``COURSE_*`` variable are passed on;
    ``OMP_NUM_THREADS`` is ``threads`` if given (the grader's share for one job, see
    :func:`course_grade.parallel.threads_per_job`), else the grader's own (default 1);
    ``HOME`` and ``TMPDIR`` point into the throwaway ``workdir`` (see :func:`make_workdir`), so
    every kernel, and everything it starts, has its own temporary folder. Unsandboxed, ``PATH``
    and ``PYTHONPATH`` are the grader's; sandboxed, ``PYTHONPATH`` holds only the folders of
    :attr:`Sandbox.pythonpath`.
    """
    env = {key: value for key, value in os.environ.items() if key.startswith("COURSE_")}
    env.setdefault("COURSE_SIZE", "smoke")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(max(1, int(threads)))
    else:
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    env.update(
        LANG="C.UTF-8",
        USER="learner",
        LOGNAME="learner",
        MALLOC_ARENA_MAX="2",  # fewer glibc arenas: less address space per thread under RLIMIT_AS
        PYDEVD_DISABLE_FILE_VALIDATION="1",  # quiets debugpy's frozen-module warning
        PYTHONDONTWRITEBYTECODE="1",
        JUPYTER_PLATFORM_DIRS="1",
    )
    if sandbox is None:
        env.update(
            HOME=str(workdir / "home"), TMPDIR=str(workdir / "tmp"),
            PATH=os.environ.get("PATH", os.defpath),
        )
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    else:
        env.update(
            HOME=LEARNER_HOME, TMPDIR="/tmp",
            PATH=f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        )
        if sandbox.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(sandbox.pythonpath)
    return env


def _bwrap_args(sandbox: Sandbox, workdir: Path, env: dict[str, str]) -> list[str]:
    args = [
        sandbox.bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-all",
        "--unshare-user",
        "--uid", str(SANDBOX_UID),
        "--gid", str(SANDBOX_UID),
        "--cap-drop", "ALL",
        "--hostname", "sandbox",
        "--clearenv",
    ]
    for key, value in env.items():
        args += ["--setenv", key, value]
    # /tmp first: a later mount over /tmp would hide the read-only folders that lie under it (a
    # course cloned into /tmp); mounted before them, they appear inside the throwaway /tmp.
    args += ["--proc", "/proc", "--dev", "/dev", "--bind", str(workdir / "tmp"), "/tmp"]
    for link in _SYSTEM_LINKS:
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    for path in _ETC_FILES:
        args += ["--ro-bind-try", path, path]
    for folder in sandbox.read_only:
        args += ["--ro-bind", folder, folder]
    args += ["--ro-bind", str(workdir / "hosts"), "/etc/hosts"]
    args += [
        "--bind", str(workdir / "home"), LEARNER_HOME,
        "--bind", str(workdir / "run"), str(workdir / "run"),
        "--chdir", LEARNER_HOME,
        "--",
    ]
    return args


def _font_caches() -> list[Path]:
    """matplotlib's font list of the grader's user, if any (without importing matplotlib)."""
    folder = os.environ.get("MPLCONFIGDIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "matplotlib",
    )
    try:
        found = Path(folder).glob("fontlist-v*.json")
        return [p for p in found if p.is_file() and p.stat().st_size < 2**22]
    except OSError:
        return []


def make_workdir(parent: str | os.PathLike | None = None) -> Path:
    """A new throwaway folder for one kernel: ``home/`` (its working folder), ``tmp/``, ``run/``
    (connection file and sockets) and ``hosts`` (the sandbox's ``/etc/hosts``: localhost only).
    The home gets a copy of matplotlib's font list, if the grader's user has one (a kernel would
    spend seconds rebuilding it). Raises OSError if the folder cannot be created."""
    workdir = Path(tempfile.mkdtemp(prefix="course-grade-", dir=parent))
    for name in ("home", "tmp", "run"):
        (workdir / name).mkdir(mode=0o700)
    (workdir / "hosts").write_text(_HOSTS)
    fonts = workdir / "home" / ".cache" / "matplotlib"
    for cache in _font_caches():
        fonts.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            shutil.copyfile(cache, fonts / cache.name)
    return workdir


def remove_workdir(workdir: Path) -> None:
    """Delete a folder made by :func:`make_workdir`, even where learner code removed its own
    permissions on what it wrote; never raises."""

    def allow_and_retry(function, path, _):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(path), 0o700)
            if os.path.isdir(path) and not os.path.islink(path):
                os.chmod(path, 0o700)
            function(path)

    if sys.version_info >= (3, 12):
        shutil.rmtree(workdir, onexc=allow_and_retry)
    else:
        shutil.rmtree(workdir, onerror=allow_and_retry)
    shutil.rmtree(workdir, ignore_errors=True)


def kernel_command(
    sandbox: Sandbox | None, workdir: Path, limits: KernelLimits, env: dict[str, str]
) -> list[str]:
    """The kernel spec's ``argv`` (with jupyter_client's ``{connection_file}`` placeholder)."""
    python = sys.executable
    kernel = [
        python, "-c", _LIMITS_WRAPPER, str(max(0, limits.memory)), str(max(0, limits.cpu)),
        python, "-m", "ipykernel_launcher", "-f", "{connection_file}",
    ]
    if sandbox is None:
        return kernel
    return _bwrap_args(sandbox, workdir, env) + kernel


def kernel_manager(
    sandbox: Sandbox | None, workdir: Path, limits: KernelLimits, env: dict[str, str]
):
    """An AsyncKernelManager for one kernel in ``workdir`` (see :func:`make_workdir`).

    It talks to the kernel over unix sockets in ``workdir/run`` (the ``ipc`` transport) and
    interrupts it with an ``interrupt_request`` message (the kernel is in its own session).
    Connect to it with ``km.client(context=client_context())``.
    """
    # lazy: the grade extra, needed only to execute notebooks
    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    spec = KernelSpec(
        argv=kernel_command(sandbox, workdir, limits, env),
        display_name="course-grade",
        language="python",
        interrupt_mode="message",
        env={},
        resource_dir=str(workdir / "run"),
    )

    class OneKernelSpec(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return spec

    km = AsyncKernelManager(
        kernel_name="course-grade",
        kernel_spec_manager=OneKernelSpec(),
        transport="ipc",
        ip=str(workdir / "run" / "kernel"),
    )
    km.connection_file = str(workdir / "run" / "kernel.json")
    return km


def client_context():
    """A new zmq context for the grader's side of one kernel's channels: a message part over
    :data:`MAX_MESSAGE_BYTES` is never taken in (zmq drops the connection, which reconnects), and
    at most :data:`MAX_QUEUED_MESSAGES` wait per socket. The grader needs only small replies; a
    learner's 200 MiB print must not cost the grader 200 MiB. Destroy it after use."""
    # lazy: the grade extra, needed only to execute notebooks
    import zmq
    import zmq.asyncio

    context = zmq.asyncio.Context()
    context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    context.setsockopt(zmq.RCVHWM, MAX_QUEUED_MESSAGES)
    return context


def check_sandbox(sandbox: Sandbox) -> None:
    """Start the sandbox once with ``python -c pass``; raise SandboxError (with bubblewrap's
    first line of complaint) if it does not work, e.g. where user namespaces are disabled."""
    workdir = make_workdir()
    try:
        env = kernel_env(sandbox, workdir)
        command = _bwrap_args(sandbox, workdir, env) + [sys.executable, "-c", "pass"]
        try:
            done = subprocess.run(
                command, stdin=subprocess.DEVNULL, capture_output=True, timeout=_PROBE_SECONDS
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SandboxError(f"bubblewrap does not start: {type(error).__name__}") from None
        if done.returncode != 0:
            lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
            said = lines[-1][:200] if lines else f"exit status {done.returncode}"
            raise SandboxError(f"bubblewrap fails here: {said}")
    finally:
        remove_workdir(workdir)


def own_work(paths: Iterable[str | os.PathLike], source: str | os.PathLike) -> bool:
    """True when ``paths`` (as given: a folder is never one's own) is a learner checking their
    own notebook: exactly one path, a regular file (not a link) owned by the user running the
    grader, inside the course folder (the folder that holds the ``source`` folder, e.g. the
    learner's ``exercises/01_loss_scaling.ipynb``).

    Anything else is somebody else's work (a class folder, a notebook downloaded from a learner,
    kept outside the course folder as docs/instructors.md asks): it is graded in the sandbox or,
    with ``--no-sandbox``, at the instructor's explicit risk.
    """
    paths = [Path(p) for p in paths]
    if len(paths) != 1:
        return False
    path, course = paths[0], Path(source).resolve().parent
    try:
        info = path.lstat()
    except OSError:
        return False
    if path.is_symlink() or not path.is_file():
        return False
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return False
    return _inside(path.resolve(), course)


def choose_sandbox(
    wanted: bool | None, hidden: Iterable[str | os.PathLike] = (), *, own: bool = False
) -> tuple[Sandbox | None, str]:
    """Decide how kernels run: returns the sandbox (None: unsandboxed) and a line saying so.

    ``wanted`` True: the sandbox or SandboxError; False: unsandboxed (the caller accepted the
    risk: ``--no-sandbox``); None (the default): the sandbox where it works (Linux with a working
    bubblewrap); where it does not, unsandboxed with a warning if ``own`` (a learner's own
    notebook, :func:`own_work`), else SandboxError naming the install command and
    ``--no-sandbox``: a class is never graded unsandboxed by accident.
    """
    unsandboxed = (
        "learner code runs UNSANDBOXED, as your user, with your files and network "
        "(see docs/instructors.md)"
    )
    if wanted is False:
        return None, f"warning: --no-sandbox: {unsandboxed}"
    try:
        if not sys.platform.startswith("linux"):
            raise SandboxError("the sandbox needs Linux")
        sandbox = plan_sandbox(hidden)
        check_sandbox(sandbox)
    except SandboxError as error:
        if wanted:
            raise SandboxError(f"--sandbox: {error}; {INSTALL}") from None
        if not own:
            raise SandboxError(
                f"no sandbox ({error}): nothing was graded. Grading a class, or a notebook that "
                "is not your own, would run its code as you, with your files, processes and "
                f"network. To grade it: {INSTALL}; or give --no-sandbox (Python: sandbox=False) "
                "to accept that risk (docs/instructors.md, 'What each mode protects')"
            ) from None
        return None, (f"warning: no sandbox ({error}): your own notebook runs UNSANDBOXED, as "
                      f"your user; {INSTALL} to isolate it")
    return sandbox, sandbox.describe()
