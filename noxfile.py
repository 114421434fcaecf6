"""The support matrix: the course on the stacks its learners have, not only on ours.

``make test-matrix`` (or ``nox`` with this file) runs, in one fresh virtual environment per stack,
the lessons at the smoke size (nbval), the exercise solutions through the grader (each must score
full marks), the dashboard's widget tests, the engine's tests and the saved-tensor meter's tests,
with ``COURSE_STRICT_ESTIMATES=1`` (a measurement that differs from the analytic estimate fails).
Each session writes ``results/support-matrix/<session>.json``: the versions it ran, the command,
and what passed and failed. ``.ci/run`` keeps testing the main stack only (``make test``).

Stacks (``nox -l`` lists them):

* ``colab``: Google Colab's GPU runtime as published mid-2026 (Python 3.12, torch 2.11,
  ipywidgets 7.7.1, ipykernel 6.17.1, IPython 7.34, transformers 5.9). torch is PyPI's
  standard wheel, run here on a CPU.
* ``floor``: the lowest versions ``pyproject.toml`` declares (Python 3.10, torch 2.7: lesson 04
  runs FSDP2's public ``fully_shard`` (new in 2.6) on CPU ranks, which needs the CPU stream's
  ``record_event`` (new in 2.7; torch 2.6 fails inside ``foreach_all_gather``)).
* ``newest``: the newest torch on PyPI when this was written (2.15) on Python 3.13.

PyPI's torch wheels carry CUDA libraries (about 3 GB per stack); nothing here is run by CI.
"""
from __future__ import annotations

import json
import os
import platform
import tempfile
import xml.etree.ElementTree as ET
from datetime import date
from pathlib import Path

import nox

ROOT = Path(__file__).parent
OUT = ROOT / "results" / "support-matrix"

STACKS = {
    "colab": {"python": "3.12", "torch": "2.11.0",
              "pins": ["ipywidgets==7.7.1", "ipykernel==6.17.1", "ipython==7.34.0",
                       "transformers==5.9.0"]},
    "floor": {"python": "3.10", "torch": "2.7.1", "pins": []},
    "newest": {"python": "3.13", "torch": "2.15.0", "pins": []},
}

#: What every stack runs (pytest node ids and folders, from the repository root).
TESTS = ["notebooks", "ko/notebooks", "tests/test_saved_tensors.py",
         "tests/test_checkpointing.py", "tests/test_measure.py", "tests/test_training.py",
         "tests/test_cli.py", "tests/test_dashboard.py",
         # what this batch added, where torch versions differ: the chunked loss, the inf/NaN
         # guards, the fp32 matmul API (torch >= 2.9 and the route before it), the block formats,
         # the stand-in and CUDA paths on a fake torch.cuda, the Korean edition
         "tests/test_chunked_loss.py", "tests/test_nonfinite.py", "tests/test_fp32_matmul.py",
         "tests/test_block_formats.py", "tests/test_stand_in.py", "tests/test_cuda_paths.py",
         "tests/test_i18n.py",
         "tests/test_grading.py::test_each_solution_scores_full_marks"]

VERSIONS = """
import importlib.metadata as md, json, platform, sys, torch
names = ["torch", "ipywidgets", "ipykernel", "ipython", "transformers", "jupyter_client",
         "nbclient", "pandas", "numpy", "matplotlib"]
out = {"python": platform.python_version()}
for n in names:
    try:
        out[n] = md.version(n)
    except md.PackageNotFoundError:
        out[n] = None
out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
print(json.dumps(out))
"""

nox.options.sessions = list(STACKS)
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True  # a stack that cannot run fails, never "skipped"


def _junit_summary(path: Path) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = {k: sum(int(s.get(k, 0)) for s in suites)
              for k in ("tests", "failures", "errors", "skipped")}
    failed, skipped = [], []
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        for tag in ("failure", "error"):
            el = case.find(tag)
            if el is not None:
                failed.append({"test": name, "message": (el.get("message") or "")[:400]})
        el = case.find("skipped")
        if el is not None:
            skipped.append({"test": name, "reason": (el.get("message") or "")[:200]})
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {"counts": counts, "failed": failed, "skipped": skipped}


def _stack(name: str):
    spec = STACKS[name]

    @nox.session(name=name, python=spec["python"])
    def run(session: nox.Session) -> None:
        # torch first, pinned (the package never pins it), then the course and the stack's pins
        # in one resolution, so that nothing upgrades what the stack fixes.
        session.install(f"torch=={spec['torch']}")
        session.install("-e", ".[lab,hf,grade,test]", f"torch=={spec['torch']}", *spec["pins"])
        printed = session.run("python", "-c", VERSIONS, silent=True)
        if printed is None:  # nox --install-only: nothing runs
            return
        versions = json.loads(printed.strip().splitlines()[-1])
        OUT.mkdir(parents=True, exist_ok=True)
        # Not session.create_tmp(): it points TMPDIR into the environment, which the grader's
        # sandbox exposes to learner code, so the grader (rightly) refuses to grade from there.
        junit = Path(tempfile.mkdtemp(prefix=f"matrix-{name}-")) / "junit.xml"
        env = {"COURSE_SIZE": "smoke", "COURSE_STRICT_ESTIMATES": "1", "OMP_NUM_THREADS": "1"}
        args = ["-n", "2", "--dist", "loadscope", f"--junitxml={junit}", *TESTS]
        command = "COURSE_SIZE=smoke COURSE_STRICT_ESTIMATES=1 OMP_NUM_THREADS=1 pytest " + " ".join(
            a for a in args if not a.startswith("--junitxml"))
        try:
            session.run("python", "-m", "pytest", *args, env=env)
        finally:
            record = {"stack": name, "date": date.today().isoformat(),
                      "declared": spec, "versions": versions,
                      "machine": {"cpu": platform.processor() or platform.machine(),
                                  "cores": os.cpu_count()},
                      "command": f"nox -s {name}  # runs: {command}",
                      **(_junit_summary(junit) if junit.exists() else {"counts": None})}
            (OUT / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
            session.log(f"wrote {OUT / f'{name}.json'}: {record.get('counts')}")
    return run


for _name in STACKS:
    globals()[f"stack_{_name}"] = _stack(_name)
