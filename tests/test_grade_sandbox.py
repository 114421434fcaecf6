"""What learner code can reach, with and without the bubblewrap sandbox (course_grade.sandbox).

The probes are test cells of a tiny source notebook: each one *attempts* something learner code
must not do (read the sources, write the class folder or the CSV, reach the grader over loopback,
see the grader's process or environment) and passes only if the attempt succeeds. In the sandbox
every attempt must fail; unsandboxed, the test pins down what that mode does not protect.
Sandbox tests skip only where bubblewrap is missing and CI is unset (CI installs it: .ci/run).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

import course_grade
from course_grade.sandbox import SandboxError, plan_sandbox

ROOT = Path(__file__).resolve().parents[1]
SECRET = "GRADER_TEST_SECRET"  # not COURSE_*: those are passed on to the kernel on purpose
LINGER = "4321.5"  # seconds a probe's detached `sleep` asks for: how the tests find it

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")  # as tests/test_browser.py
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None and not IN_CI,
    reason="bubblewrap (bwrap) is not installed; CI installs it (.ci/run) and runs this",
)


def test_meta(grade_id):
    return {"nbgrader": {"grade": True, "grade_id": grade_id, "points": 1, "locked": True,
                         "solution": False}}


test_meta.__test__ = False


@pytest.fixture
def probe_course(tmp_path, monkeypatch):
    """(source folder, class folder, CSV path, listening loopback port, probe names)."""
    monkeypatch.setenv(SECRET, "s3cret")
    source, folder = tmp_path / "solutions", tmp_path / "class"
    source.mkdir()
    (folder / "bob").mkdir(parents=True)
    victim = folder / "bob" / "01_probe.ipynb"
    victim.write_text("bob's work")
    csv_path = tmp_path / "grades.csv"
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    course_solution = sorted((ROOT / "solutions").glob("*.ipynb"))[0]
    probes = {
        "read_source": f"open({str(source / '01_probe.ipynb')!r}).read()",
        "read_course_solutions": f"open({str(course_solution)!r}).read()",
        "list_class_folder": f"import os\nassert os.listdir({str(folder)!r})",
        "write_class_folder": f"open({str(victim)!r}, 'w').write('overwritten')",
        "write_csv": f"open({str(csv_path)!r}, 'w').write('alice,100')",
        "reach_grader_loopback": "import socket\n"
        f"socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=3).close()",
        "reach_internet": "import socket\n"
        "socket.create_connection(('1.1.1.1', 53), timeout=3).close()",
        "signal_grader_process": f"import os\nos.kill({os.getpid()}, 0)",
        "read_grader_environment": f"assert open('/proc/{os.getpid()}/environ', 'rb').read()",
        "see_other_processes": "import os\n"
        "assert sum(p.isdigit() for p in os.listdir('/proc')) > 5",
        "read_grader_secret": f"import os\nassert os.environ[{SECRET!r}]",
        "write_own_folder": "open('mine.txt', 'w').write('ok')\n"
        "assert open('mine.txt').read() == 'ok'",
        "write_tmp": "import tempfile\nwith tempfile.TemporaryFile() as f:\n    f.write(b'ok')",
        "leave_a_process": "import subprocess\n"
        f"subprocess.Popen(['sleep', '{LINGER}'], start_new_session=True)",
        "course_imports": "import matplotlib.pyplot, numpy, pandas, torch, course_utils\n"
        f"assert course_utils.__file__ == {str(ROOT / 'course_utils' / '__init__.py')!r}",
        "serve_on_localhost": "import socket\n"  # torchrun's rendezvous and gloo do this
        "with socket.create_server(('localhost', 0)) as srv:\n"
        "    socket.create_connection(('localhost', srv.getsockname()[1]), timeout=3).close()\n"
        "assert socket.getaddrinfo(socket.gethostname(), 0)",
        "limits_are_set": "import resource\n"  # --memory 3000 MiB, --timeout 120 s
        "assert resource.getrlimit(resource.RLIMIT_AS) == (3000 << 20, 3000 << 20)\n"
        "assert resource.getrlimit(resource.RLIMIT_CPU)[0] == 2 * 120 + 30",
    }
    cells = [new_code_cell(code, id=name.replace("_", "-"), metadata=test_meta(name))
             for name, code in probes.items()]
    nbformat.write(new_notebook(cells=cells), source / "01_probe.ipynb")
    course_grade.release(source, tmp_path / "exercises")
    shutil.copy(tmp_path / "exercises" / "01_probe.ipynb", folder / "alice.ipynb")
    yield source, folder, csv_path, victim
    server.close()


def lingering() -> list[int]:
    """Processes left by the leave_a_process probe (``sleep LINGER``)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().split(b"\0")[:2] == [
                    b"sleep", LINGER.encode()]:
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def grade_probes(source, folder, csv_path, sandbox):
    result = course_grade.grade([folder / "alice.ipynb"], source, sandbox=sandbox,
                                exclude=[csv_path], timeout=120, memory=3000 << 20)[0]
    assert result.graded, result.error
    return {t.grade_id: t for t in result.tests}


@needs_bwrap
def test_sandboxed_learner_code_reaches_nothing_outside_its_copy(probe_course):
    source, folder, csv_path, victim = probe_course
    tests = grade_probes(source, folder, csv_path, sandbox=True)
    allowed = {"write_own_folder", "write_tmp", "leave_a_process", "limits_are_set",
               "course_imports", "serve_on_localhost"}
    reached = {name for name, test in tests.items() if test.status == "pass"}
    assert reached == allowed, {n: tests[n].message for n in reached ^ allowed}
    assert "No such file or directory" in tests["read_source"].message
    assert "No such file or directory" in tests["read_course_solutions"].message
    assert victim.read_text() == "bob's work" and not csv_path.exists()
    assert "Network is unreachable" in tests["reach_internet"].message
    deadline = time.monotonic() + 5  # the PID namespace dies with the kernel
    while lingering() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not lingering()


def test_unsandboxed_learner_code_reaches_the_graders_files(probe_course):
    """What --no-sandbox does not protect (docs/instructors.md says so): only the environment
    and the working folder are the learner's own."""
    source, folder, csv_path, victim = probe_course
    tests = grade_probes(source, folder, csv_path, sandbox=False)
    survivors = lingering()
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    for name in ("read_source", "read_course_solutions", "write_class_folder", "write_csv",
                 "reach_grader_loopback", "signal_grader_process", "write_own_folder",
                 "limits_are_set"):
        assert tests[name].status == "pass", (name, tests[name].message)
    assert tests["read_grader_secret"].status == "fail"  # a minimal environment in both modes
    assert victim.read_text() == "overwritten"
    assert survivors  # a process that left the kernel's session outlives it


def test_without_bubblewrap_the_grader_says_it_runs_unsandboxed(tmp_path, monkeypatch, capsys):
    source = tmp_path / "solutions"
    source.mkdir()
    cells = [new_code_cell("assert 1 + 1 == 2", id="t", metadata=test_meta("one_plus_one"))]
    nbformat.write(new_notebook(cells=cells), source / "01_one.ipynb")
    course_grade.release(source, tmp_path / "exercises")
    submission = tmp_path / "exercises" / "01_one.ipynb"
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    args = ["grade", str(submission), "--source", str(source)]
    assert course_grade.main(args) == 0
    out, err = capsys.readouterr()
    assert "1/1 points" in out
    assert "bubblewrap (bwrap) is not installed" in err and "UNSANDBOXED" in err
    assert course_grade.main(args + ["--sandbox"]) == 2
    out, err = capsys.readouterr()
    assert "bubblewrap (bwrap) is not installed" in err and "points" not in out


def test_the_sandbox_refuses_to_expose_a_hidden_path():
    hidden = Path(sys.prefix) / "solutions"  # e.g. sources kept inside the Python environment
    with pytest.raises(SandboxError, match="contains"):
        plan_sandbox([hidden], bwrap="/bin/true")
    sandbox = plan_sandbox([ROOT / "solutions"], bwrap="/bin/true")
    assert not any(Path(p) in [ROOT, *ROOT.parents] for p in sandbox.read_only)
