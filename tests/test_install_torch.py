"""`make course`'s torch install (tools/install_torch.py): every branch of the decision with fake
inputs, the fallback where PyTorch's CPU index cannot be reached, what pip resolves here, and the
Makefile's install lines."""
import http.server
import json
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import install_torch  # noqa: E402

from course_utils.colab import _name, read_toml  # noqa: E402

SCRIPT = ROOT / "tools" / "install_torch.py"
SPEC = "torch==2.13.0"


def _never():
    raise AssertionError("the index was probed where no CPU build is wanted")


@pytest.mark.parametrize("system,nvidia,reachable,want", [
    ("Linux", False, True, [("--index-url", install_torch.CPU_INDEX), ()]),
    ("Linux", False, False, [()]),
    ("Linux", True, _never, [()]),
    ("Darwin", False, _never, [()]),
    ("Windows", True, _never, [()]),
])
def test_plan_picks_the_cpu_index_only_on_linux_without_an_nvidia_gpu(system, nvidia, reachable, want):
    probe = reachable if callable(reachable) else (lambda: reachable)
    p = install_torch.plan(SPEC, system, nvidia, probe)
    assert p.attempts == tuple(("install", "--quiet", *extra, SPEC) for extra in want)
    if system == "Linux" and not nvidia and not reachable:
        assert "cannot be reached" in p.reason and "CUDA build" in p.reason
    if system == "Windows":
        assert "WSL or Colab" in p.reason


def test_has_nvidia_looks_for_nvidia_smi_and_the_driver(tmp_path):
    assert not install_torch.has_nvidia(lambda _: None, tmp_path / "missing")
    assert install_torch.has_nvidia(lambda name: f"/usr/bin/{name}", tmp_path / "missing")
    assert install_torch.has_nvidia(lambda _: None, tmp_path)


def test_install_falls_back_to_the_standard_wheel_when_the_cpu_index_fails():
    p = install_torch.plan(SPEC, "Linux", False, lambda: True)
    calls, said = [], []
    code = install_torch.install(p, run=lambda a: calls.append(a) or (1 if "--index-url" in a else 0),
                                 say=said.append)
    assert code == 0 and calls == list(p.attempts)
    assert said[2].startswith("torch: that failed (pip exit status 1)")
    calls.clear()
    assert install_torch.install(p, run=lambda a: calls.append(a) or 0, say=said.append) == 0
    assert calls == [p.attempts[0]]                       # the CPU build installed: no fallback


class _Index(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dry_run(*args):
    r = subprocess.run([sys.executable, str(SCRIPT), SPEC, "--dry-run", "--system", "Linux",
                        "--nvidia", "no", "--timeout", "5", *args],
                       capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


def test_the_command_probes_the_index_and_falls_back_where_it_cannot_be_reached(tmp_path):
    (tmp_path / "simple" / "torch").mkdir(parents=True)
    (tmp_path / "simple" / "torch" / "index.html").write_text("<html></html>")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: _Index(*a, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{server.server_address[1]}/simple"
        out = _dry_run("--index-url", index)
    finally:
        server.shutdown()
    assert out[1:] == [f"would run: pip install --quiet --index-url {index} {SPEC}",
                       f"would run: pip install --quiet {SPEC}"]
    gone = f"http://127.0.0.1:{_closed_port()}/simple"
    out = _dry_run("--index-url", gone)
    assert f"PyTorch's CPU wheel index ({gone}) cannot be reached" in out[0]
    assert out[1:] == [f"would run: pip install --quiet {SPEC}"]
    assert _dry_run("--nvidia", "yes")[1:] == [f"would run: pip install --quiet {SPEC}"]


@pytest.mark.timeout(300)
@pytest.mark.skipif(not sys.platform.startswith("linux") or install_torch.has_nvidia(),
                    reason="the CPU build is the choice on Linux without an NVIDIA GPU only")
def test_what_make_course_installs_here_is_a_cpu_build(tmp_path):
    """The decision as `make course` takes it on this machine (CI: PyTorch's index cannot be
    reached, so the standard install, which pip's find-links answers with a local CPU build),
    resolved by pip without installing: never the CUDA build."""
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, str(SCRIPT), SPEC, "--pip-arg=--dry-run",
                        "--pip-arg=--ignore-installed", "--pip-arg=--no-deps",
                        f"--pip-arg=--report={report}"], capture_output=True, text=True)
    print(r.stdout, r.stderr)
    assert r.returncode == 0
    items = json.loads(report.read_text())["install"]
    versions = {i["metadata"]["name"]: i["metadata"]["version"] for i in items}
    assert versions["torch"].startswith("2.13.0") and versions["torch"].endswith("+cpu")
    assert not [n for n in versions if n.startswith("nvidia")]


def test_make_course_installs_only_the_runtime_and_torch_first(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("needs make")
    venv = tmp_path / "v"   # a venv that does not exist: make prints the whole recipe
    course = subprocess.run(["make", "-n", "setup", f"VENV={venv}"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    installs = [line for line in course.splitlines() if "pip install" in line or "install_torch" in line]
    assert installs[1] == (f'{venv}/bin/python -c "import torch" 2>/dev/null || '
                           f'{venv}/bin/python tools/install_torch.py "{SPEC}"')   # after pip itself
    assert installs[2].endswith('-e ".[lab,hf]"') and len(installs) == 3
    assert "nbstripout --install --attributes .gitattributes" in course
    full = subprocess.run(["make", "-n", "setup-test", f"VENV={venv}"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    assert '-e ".[lab,hf,grade,test]"' in full
    project = read_toml(ROOT / "pyproject.toml")["project"]
    names = [_name(s) for s in project["dependencies"]]
    assert "transformers" not in names and "torch" in names
    extras = {k: [_name(s) for s in v] for k, v in project["optional-dependencies"].items()}
    assert extras["hf"] == ["transformers"]
    assert {"jupyterlab", "ipykernel", "nbstripout"} <= set(extras["lab"])
    assert not {"pytest", "nbval", "playwright", "ruff"} & set(extras["lab"] + names)
    assert {"pytest", "pytest-xdist", "nbval", "nbstripout", "playwright", "ruff"} <= set(extras["test"])


def test_environment_yml_asks_pip_for_the_cpu_build_and_the_same_torch():
    text = (ROOT / "environment.yml").read_text()
    assert f"- --extra-index-url {install_torch.CPU_INDEX}" in text
    make = (ROOT / "Makefile").read_text()
    assert f"TORCH_SPEC ?= {SPEC}" in make and f"- {SPEC}" in text
