"""The dashboard in a real browser: JupyterLab + Debian's Chromium driven by Playwright.

A temporary folder gets a notebook with lesson 03's dashboard line and a second dashboard whose
training step runs out of memory from batch 64 on (as a GPU would); JupyterLab serves it on a
free local port; headless Chromium opens it, runs both cells and uses the controls as a learner
would: the precision control (the saved activations' dtype and bytes change), the checkpoint
policy (saved bytes fall under ``full`` and ``selective``), the chart (redrawn, wider, after each
Run), the progress bar (it moves during a Run), Stop (it ends a long Run between steps), the
refusals (too slow, emulated) and the out-of-memory message. Every check reads numbers or
labels from the page. Screenshots are written under pytest's tmp_path (the final one copied to
``$COURSE_SCREENSHOT`` if set).

In CI (``CI=true``) this test must run: a missing Chromium fails it. Elsewhere it skips when
``/usr/bin/chromium`` is missing. Never run ``playwright install``: the pip wheel carries the
driver, the browser is Debian's ``chromium`` package.
"""
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from course_utils.experiments import plain_label

pytestmark = pytest.mark.browser  # registered in pyproject.toml; select with -m browser

CHROMIUM = "/usr/bin/chromium"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
DASHBOARD_LINE = "from course_utils.dashboard import dashboard; dashboard()"
OOM_CELL = '''import torch
from course_utils.training import train_step
from course_utils.dashboard import dashboard


def step_or_oom(model, optimizer, scaler, micro_batches, dtype=None, max_grad_norm=1.0):
    """The course's step, but batch 64 and more run out of memory, as on a small GPU."""
    if micro_batches[0][0].shape[0] >= 64:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return train_step(model, optimizer, scaler, micro_batches, dtype, max_grad_norm)


dashboard(step_fn=step_or_oom)'''
REPO = Path(__file__).resolve().parents[1]
SERVER_START_S = 60   # JupyterLab answering /api/status
KERNEL_IDLE_S = 60    # kernel started and idle
DASHBOARD_S = 90      # both cells' widgets rendered (imports torch in the kernel)
RUN_S = 90            # one Run click answered at the smoke size (a calibration included)
TIME_WORDS = re.compile(r"\b(faster|slower)\b")


def _need_chromium() -> None:
    """Fail in CI, skip elsewhere, when Chromium or the playwright package is missing."""
    problems = []
    if not Path(CHROMIUM).exists():
        problems.append(f"{CHROMIUM} is missing: install Debian's chromium package "
                        "(apt-get install -y chromium); never `playwright install`")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        problems.append("the python package playwright is missing: pip install playwright "
                        "(the test extra of pyproject.toml)")
    if not problems:
        return
    if IN_CI:
        pytest.fail("CI=true: the browser test must run, but " + "; ".join(problems))
    pytest.skip("; ".join(problems))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on a free port, serving a folder with ``dashboard.ipynb``.

    Yields ``(base_url, token, log_path)``; the server (its whole process group, kernels
    included) is terminated afterwards.
    """
    _need_chromium()  # before starting a server that no browser would visit
    root = tmp_path / "lab"
    root.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(DASHBOARD_LINE))
    nb.cells.append(nbformat.v4.new_code_cell(OOM_CELL))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    nbformat.write(nb, root / "dashboard.ipynb")

    settings = tmp_path / "lab-settings"
    notif = settings / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True)
    (notif / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    workspaces = tmp_path / "lab-workspaces"
    workspaces.mkdir()

    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, COURSE_SIZE="smoke", JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(workspaces),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")])))
    log = tmp_path / "jupyterlab.log"
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
             "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False"],
            cwd=root, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{_log_tail(log)}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer within {SERVER_START_S} s:\n"
                            f"{_log_tail(log)}")
            time.sleep(0.3)
        yield url, token, log
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # the group we started: server + kernels
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a kernel that outlived the server
        except (ProcessLookupError, PermissionError):
            pass


@pytest.fixture
def page():
    """A headless Debian Chromium page (Playwright); browser and driver closed afterwards."""
    _need_chromium()
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update"])
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1100})
            yield context.new_page()
        finally:
            browser.close()


def _run_all_cells(page, attempts: int = 3) -> None:
    """Run both cells (Shift+Enter twice) until the last prompt shows ``[*]`` or ``[n]``: a key
    press that lands while the kernel connection settles is sometimes dropped."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    for _ in range(attempts):
        page.locator(".jp-Cell .jp-InputArea-editor").first.click()
        page.keyboard.press("Shift+Enter")
        page.keyboard.press("Shift+Enter")
        try:
            page.wait_for_function(
                "() => { const p = document.querySelectorAll('.jp-Cell .jp-InputPrompt');"
                " return p.length >= 2 && [...p].slice(0, 2).every("
                "e => /\\[(\\*|\\d+)\\]/.test(e.innerText)); }", timeout=15_000)
            return
        except PlaywrightTimeout:
            continue
    pytest.fail(f"the cells did not start running after {attempts} tries")


class Board:
    """One dashboard on the page, by its CSS hooks (``course-run-button``, ...)."""

    def __init__(self, page, index: int):
        self.page, self.index = page, index
        self.root = page.locator(".course-dashboard").nth(index)

    def js(self, body: str, arg=None):
        """Evaluate ``(root, arg) => {body}`` on this dashboard's element."""
        return self.root.evaluate(f"(root, arg) => {{ {body} }}", arg)

    def text(self, hook: str) -> str:
        return self.js("const e = root.querySelector('.course-' + arg);"
                       " return e ? e.innerText : '';", hook)

    def rows(self) -> list[dict]:
        """The history table: one dict per row, column name -> cell text."""
        return self.js("""
            const t = root.querySelector('table.course-history');
            if (!t) return [];
            const head = [...t.querySelectorAll('thead th')].map(th => th.innerText.trim());
            return [...t.querySelectorAll('tbody tr')].map(tr => Object.fromEntries(
                [...tr.querySelectorAll('td')].map((td, i) => [head[i], td.innerText.trim()])));
        """)

    def chart(self) -> tuple[str, int]:
        """The chart's image source and natural width (0 while nothing is drawn)."""
        return tuple(self.js("const i = root.querySelector('img.course-chart');"
                             " return i && i.complete ? [i.src, i.naturalWidth] : ['', 0];"))

    def set_text(self, hook: str, value) -> None:
        box = self.root.locator(f".course-{hook} input").first
        box.fill(str(value))
        box.press("Enter")

    def set_precision(self, value: str) -> None:
        self.root.locator(".course-precision select").select_option(
            label={"fp32": "fp32", "bf16": "bf16 autocast",
                   "fp16": "fp16 autocast + GradScaler"}[value])

    def wait_preview(self, needle: str) -> None:
        """Wait until the preview (the kernel's answer to the controls) mentions ``needle``."""
        self.page.wait_for_function(
            "([i, s]) => document.querySelectorAll('.course-dashboard')[i]"
            ".querySelector('.course-preview').innerText.includes(s)",
            arg=[self.index, needle], timeout=30_000)

    def run(self, timeout_s: float = RUN_S) -> str:
        """Click Run and wait for the Run's message (a new one: each names its row numbers,
        its refusal or its stop); return the message text."""
        before = self.text("message")
        self.root.locator(".course-run-button").click()
        self.page.wait_for_function(
            "([i, before]) => { const r = document.querySelectorAll('.course-dashboard')[i];"
            " const m = r.querySelector('.course-message').innerText;"
            " return m.trim() && m !== before"
            " && !r.querySelector('.course-run-button').disabled; }",
            arg=[self.index, before], timeout=timeout_s * 1000)
        return self.text("message")


def _number(cell: str) -> float:
    return float(cell.replace(",", ""))


@pytest.mark.timeout(420)
def test_dashboard_in_jupyterlab(lab, page, tmp_path):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    from course_utils.hardware import detect, is_emulated, recommend_precision
    url, token, log = lab
    t0 = time.monotonic()
    page.set_default_timeout(30_000)
    page.goto(f"{url}/lab/tree/dashboard.ipynb?token={token}", timeout=60_000)
    try:
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                               timeout=KERNEL_IDLE_S * 1000)
    except PlaywrightTimeout:
        page.screenshot(path=str(tmp_path / "kernel-not-idle.png"))
        pytest.fail(f"kernel not idle within {KERNEL_IDLE_S} s:\n{_log_tail(log)}")
    _run_all_cells(page)
    try:
        page.wait_for_function("() => document.querySelectorAll('.course-dashboard "
                               ".course-run-button').length == 2", timeout=DASHBOARD_S * 1000)
    except PlaywrightTimeout:
        page.screenshot(path=str(tmp_path / "no-dashboard.png"))
        out = page.locator(".jp-OutputArea").first.inner_text(timeout=5000)
        pytest.fail(f"the dashboards did not render within {DASHBOARD_S} s; output:\n{out}")
    body = page.locator(".jp-Notebook").inner_text()
    assert "Error displaying widget" not in body and "Traceback" not in body, body
    board, oom = Board(page, 0), Board(page, 1)
    assert board.rows() == [] and board.chart()[1] == 0

    # 1. The precision control: the other precision than this machine's recipe, against the
    # recipe as baseline. Its saved activations change dtype and bytes (bf16: 2 bytes of 4).
    hw = detect()
    recipe = recommend_precision(hw).precision
    other = "bf16" if recipe != "bf16" else "fp32"
    board.set_precision(other)
    board.wait_preview(f"Baseline: {recipe}")
    msg = board.run()
    rows = board.rows()
    assert [r["config"] for r in rows] == [f"{recipe} (baseline)", other], (rows, msg)
    assert rows[0]["saved dtypes"].startswith(recipe) and rows[1]["saved dtypes"].startswith(other)
    saved = {r["config"].split()[0]: _number(r["saved MiB"]) for r in rows}
    # 0.80 at the smoke size: activations 0.57x, plus bf16's autocast weight copies
    assert 0.6 < saved["bf16"] / saved["fp32"] < 0.9, rows
    assert not TIME_WORDS.search(rows[1]["time vs baseline"] + msg), (rows, msg)
    if is_emulated(hw, other):
        assert "emulated here" in msg
    src1, width1 = board.chart()
    assert src1 and width1 > 100

    # 2. The checkpoint policy: full, then selective, save fewer bytes than none; the chart is
    # redrawn after each Run (wider: one more pair of bars).
    board.set_precision(recipe)
    policy = board.root.locator(".course-checkpoint input").first
    policy.fill("full")
    policy.press("Enter")
    board.wait_preview(f"{recipe}+full")
    board.run()
    src2, width2 = board.chart()
    assert src2 != src1 and width2 > width1, "the chart was not redrawn after the second Run"
    policy.fill("selective")
    policy.press("Enter")
    board.wait_preview(f"{recipe}+selective")
    page.evaluate("""() => { window.courseProgress = []; const r = document
        .querySelector('.course-dashboard'); window.courseTimer = setInterval(() => {
        const bar = r.querySelector('.course-progress .progress-bar');
        const label = r.querySelector('.course-progress-label');
        window.courseProgress.push([bar ? bar.style.width : '', label ? label.innerText : '']);
        }, 10); }""")
    board.run()
    samples = page.evaluate("() => { clearInterval(window.courseTimer); "
                            "return window.courseProgress; }")
    rows = board.rows()
    assert [r["config"] for r in rows[2:]] == [f"{recipe} (baseline)", plain_label(f"{recipe}+full"),
                                               f"{recipe} (baseline)", plain_label(f"{recipe}+selective")]
    full, selective = (_number(rows[i]["saved MiB"]) / _number(rows[i - 1]["saved MiB"]) for i in (3, 5))
    assert full < 0.5 and selective < 0.9 and full < selective, rows  # 0.21, 0.74 at smoke
    assert all(r["time vs baseline"] in ("1.00x (reference)", "too small to time")
               for r in rows[2:]), rows  # smoke: never faster or slower
    assert board.chart()[1] > width2
    # The progress bar moved during the Run: several widths between empty and full.
    moving = {w for w, label in samples if w not in ("", "0%", "100%") and "step" in label}
    assert len(moving) >= 3, samples[::10]

    # 3. A long Run, seen mid-way and stopped between two steps.
    board.set_text("batch-size", 64)
    board.set_text("seq-len", 256)
    board.wait_preview("16,384 tokens per step")
    board.root.locator(".course-run-button").click()
    page.wait_for_function(
        "() => /step ([3-9]|\\d\\d+) of/.test(document.querySelector('.course-dashboard "
        ".course-progress-label').innerText)", timeout=RUN_S * 1000)
    width = board.js("return root.querySelector('.course-progress .progress-bar').style.width;")
    page.screenshot(path=str(tmp_path / "mid-run.png"), full_page=True)
    assert width not in ("", "0%", "100%"), width
    board.root.locator(".course-stop-button").click()
    page.wait_for_function(
        "() => document.querySelector('.course-dashboard .course-message').innerText"
        ".includes('Stopped')", timeout=RUN_S * 1000)
    assert len(board.rows()) == 6 and "stopped after" in board.text("progress-label")

    # 4. Refusals: a Run predicted to take minutes, an emulated fp16 at this size.
    board.set_text("n-layers", 32)
    board.set_text("seq-len", 512)
    board.wait_preview("32 layers")
    msg = board.run()
    assert "not run" in msg and "would take about" in msg and "run anyway" in msg, msg
    if is_emulated(hw, "fp16"):
        board.set_text("n-layers", 2)
        board.set_precision("fp16")
        board.wait_preview("fp16+selective: 2 layers")
        msg = board.run()
        assert "not run" in msg and "emulated" in msg, msg
    assert len(board.rows()) == 6

    # 5. The out-of-memory message, in the second dashboard.
    oom.set_text("batch-size", 64)
    oom.wait_preview("2,048 tokens per step")
    msg = oom.run()
    assert "ran out of memory" in msg and "Smaller variants" in msg and "still works" in msg
    assert oom.root.locator(".course-message .course-msg-error").count() == 1
    assert oom.chart()[1] > 100

    shot = tmp_path / "dashboard.png"
    page.locator(".course-dashboard").first.scroll_into_view_if_needed()
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    target = os.environ.get("COURSE_SCREENSHOT")
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, target)
        shutil.copy(tmp_path / "mid-run.png", Path(target).with_name("mid-run.png"))
    print(f"browser test: {time.monotonic() - t0:.1f} s in the browser; screenshots {tmp_path}")
