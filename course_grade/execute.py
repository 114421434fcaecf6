"""Executing an assembled notebook cell by cell in a fresh kernel, with time and memory limits.

Every question is scored on its own: execution goes on after a failing cell; a cell that runs too
long is interrupted (and the kernel killed if it does not answer); the kernel's outputs are
dropped as they arrive (the grader reads only each cell's reply); before each test and read-only
cell the grader resets IPython's input and AST transformers, exception handlers and cell
callbacks, through a request that those transformers never see. A Ctrl-C or SIGTERM to the
grader, recorded by a :class:`Stop`, ends the execution at once with :class:`GradingInterrupted`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from queue import Empty

from nbformat import NotebookNode

from .assemble import describe
from .files import MiB
from .notebook import first_line
from .sandbox import (
    DEFAULT_MEMORY,
    KernelLimits,
    Sandbox,
    client_context,
    kernel_env,
    kernel_manager,
)
from .stop import GradingInterrupted, Stop

DEFAULT_CELL_TIMEOUT = 120.0  # seconds per cell
DEFAULT_TIMEOUT = 600.0  # seconds per notebook, kernel start-up included
PROBE_TIMEOUT = 10.0  # seconds an interrupted kernel gets to answer again
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_OUT_OF_MEMORY = re.compile(r"can't allocate memory|out of memory|cannot allocate memory", re.I)

# Run in the kernel through ``user_expressions`` of an empty execute request: IPython returns
# before its input transformers, AST transformers and cell callbacks for empty code, and
# evaluates user expressions with a plain ``eval``. Returns NONCE:<transformers left> if it ran.
_RESET_CODE = r'''
def reset(nonce):
    import sys
    from IPython.core.inputtransformer2 import TransformerManager
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    for name in ("run_cell", "run_cell_async", "_run_cell", "should_run_async", "transform_cell",
                 "transform_ast", "run_ast_nodes", "run_code", "showtraceback", "set_custom_exc",
                 "user_expressions", "_format_user_obj"):
        shell.__dict__.pop(name, None)  # instance overrides of IPython's own methods
    shell.input_transformer_manager = TransformerManager()  # IPython's default transforms
    shell.input_transformers_post = []
    shell.ast_transformers = []
    shell.set_custom_exc((), None)
    trusted = ("matplotlib_inline.backend_inline", "ipykernel.pylab.backend_inline")

    def keep(callback):
        owner = getattr(callback, "__self__", None)
        if owner is not None:
            return (owner is shell or owner is shell.display_pub) and getattr(
                type(owner), callback.__name__, None) is getattr(callback, "__func__", None)
        module = sys.modules.get(getattr(callback, "__module__", None) or "")
        return module is not None and module.__name__ in trusted and getattr(
            module, getattr(callback, "__name__", ""), None) is callback

    for event, callbacks in shell.events.callbacks.items():
        callbacks[:] = [c for c in callbacks if event != "shell_initialized" and keep(c)]
    return f"{nonce}:{len(shell.input_transformers_post)}{len(shell.ast_transformers)}"
'''


@dataclass(frozen=True)
class Limits:
    """Time, memory and thread limits: ``cell_timeout`` and ``timeout`` (the whole notebook,
    kernel start included) in seconds, ``memory`` in bytes of kernel address space (0: none),
    ``probe_timeout`` seconds an interrupted kernel gets to answer again, ``threads`` the
    kernel's ``OMP_NUM_THREADS`` (None: the grader's own, default 1)."""

    cell_timeout: float = DEFAULT_CELL_TIMEOUT
    timeout: float = DEFAULT_TIMEOUT
    memory: int = DEFAULT_MEMORY
    probe_timeout: float = PROBE_TIMEOUT
    threads: int | None = None


@dataclass
class CellRun:
    """How one code cell ran: ``status`` "ok", "error", "timeout" or "not run", and a message."""

    status: str
    message: str = ""


def _failure_line(content: dict) -> str:
    """``Name: first line of the message``; for a bare exception, the line that raised it."""
    ename = str(content.get("ename") or "Error")
    evalue = first_line(content.get("evalue", ""))
    if evalue:
        return f"{ename}: {evalue}"
    if ename == "NotImplementedError":
        return "NotImplementedError: not implemented yet (a '# YOUR CODE HERE' region still raises)"
    frames = [_ANSI.sub("", str(frame)) for frame in content.get("traceback") or []]
    for frame in reversed(frames):
        for line in frame.splitlines():
            match = re.match(r"^\s*-+>\s*(\d+)\s+(.*\S)", line)
            if match:
                return f"{ename} at line {match.group(1)}: {match.group(2)}"
    return ename


def _asked_exit(content: dict) -> bool:
    """True if the reply says the cell called ``exit()``/``quit()``: the kernel stops after it."""
    payload = content.get("payload") or []
    return any(
        isinstance(item, dict) and item.get("source") == "ask_exit" and not item.get("keepkernel")
        for item in payload
    )


def _quiet_client_class():
    # lazy: the grade extra, needed only to execute notebooks
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionComplete

    class QuietNotebookClient(NotebookClient):
        """A NotebookClient that keeps no output: only the end of each cell matters."""

        def process_message(self, msg, cell, cell_index):
            if msg.get("msg_type") == "status" and msg["content"].get("execution_state") == "idle":
                raise CellExecutionComplete()
            return None

    return QuietNotebookClient


async def _request(client, code: str, seconds: float, **options) -> dict | None:
    """Send ``code`` with ``options`` (store_history off); the reply's content, or None if the
    kernel does not answer within ``seconds``."""
    from jupyter_core.utils import ensure_async  # lazy: the grade extra, needed only to execute notebooks

    msg_id = await ensure_async(client.kc.execute(code, store_history=False, **options))
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            msg = await ensure_async(client.kc.shell_channel.get_msg(timeout=left))
        except Empty:
            return None
        if msg.get("parent_header", {}).get("msg_id") == msg_id:
            return msg.get("content", {})
    return None


async def _reset_ipython(client, seconds: float) -> str | None:
    """Reset the kernel's IPython (see ``_RESET_CODE``). None if done, else why not ("no answer"
    if the kernel did not reply within ``seconds``)."""
    nonce = secrets.token_hex(8)
    expression = f"(lambda g: (exec({_RESET_CODE!r}, g), g['reset']({nonce!r}))[1])({{}})"
    content = await _request(
        client, "", seconds, silent=True, user_expressions={"reset": expression}
    )
    if content is None:
        return "no answer"
    value = (content.get("user_expressions") or {}).get("reset") or {}
    text = value.get("data", {}).get("text/plain") if value.get("status") == "ok" else None
    if text == repr(f"{nonce}:00"):
        return None
    return "the submission changed how IPython runs code, and the grader could not undo it"


def _memory_note(limits: Limits) -> str:
    if limits.memory > 0:
        return f"the kernel may use {limits.memory / MiB:g} MiB (--memory)"
    return "the kernel's memory is not capped"


async def _execute_cells(client, nb, protected, limits, stop, issues) -> list[CellRun | None]:
    # lazy: the grade extra, needed only to execute notebooks
    from jupyter_core.utils import ensure_async
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    deadline = time.monotonic() + limits.timeout
    runs: list[CellRun | None] = [None] * len(nb.cells)
    replies: dict[int, dict] = client.course_grade_replies
    halt = ""
    count = 0

    async def recover() -> str:
        """After a time-out: interrupt; return why to halt ('' if the kernel answers again)."""
        if not await ensure_async(client.km.is_alive()):
            return "not run: the kernel died before this cell"
        await ensure_async(client.km.interrupt_kernel())
        left = deadline - time.monotonic()
        if left <= 0:
            return f"not run: the notebook time limit ({limits.timeout:g} s) was reached"
        if await _request(client, "pass", min(limits.probe_timeout, left)) is None:
            return "not run: the kernel did not stop after a time-out and was killed"
        return ""

    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        if stop is not None and stop.requested:
            raise GradingInterrupted(stop.signum)
        if not halt and deadline - time.monotonic() <= 0:
            halt = f"not run: the notebook time limit ({limits.timeout:g} s) was reached"
        if halt:
            runs[index] = CellRun("not run", halt)
            continue
        if index in protected:  # IPython as it was, whatever the learner's cells changed
            left = deadline - time.monotonic()
            why = await _reset_ipython(client, min(limits.cell_timeout, limits.probe_timeout, left))
            if why == "no answer":
                runs[index] = CellRun("not run", "not run: the kernel did not answer the grader")
                halt = await recover()
                continue
            if why is not None:
                runs[index] = CellRun("not run", f"not run: {why}")
                issues.append(f"{describe(cell)}: {why}")
                continue
        client.course_grade_limit = min(limits.cell_timeout, deadline - time.monotonic())
        count += 1
        try:
            await client.async_execute_cell(cell, index, execution_count=count)
        except CellTimeoutError:
            seconds = client.course_grade_limit
            which = "cell" if seconds == limits.cell_timeout else "notebook"
            runs[index] = CellRun("timeout", f"timed out after {seconds:.3g} s ({which} limit)")
            halt = await recover()
            continue
        except DeadKernelError:  # also how nbclient reports the cancellation by a Stop
            if stop is not None and stop.requested:
                raise GradingInterrupted(stop.signum) from None
            runs[index] = CellRun(
                "error",
                "the kernel died while this cell ran (os._exit, a crash, a signal, or out of "
                f"memory: {_memory_note(limits)})",
            )
            halt = f"not run: the kernel died in {describe(cell)}"
            continue
        content = (replies.pop(index, None) or {}).get("content", {})
        status = content.get("status", "ok")
        if status == "ok" and _asked_exit(content):
            runs[index] = CellRun("error", "it stopped the kernel (exit() or quit())")
            halt = f"not run: {describe(cell)} stopped the kernel (exit() or quit())"
        elif status == "ok":
            runs[index] = CellRun("ok")
        elif status == "error":
            message = _failure_line(content)
            if content.get("ename") == "MemoryError" or _OUT_OF_MEMORY.search(message):
                message += f" (out of memory: {_memory_note(limits)})"
            runs[index] = CellRun("error", message)
        else:
            runs[index] = CellRun("error", f"execution {status}")
    return runs


async def _shutdown(client) -> None:
    """Kill the kernel and close the channels, whatever state they are in."""
    from jupyter_core.utils import ensure_async  # lazy: the grade extra, needed only to execute notebooks

    km, kc = client.km, client.kc
    with contextlib.suppress(Exception):
        if kc is not None:
            await ensure_async(kc.stop_channels())
    with contextlib.suppress(Exception):
        if km is not None and km.has_kernel:
            await ensure_async(km.shutdown_kernel(now=True))
    with contextlib.suppress(Exception):
        if km is not None:
            await ensure_async(km.cleanup_resources())


async def execute_async(
    nb: NotebookNode,
    protected: set[int],
    limits: Limits,
    sandbox: Sandbox | None,
    workdir: Path,
    stop: Stop | None = None,
) -> tuple[list[CellRun | None], list[str]]:
    """Execute the code cells of ``nb`` in a fresh kernel in ``workdir`` (see
    :func:`course_grade.sandbox.make_workdir`); ``protected`` are the indices of the source's
    test and read-only cells (IPython is reset before each).

    Returns one CellRun per cell (None for markdown and raw cells) and notes (tampering that the
    grader could not undo). Raises GradingInterrupted if ``stop`` is requested, RuntimeError (or
    jupyter_client's errors) if the kernel cannot start.
    """
    from jupyter_core.utils import ensure_async  # lazy: the grade extra, needed only to execute notebooks

    client_class = _quiet_client_class()
    env = kernel_env(sandbox, workdir, limits.threads)
    kernel_limits = KernelLimits.for_timeout(limits.memory, limits.timeout)
    km = kernel_manager(sandbox, workdir, kernel_limits, env)
    client = client_class(
        nb,
        km=km,
        timeout_func=lambda cell: client.course_grade_limit,
        allow_errors=True,  # every cell runs, whatever happened before: questions score alone
        interrupt_on_timeout=False,  # the grader interrupts, then checks the kernel answers
        shutdown_kernel="immediate",
        startup_timeout=max(1, int(min(60.0, limits.timeout))),
        record_timing=False,
        store_widget_state=False,
        iopub_timeout=1,  # after a cell's reply: the grader needs no output, only the reply
        on_cell_executed=lambda cell, cell_index, execute_reply: (
            client.course_grade_replies.__setitem__(cell_index, execute_reply)
        ),
    )
    client.course_grade_limit = limits.cell_timeout
    client.course_grade_replies = {}
    issues: list[str] = []
    context = client_context()
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    log = open(workdir / "kernel.log", "wb")
    watch = contextlib.nullcontext()
    if stop is not None and task is not None:
        watch = stop.watching(loop, task)
    try:
        with watch:
            if stop is not None and stop.requested:
                raise GradingInterrupted(stop.signum)
            try:
                await client.async_start_new_kernel(
                    env=env, cwd=str(workdir / "home"), stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=log,
                )
                # nbclient's async_start_new_kernel_client, with the grader's zmq context
                client.kc = km.client(context=context)
                await ensure_async(client.kc.start_channels())
                await ensure_async(client.kc.wait_for_ready(timeout=client.startup_timeout))
                client.kc.allow_stdin = False
            except Exception as error:
                log.flush()
                tail = (workdir / "kernel.log").read_bytes()[-2000:].decode("utf-8", "replace")
                last = [line for line in tail.splitlines() if line.strip()]
                why = first_line(str(error)) or type(error).__name__
                said = f": {last[-1].strip()[:200]}" if last else ""
                raise RuntimeError(f"the kernel did not start ({why}){said}") from None
            runs = await _execute_cells(client, nb, protected, limits, stop, issues)
    except asyncio.CancelledError:
        if stop is not None and stop.requested:
            raise GradingInterrupted(stop.signum) from None
        raise
    finally:
        await _shutdown(client)
        context.destroy(linger=0)
        log.close()
    return runs, issues


def execute(*args, **kwargs) -> tuple[list[CellRun | None], list[str]]:
    """Blocking form of :func:`execute_async`, with the same arguments (runs its own event
    loop)."""
    from jupyter_core.utils import run_sync  # lazy: the grade extra, needed only to execute notebooks

    return run_sync(execute_async)(*args, **kwargs)
