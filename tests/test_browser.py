"""The dashboard in a real browser: JupyterLab + Debian's Chromium driven by Playwright.

A temporary folder gets a one-cell notebook (the dashboard line of lesson 03); JupyterLab serves
it on a free local port; headless Chromium opens it, waits for the kernel, runs the cell, clicks
Run twice and checks that the history table grows and the chart appears. A screenshot is written
under pytest's tmp_path (and copied to ``$COURSE_SCREENSHOT`` if set).

In CI (``CI=true``) this test must run: a missing Chromium fails it. Elsewhere it skips when
``/usr/bin/chromium`` is missing. Never run ``playwright install``: the pip wheel carries the
driver, the browser is Debian's ``chromium`` package.
"""
import json
import os
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

pytestmark = pytest.mark.browser  # registered in pyproject.toml; select with -m browser

CHROMIUM = "/usr/bin/chromium"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
DASHBOARD_LINE = "from course_utils.widgets import dashboard; dashboard()"
REPO = Path(__file__).resolve().parents[1]
SERVER_START_S = 60   # JupyterLab answering /api/status
KERNEL_IDLE_S = 60    # kernel started and idle
DASHBOARD_S = 60      # the cell's widgets rendered (imports torch in the kernel)
RUN_S = 60            # one Run click answered at the smoke size


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


def _run_first_cell(page, attempts: int = 3) -> None:
    """Run the notebook's cell (Ctrl+Enter) until its prompt shows ``[*]`` or ``[n]``: a key
    press that lands while the kernel connection settles is sometimes dropped."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    for _ in range(attempts):
        page.locator(".jp-Cell .jp-InputArea-editor").first.click()
        page.keyboard.press("Control+Enter")
        try:
            page.wait_for_function(
                "() => { const p = document.querySelector('.jp-Cell .jp-InputPrompt');"
                " return p && /\\[(\\*|\\d+)\\]/.test(p.innerText); }", timeout=15_000)
            return
        except PlaywrightTimeout:
            continue
    pytest.fail(f"the cell did not start running after {attempts} tries")


def _history_rows(page) -> int:
    return page.locator(".course-dashboard table.course-history tbody tr").count()


@pytest.mark.timeout(150)
def test_dashboard_in_jupyterlab(lab, page, tmp_path):
    url, token, log = lab
    t0 = time.monotonic()
    page.set_default_timeout(30_000)
    page.goto(f"{url}/lab/tree/dashboard.ipynb?token={token}", timeout=60_000)

    # The kernel must be idle before the cell runs.
    try:
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']",
                               timeout=KERNEL_IDLE_S * 1000)
    except Exception:
        page.screenshot(path=str(tmp_path / "kernel-not-idle.png"))
        pytest.fail(f"kernel not idle within {KERNEL_IDLE_S} s:\n{_log_tail(log)}")

    _run_first_cell(page)

    run = page.locator(".course-dashboard button", has_text="Run").first
    try:
        run.wait_for(state="visible", timeout=DASHBOARD_S * 1000)
    except Exception:
        page.screenshot(path=str(tmp_path / "no-dashboard.png"))
        out = page.locator(".jp-OutputArea").first.inner_text(timeout=5000)
        pytest.fail(f"the dashboard did not render within {DASHBOARD_S} s; cell output:\n{out}")
    body = page.locator(".jp-OutputArea").first.inner_text()
    assert "Error displaying widget" not in body and "Traceback" not in body, body
    assert _history_rows(page) == 0

    # First click: the fp32 baseline and the default precision (one row if that is fp32).
    run.click()
    page.wait_for_function(
        "() => document.querySelectorAll('.course-dashboard table.course-history tbody tr')"
        ".length >= 1", timeout=RUN_S * 1000)
    page.wait_for_function(
        "() => !document.querySelector('.course-dashboard button.mod-primary').disabled",
        timeout=RUN_S * 1000)
    first = _history_rows(page)
    assert first >= 1

    # Second click with full checkpointing: exactly one more row (the baseline is reused).
    policy = page.locator(".course-dashboard input[list]").first  # the policy Combobox
    policy.fill("full")
    policy.press("Enter")
    page.wait_for_function(
        "() => document.querySelector('.course-dashboard .course-msg-info, "
        ".course-dashboard .course-msg-warn') && document.querySelector('.course-dashboard')"
        ".innerText.includes('+full')", timeout=10_000)
    run.click()
    page.wait_for_function(
        f"() => document.querySelectorAll('.course-dashboard table.course-history tbody tr')"
        f".length >= {first + 1}", timeout=RUN_S * 1000)
    assert _history_rows(page) == first + 1
    assert "+full" in page.locator(".course-dashboard table.course-history").inner_text()

    # The chart: an <img> with PNG data, visibly laid out.
    img = page.locator(".course-dashboard img.widget-image").first
    img.wait_for(state="visible", timeout=10_000)
    page.wait_for_function(
        "() => { const i = document.querySelector('.course-dashboard img.widget-image');"
        " return i && i.complete && i.naturalWidth > 100; }", timeout=10_000)
    # The result message comes last in the callback (after the table and the chart).
    page.wait_for_selector(".course-dashboard .course-msg-ok", timeout=RUN_S * 1000)
    assert "run #" in page.locator(".course-dashboard .course-msg-ok").inner_text()

    shot = tmp_path / "dashboard.png"
    page.locator(".course-dashboard").first.scroll_into_view_if_needed()
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    target = os.environ.get("COURSE_SCREENSHOT")
    if target:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, target)
    print(f"browser test: {time.monotonic() - t0:.1f} s in the browser; screenshot {shot}")
