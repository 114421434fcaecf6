"""What learner code can reach, with and without the bubblewrap sandbox (course_grade.sandbox).

The probes are test cells of a tiny source notebook: each one *attempts* something learner code
must not do (read the sources, write the class folder or the CSV, reach the grader over loopback,
see the grader's process or environment) and passes only if the attempt succeeds. In the sandbox
every attempt must fail; unsandboxed, the test pins down what that mode does not protect.
Sandbox tests skip only where bubblewrap is missing and CI is unset (CI installs it: .ci/run).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
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


# ------------------------------------------------- a class is never graded unsandboxed by accident
FORGED = "== class/zz_honest.ipynb (01_one.ipynb): 0/1 points"  # a line the attacker forges
# Issue 27's two attacks in one submission that never answers: write a forged result line into
# the grader's own output through /proc, then stop the grader with SIGTERM and wait for it to die.
ATTACK = (
    "import os, signal, time\n"
    "with open(f'/proc/{os.getppid()}/fd/1', 'w') as grader_out:\n"
    f"    grader_out.write({FORGED!r} + '\\n')\n"
    "os.kill(os.getppid(), signal.SIGTERM)\n"
    "time.sleep(60)\n"
    "def answer():\n"
    "    return 2"
)


def one_course(root: Path) -> tuple[Path, Path]:
    """A course folder (``course/solutions``, ``course/exercises``) with one 1-point question
    (``answer()`` returns 2); returns (source folder, released exercise)."""
    source = root / "course" / "solutions"
    source.mkdir(parents=True)
    cells = [new_code_cell("def answer():\n    ### BEGIN SOLUTION\n    return 2\n"
                           "    ### END SOLUTION", id="answer",
                           metadata={"nbgrader": {"solution": True, "grade": False,
                                                  "locked": False, "grade_id": "answer-code"}}),
             new_code_cell("assert answer() == 2", id="t", metadata=test_meta("answer"))]
    nbformat.write(new_notebook(cells=cells), source / "01_one.ipynb")
    course_grade.release(source, root / "course" / "exercises")
    return source, root / "course" / "exercises" / "01_one.ipynb"


def a_class(root: Path, attacker: str = "def answer():\n    return 2") -> tuple[Path, Path]:
    """(source, class folder): an attacker's submission first, an honest one after it, kept
    outside the course folder as the instructor guide asks."""
    source, released = one_course(root)
    folder = root / "class"
    folder.mkdir()
    for name, code in (("aa_attacker.ipynb", attacker), ("zz_honest.ipynb", "def answer():\n    return 2")):
        nb = nbformat.read(released, 4)
        nb.cells[0].source = code
        nbformat.write(nb, folder / name)
    return source, folder


def grade_process(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    """``python -m course_grade ARGS`` in a child process (an attack on the grader's process hits
    that child, never pytest), with ``PATH`` replaced when given."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([sys.executable, "-m", "course_grade", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_class_without_a_sandbox_is_refused_before_anything_runs(tmp_path, monkeypatch):
    source, folder = a_class(tmp_path)
    csv_path = tmp_path / "grades.csv"
    common = ["grade", str(folder), "--source", str(source), "--csv", str(csv_path)]
    refused = grade_process(*common, path=str(tmp_path))  # no bwrap on PATH
    assert refused.returncode == 2 and refused.stdout == ""
    said = refused.stderr
    assert "bubblewrap (bwrap) is not installed" in said and "nothing was graded" in said
    assert "sudo apt-get install bubblewrap" in said and "--no-sandbox" in said
    assert "Traceback" not in said
    assert not csv_path.exists() and not csv_path.with_suffix(".jsonl").exists()  # nothing lost
    graded = grade_process(*common, "--no-sandbox", path=str(tmp_path))  # the explicit risk
    assert graded.returncode == 0 and "UNSANDBOXED" in graded.stderr
    assert graded.stdout.count("1/1 points") == 2 and csv_path.exists()
    # One notebook that is not the learner's own (outside the course folder): refused as well;
    # the Python API the same way, before any kernel starts.
    one = grade_process("grade", str(folder / "zz_honest.ipynb"), "--source", str(source),
                        path=str(tmp_path))
    assert one.returncode == 2 and "--no-sandbox" in one.stderr
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxError, match="sandbox=False"):
        course_grade.grade([folder], source)


def test_a_learner_checking_their_own_notebook_is_not_stopped(tmp_path):
    """Own: one notebook, the learner's file, inside the course folder (the one holding the
    sources), as their exercises/ copy is."""
    source, released = one_course(tmp_path)
    nb = nbformat.read(released, 4)
    nb.cells[0].source = "def answer():\n    return 2"
    nbformat.write(nb, released)
    done = grade_process("grade", str(released), "--source", str(source), path=str(tmp_path))
    assert done.returncode == 0 and "1/1 points" in done.stdout
    assert "your own notebook runs UNSANDBOXED" in done.stderr
    assert "sudo apt-get install bubblewrap" in done.stderr


def test_without_a_sandbox_the_attacks_stop_the_class_and_forge_lines(tmp_path):
    """What --no-sandbox exposes (docs/instructors.md): issue 27's two attacks succeed."""
    source, folder = a_class(tmp_path, ATTACK)
    done = grade_process("grade", str(folder), "--source", str(source), "-j", "1",
                         "--no-sandbox", "--cell-timeout", "30")
    assert done.returncode == 128 + signal.SIGTERM
    assert FORGED in done.stdout  # the attacker's line, in the grader's own output
    assert "stopped by SIGTERM: graded and kept: 0; not graded: 2" in done.stderr


@needs_bwrap
def test_in_the_sandbox_the_attacks_leave_the_class_graded(tmp_path):
    source, folder = a_class(tmp_path, ATTACK)
    done = grade_process("grade", str(folder), "--source", str(source), "-j", "1", "--json",
                         "--cell-timeout", "5")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("sandbox: bubblewrap")
    attacker, honest = json.loads(done.stdout)
    assert honest["graded"] and honest["score"] == honest["max_score"] == 1
    assert attacker["graded"] and attacker["score"] == 0
    assert any("timed out" in note for note in attacker["issues"]), attacker["issues"]
    assert FORGED not in done.stdout + done.stderr  # no line of theirs in the grader's output
