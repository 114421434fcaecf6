"""A maintainer's tool: the "Open in Colab" badges, the setup cell and the Colab metadata of every
notebook, the README's generated blocks, and the release check, all from ``pyproject.toml``.

The repository URL is declared once (``[project.urls] Repository``) and the release once
(``[project] version``). Run from the repository root::

    python tools/colab_cells.py                  # rewrite badges, setup cells, metadata, README
    python tools/colab_cells.py --check          # exit 1 and say what disagrees (tests run it)
    python tools/colab_cells.py --release-check  # exit 1 unless a release may go out (below)
    python tools/colab_cells.py --t4             # print the T4 estimate

It rewrites ``notebooks/*.ipynb`` and ``solutions/*.ipynb`` (``exercises/`` is generated from
``solutions/`` by ``course-grade release``, so run that next; an exercise's badge points at
``exercises/``) and the generated blocks of ``README.md``. In each notebook it puts the badge
under the title (the first markdown cell), the setup cell (id ``colab-setup``) after the
learning objectives, before any other code, and Colab's GPU-runtime metadata (``accelerator``,
``colab.gpuType``) in the notebook's metadata; it keeps every cell id and writes notebooks the
way nbstripout does, and running it twice changes nothing.

**The ref.** The setup cell clones the tag ``v<version>`` (``[project] version``), not ``main``:
a notebook saved to Drive weeks ago fetches the code it was written for. A learner overrides it
with ``%env COURSE_REF=main`` (or another branch or tag). So a release is: set the version,
run this tool and ``course-grade release``, commit, ``git tag v<version>``, run
``--release-check``, push the commit and the tag.

**The placeholder.** Until a maintainer sets the real URL, pyproject.toml holds
`PLACEHOLDER_URL`, a name nobody owns: the setup cell gets ``COURSE_URL = None`` and never
clones it (it names the three ways to run without a public repository instead), and
``--release-check`` fails. The learner's side of the cell is ``course_utils/colab.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from course_utils.colab import read_toml

ROOT = Path(__file__).resolve().parents[1]
SETUP_ID = "colab-setup"
#: The branch the badges open (the setup cell pins the code to the release tag instead).
BRANCH = "main"
#: What pyproject.toml holds until a maintainer sets the real repository: nobody owns it.
PLACEHOLDER_URL = "https://github.com/amp-course/amp-checkpointing-course"
#: Colab's notebook metadata for a GPU runtime (what Colab writes after *Runtime > Change
#: runtime type > T4 GPU*): the notebook opens asking for that runtime.
COLAB_METADATA = {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []}}
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
_BADGE_RE = re.compile(r"\[!\[Open In Colab\]\(https://colab\.research\.google\.com/assets/"
                       r"colab-badge\.svg\)\]\([^)\s]*\)")
_COLAB_LINK_RE = re.compile(r"colab\.research\.google\.com/github/([\w.-]+/[\w.-]+?)/blob/")
_NOTEBOOK_DIRS = ("notebooks", "solutions")
_TOOL = "python tools/colab_cells.py"


# --------------------------------------------------------------------------- the one URL

def repo_url(root: str | os.PathLike = ROOT) -> str:
    """The course's repository URL: ``[project.urls] Repository`` in ``root/pyproject.toml``
    (possibly `PLACEHOLDER_URL`: see `is_placeholder`).

    Raises:
        ValueError: no pyproject.toml there, no such entry, or not a ``https://github.com/OWNER/NAME``
            URL (Colab opens notebooks from GitHub).
    """
    path = Path(root) / "pyproject.toml"
    if not path.is_file():
        raise ValueError(f"{path} not found: run this from a checkout of the course.")
    url = read_toml(path).get("project", {}).get("urls", {}).get("Repository")
    if not url:
        raise ValueError(f"{path} declares no [project.urls] Repository = \"https://github.com/...\".")
    _owner_name(url)
    return url


def is_placeholder(url: str) -> bool:
    """True for `PLACEHOLDER_URL` (with or without ``.git`` or a trailing slash)."""
    return _owner_name(url).lower() == _owner_name(PLACEHOLDER_URL).lower()


def release_ref(root: str | os.PathLike = ROOT) -> str:
    """The git ref the setup cells clone: ``v`` + ``[project] version`` of ``root/pyproject.toml``.

    Raises:
        ValueError: pyproject.toml declares no version.
    """
    version = read_toml(Path(root) / "pyproject.toml").get("project", {}).get("version")
    if not version:
        raise ValueError(f"{Path(root) / 'pyproject.toml'} declares no [project] version.")
    return f"v{version}"


def _owner_name(url: str) -> str:
    m = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?", url)
    if not m:
        raise ValueError(f"repository URL {url!r} is not https://github.com/OWNER/NAME: Colab "
                         "badges need a GitHub repository.")
    return f"{m.group(1)}/{m.group(2)}"


def colab_url(url: str, path: str, branch: str = BRANCH) -> str:
    """The Colab address that opens ``path`` (relative to the repository root) of ``url``."""
    return f"https://colab.research.google.com/github/{_owner_name(url)}/blob/{branch}/{path}"


def badge(url: str, path: str) -> str:
    """The "Open in Colab" badge (markdown) for ``path`` in repository ``url``."""
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(url, path)})"


def badge_target(path: str | os.PathLike) -> str:
    """Where a notebook's badge points, relative to the root: a solution's at its exercise
    (learners get the exercise, generated from it); a lesson's and an exercise's at themselves."""
    p = Path(path)
    folder = "exercises" if p.parent.name == "solutions" else p.parent.name
    return f"{folder}/{p.name}"


# --------------------------------------------------------------------------- the setup cell

# The cell runs in a fresh kernel with nothing but the standard library; its helper names start
# with an underscore so that they stay out of the lesson's way. {{ and }} are literal braces.
#: The setup cell's one visible line: Colab's form view (``cellView: form``) shows the ``#@title``
#: and hides the code; JupyterLab collapses the source (``jupyter.source_hidden``) to the same line.
SETUP_TITLE = ("#@title Setup: run this cell first (fetches the course where it is missing, then names "
               "this machine's recipe)")
SETUP_METADATA = {"cellView": "form", "jupyter": {"source_hidden": True}}

_SETUP_TEMPLATE = SETUP_TITLE + '''
# Setup: run this cell first. Where course_utils is missing (a fresh Colab runtime) it fetches the
# course, makes it importable in this kernel (no restart needed) and installs only what is missing;
# it never reinstalls torch or ipywidgets. Elsewhere it prints this machine's hardware and recipe.
# It fetches the course from COURSE_SOURCE if set (%env COURSE_SOURCE=...: a git URL, a folder such
# as a Drive folder, the course zip or a wheel from `make wheel`), else from a course zip or wheel
# uploaded next to this notebook, else it clones COURSE_URL at COURSE_REF, the release this notebook
# was written for (%env COURSE_REF=main for the newest code).
import glob
import importlib.util
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import zipfile

COURSE_URL = {url}  # generated from pyproject.toml{url_note}
COURSE_REF = os.environ.get("COURSE_REF", "{ref}")
_HOW = """
To run the course without a public repository, give it to this cell in one of three ways, then
run this cell again:
  1. The course zip (from your instructor, or `make zip` in a copy of the course): upload it with
     the Files pane (the folder icon on Colab's left bar); it lands in /content, next to this notebook.
  2. A Drive folder: put the course's folder in your Google Drive, mount Drive
     (from google.colab import drive; drive.mount("/content/drive")), then run
     %env COURSE_SOURCE=/content/drive/MyDrive/{folder}
  3. A wheel (`make wheel` in a copy of the course writes dist/course_utils-<version>-py3-none-any.whl):
     upload it like the zip.
A fork or another copy online: %env COURSE_SOURCE=https://github.com/<you>/<fork>, and set
COURSE_REF (%env COURSE_REF=<a branch or tag>) to clone another ref than {ref}."""


class _SetupStopped(Exception):  # shown as its message alone, without a traceback
    def _render_traceback_(self):
        return [str(self)]


def _course_in_zip(path):  # the folder inside the zip that holds course_utils/, or None
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as z:
        tops = [n[:-len("course_utils/__init__.py")] for n in z.namelist()
                if n.endswith("course_utils/__init__.py") and n.count("/") <= 2]
    return min(tops, key=len) if tops else None


_source = None
if importlib.util.find_spec("course_utils") is None:
    _here = os.getcwd()  # inside a copy of the course (notebooks/ or its root)? use that copy
    _source = next((d for d in (_here, os.path.dirname(_here))
                    if os.path.isfile(os.path.join(d, "course_utils", "__init__.py"))), None)
    _checkout = os.path.abspath("{folder}")
    if _source is None and os.path.isfile(os.path.join(_checkout, "course_utils", "__init__.py")):
        print(f"using the course fetched earlier into {{_checkout}} (delete it to fetch again)")
        _source = _checkout
    if _source is None:
        _uploads = [p for p in sorted(glob.glob("*.zip")) if _course_in_zip(p) is not None]
        _uploads += sorted(glob.glob("course_utils-*.whl"))
        _from = os.environ.get("COURSE_SOURCE") or (_uploads[-1] if _uploads else COURSE_URL)
        if _from is None:
            raise _SetupStopped("This notebook names no public repository to fetch the course "
                                "from (pyproject.toml's URL is still a placeholder), and no course "
                                "zip or wheel was uploaded next to it." + _HOW)
        elif "://" in _from or _from.startswith("git@"):
            print(f"fetching the course: git clone --depth=1 --branch {{COURSE_REF}} {{_from}} {{_checkout}}")
            _r = subprocess.run(["git", "clone", "--quiet", "--depth=1", "--branch", COURSE_REF,
                                 _from, _checkout], capture_output=True, text=True,
                                env=dict(os.environ, GIT_TERMINAL_PROMPT="0"))  # never ask
            if _r.returncode != 0:
                _why = [line for line in _r.stderr.splitlines() if line.startswith("fatal:")]
                raise _SetupStopped(f"git clone of {{_from}} at {{COURSE_REF}} failed "
                                    f"({{(_why or [_r.stderr.strip()])[0]}}). The repository may be "
                                    f"private, unpublished or unreachable, or have no {{COURSE_REF}}."
                                    + _HOW)
            _source = _checkout
        elif not os.path.exists(_from):
            raise _SetupStopped(f"COURSE_SOURCE={{_from}} does not exist (a Drive folder: mount "
                                "Drive first)." + _HOW)
        elif _from.endswith(".whl"):
            _source = _from
        elif _from.endswith(".zip"):
            _top = _course_in_zip(_from)
            if _top is None:
                raise _SetupStopped(f"{{_from}} is not the course zip: no course_utils/ in it." + _HOW)
            print(f"unpacking the course: {{_from}} -> {{_checkout}}")
            with zipfile.ZipFile(_from) as _z:
                _z.extractall(_checkout + ".unzip")
            shutil.move(os.path.join(_checkout + ".unzip", _top), _checkout)
            shutil.rmtree(_checkout + ".unzip", ignore_errors=True)
            _source = _checkout
        elif os.path.isfile(os.path.join(_from, "course_utils", "__init__.py")):
            print(f"copying the course: {{_from}} -> {{_checkout}}")
            shutil.copytree(_from, _checkout, ignore=shutil.ignore_patterns(".git", "*.egg-info"))
            _source = _checkout
        else:
            raise _SetupStopped(f"COURSE_SOURCE={{_from}} holds no course_utils/: not the course."
                                + _HOW)
    # Install what is missing (colab.py needs only the standard library), then import.
    if _source.endswith(".whl"):
        with zipfile.ZipFile(_source) as _z:
            _colab = _z.extract("course_utils/colab.py", tempfile.mkdtemp())
    else:
        _colab = os.path.join(_source, "course_utils", "colab.py")
        sys.path.insert(0, _source)
    runpy.run_path(_colab)["install_missing"](_source)
    importlib.invalidate_caches()
importlib.import_module("course_utils.colab").finish_setup(_source)
'''


def setup_cell_source(url: str, ref: str) -> str:
    """The setup cell's code: the repository ``url`` written in (``None`` for `PLACEHOLDER_URL`:
    the cell never clones it) and the git ``ref`` it clones (`release_ref`)."""
    folder = _owner_name(url).split("/")[1]
    if is_placeholder(url):
        literal, note = "None", " (its URL is a placeholder: no public repository yet)"
    else:
        literal, note = json.dumps(url), ""
    return _SETUP_TEMPLATE.format(url=literal, url_note=note, ref=ref, folder=folder)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else str(source)


def _with_badge(text: str, line: str) -> str:
    if _BADGE_RE.search(text):
        return _BADGE_RE.sub(lambda _: line, text, count=1)
    lines = text.split("\n")
    at = next((i + 1 for i, s in enumerate(lines) if s.startswith("# ")), 0)
    return "\n".join(lines[:at] + (["", line] if at else [line, ""]) + lines[at:])


def apply_to_notebook(nb: dict, url: str, target: str, ref: str) -> dict:
    """Return ``nb`` (a notebook as JSON) with the badge for ``target`` under its title, the
    setup cell (cloning ``ref``) first among its code cells, after the learning objectives, and
    `COLAB_METADATA` in its metadata. The setup cell is collapsed to its ``#@title`` line
    (`SETUP_METADATA`: Colab's form view and JupyterLab's hidden source).

    Existing badges and setup cells are rewritten in place (their ids kept); every other cell is
    kept as it is, and so is every other metadata key. ``nb`` is not modified.

    Raises:
        ValueError: the notebook has no markdown cell for the badge, or two setup cells.
    """
    nb = json.loads(json.dumps(nb))
    cells = nb["cells"]
    title = next((c for c in cells if c["cell_type"] == "markdown"), None)
    if title is None:
        raise ValueError("no markdown cell to put the Colab badge in: start with a title cell.")
    line = badge(url, target)
    for c in cells:  # one badge, in the title cell
        if c is not title and c["cell_type"] == "markdown" and _BADGE_RE.search(_text(c["source"])):
            c["source"] = _lines(_BADGE_RE.sub("", _text(c["source"])).strip("\n"))
    title["source"] = _lines(_with_badge(_text(title["source"]), line))

    setups = [i for i, c in enumerate(cells) if c.get("id") == SETUP_ID]
    if len(setups) > 1:
        raise ValueError(f"{len(setups)} cells have the id {SETUP_ID!r}; keep one.")
    cell = cells.pop(setups[0]) if setups else {"id": SETUP_ID, "metadata": {}}
    cell.update(cell_type="code", source=_lines(setup_cell_source(url, ref)), outputs=[],
                execution_count=None)
    cell.setdefault("metadata", {}).update(json.loads(json.dumps(SETUP_METADATA)))
    first_code = next((i for i, c in enumerate(cells) if c["cell_type"] == "code"), len(cells))
    objectives = next((i for i, c in enumerate(cells[:first_code])
                       if "objective" in _text(c["source"]).lower()), None)
    cells.insert(first_code if objectives is None else objectives + 1, cell)

    meta = nb.setdefault("metadata", {})
    meta["accelerator"] = COLAB_METADATA["accelerator"]
    meta.setdefault("colab", {}).update(COLAB_METADATA["colab"])
    return nb


def _dumps(nb: dict) -> str:
    # nbformat.write's layout (indent 1, sorted keys, trailing newline), as nbstripout writes.
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------- README blocks

def _block(text: str, name: str, body: str) -> str:
    start, end = f"<!-- {name}: generated by {_TOOL} -->", f"<!-- /{name} -->"
    pattern = re.compile(r"<!-- " + re.escape(name) + r": generated by [^>]*-->.*?"
                         + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"README.md has no block {start!r} ... {end!r} to fill.")
    return pattern.sub(lambda _: f"{start}\n{body}\n{end}", text, count=1)


def _badge_table(url: str, root: Path) -> str:
    rows = ["| notebook | open it on Colab |", "|---|---|"]
    for folder in ("notebooks", "exercises"):
        for p in sorted((root / folder).glob("[0-9][0-9]_*.ipynb")):
            rel = f"{folder}/{p.name}"
            rows.append(f"| [`{rel}`]({rel}) | {badge(url, rel)} |")
    return "\n".join(rows)


# --------------------------------------------------------------------------- T4 estimate

@dataclass(frozen=True)
class GPUSpec:
    """Published peak figures of a GPU (the vendor's datasheet) and the fraction of them a
    training step of this size reaches (an assumption, stated where the estimate is shown)."""

    name: str
    fp16_tensor_tflops: float
    fp32_tflops: float
    bandwidth_gbs: float
    memory_gib: float
    fp16_efficiency: float = 0.35
    fp32_efficiency: float = 0.55
    bandwidth_efficiency: float = 0.7


#: NVIDIA T4 datasheet: 65 TFLOPS fp16 (tensor cores), 8.1 TFLOPS fp32, 320 GB/s, 16 GB (Colab
#: shows 15 GiB usable). Its fp16 efficiency (35 %) is about the most a T4 reaches: a 4096^3 fp16
#: cuBLAS matmul sustains about 24 TFLOPS (37 %) under its 70 W power cap (NVIDIA developer forum,
#: "About GPU peak performance", thread 264462), so the step times estimated are lower bounds
#: (results/gpu-budget.md).
T4 = GPUSpec("Tesla T4", fp16_tensor_tflops=65.0, fp32_tflops=8.1, bandwidth_gbs=320.0,
             memory_gib=15.0)


def t4_estimate(size: str = "t4", gpu: GPUSpec = T4):
    """Estimated step time and peak memory of the configurations a T4 runs, from FLOPs and bytes.

    Step time = FLOPs / (peak x efficiency) + bytes moved / (bandwidth x
    ``bandwidth_efficiency``); bytes moved = 40 bytes per parameter (fp32 weights read in forward
    and backward, gradients written, AdamW reading and writing weights and both moments) + the
    saved tensors written once and read once, twice over for their gradients. Full checkpointing
    adds one forward (a third of the FLOPs); selective, a sixth. bf16 is emulated on a T4 (fp32
    arithmetic), so it is estimated as fp32; the course refuses to time it there. Peak memory
    comes from `course_utils.memory_model.estimate`. Returns a DataFrame, one row per
    configuration (``configuration``, ``step_ms``, ``peak_GiB``, ``in_ladder``: timed in the
    T4's ladder).
    """
    import pandas as pd

    from course_utils.config import config_for, step_flops
    from course_utils.memory_model import estimate
    from course_utils.terms import GiB

    base = config_for(size, device="cpu")
    rows = []
    for label, precision, policy in [("fp32", "fp32", "none"),
                                     ("fp16 + GradScaler", "fp16", "none"),
                                     ("fp16 + full checkpointing", "fp16", "full"),
                                     ("fp16 + selective checkpointing", "fp16", "selective"),
                                     ("bf16 (emulated on a T4: refused)", "bf16", "none")]:
        cfg = base.replace(precision=precision, checkpoint=policy)
        est = estimate(cfg)
        flops = step_flops(cfg) * {"none": 1.0, "full": 4 / 3, "selective": 7 / 6}[policy]
        tflops = (gpu.fp16_tensor_tflops * gpu.fp16_efficiency if precision == "fp16"
                  else gpu.fp32_tflops * gpu.fp32_efficiency)
        moved = 40 * est.n_parameters + 4 * est.saved_total
        step_s = (flops / (tflops * 1e12)
                  + moved / (gpu.bandwidth_gbs * 1e9 * gpu.bandwidth_efficiency))
        rows.append({"configuration": label, "step_ms": 1e3 * step_s,
                     "peak_GiB": est.peak_allocated / GiB, "in_ladder": precision != "bf16"})
    df = pd.DataFrame(rows)
    df.attrs.update(size=size, gpu=gpu, tokens=base.tokens_per_step,
                    shape=f"{base.n_layers} layers, d_model {base.d_model}, "
                          f"seq {base.seq_len}, batch {base.batch_size}",
                    cpu_gflop=step_flops(config_for("cpu", device="cpu")) / 1e9,
                    gflop=step_flops(base) / 1e9)
    return df


def _t4_block(size: str = "t4") -> str:
    from course_utils.step_timing import default_budget_s, steps_for_budget

    df = t4_estimate(size)
    g, budget = df.attrs["gpu"], default_budget_s(size)
    rows = ["| configuration | est. step time | est. peak memory |", "|---|---|---|"]
    rows += [f"| {r.configuration} | {r.step_ms:.0f} ms | {r.peak_GiB:.2f} GiB |"
             for r in df.itertuples()]
    ladder = df[df.in_ladder]
    round_s = ladder.step_ms.sum() / 1e3
    rounds = steps_for_budget(round_s, budget)
    total = rounds * round_s + 2 * round_s  # + a warm-up and a memory step per configuration
    return "\n".join(rows + [
        "",
        f"Profile `{size}`: {df.attrs['shape']} ({df.attrs['tokens']} tokens, "
        f"{df.attrs['gflop']:.0f} GFLOP per step; a `cpu`-profile step is "
        f"{df.attrs['cpu_gflop']:.0f} GFLOP). Step time estimated from FLOPs "
        f"(`config.step_flops`) at {g.fp16_efficiency:.0%} of the {g.name}'s datasheet peak in "
        f"fp16 ({g.fp16_tensor_tflops:g} TFLOPS, tensor cores) and {g.fp32_efficiency:.0%} in "
        f"fp32 ({g.fp32_tflops:g} TFLOPS), plus bytes moved at {g.bandwidth_efficiency:.0%} of "
        f"{g.bandwidth_gbs:g} GB/s; peak memory from `memory_model.estimate` (Colab's T4 shows "
        f"{g.memory_gib:g} GiB). One timed comparison of the T4 ladder (the first {len(ladder)} "
        f"rows) runs rounds of all of them for {budget:g} s (`step_timing.default_budget_s`): about "
        f"{rounds} rounds, {total:.0f} s with a warm-up and a memory step each. "
        f"`{_TOOL} --t4` prints the table."])


# --------------------------------------------------------------------------- the commands

def sync(root: str | os.PathLike = ROOT, check: bool = False,
         parts: Sequence[str] = ("notebooks", "readme")) -> list[str]:
    """Bring badges, setup cells and Colab metadata in line with pyproject.toml's URL and
    version; return what changed (or, with ``check``, what disagrees, changing nothing).
    ``parts``: the notebooks, the README or both.

    Raises:
        ValueError: as `repo_url`, `release_ref` and `apply_to_notebook`; README.md without its
            generated blocks.
    """
    root = Path(root)
    url, ref = repo_url(root), release_ref(root)
    out = []
    folders = (_NOTEBOOK_DIRS + (("exercises",) if check else ())) if "notebooks" in parts else ()
    for folder in folders:
        for path in sorted((root / folder).glob("*.ipynb")):
            text = path.read_text(encoding="utf-8")
            new = _dumps(apply_to_notebook(json.loads(text), url,
                                           badge_target(path.relative_to(root)), ref))
            if new != text:
                rel = path.relative_to(root)
                if check:
                    why = (f"run `{_TOOL}`" if folder != "exercises"
                           else f"run `{_TOOL}`, then `course-grade release`")
                    out.append(f"{rel}: its Colab badge, setup cell or Colab metadata disagrees "
                               f"with pyproject.toml or is missing ({why})")
                else:
                    path.write_text(new, encoding="utf-8")
                    out.append(f"{rel}: badge, setup cell and Colab metadata written")
    readme = root / "README.md"
    if "readme" in parts and readme.is_file():
        text = readme.read_text(encoding="utf-8")
        new = _block(_block(text, "colab-badges", _badge_table(url, root)), "t4-estimate", _t4_block())
        if new != text:
            if check:
                out.append(f"README.md: its Colab badges or T4 estimate are out of date (run `{_TOOL}`)")
            else:
                readme.write_text(new, encoding="utf-8")
                out.append("README.md: Colab badges and T4 estimate written")
    return out


def release_check(root: str | os.PathLike = ROOT) -> list[str]:
    """What stops a release, as sentences (empty: it may go out).

    - pyproject.toml's repository URL is set and is not `PLACEHOLDER_URL`;
    - every Colab link in the notebooks (``notebooks/``, ``solutions/``, ``exercises/``), the
      README and ``docs/`` opens that repository;
    - the badges, setup cells and metadata agree with pyproject.toml (`sync` with ``check``);
    - in a git checkout, the tag the setup cells clone (`release_ref`) exists.

    Raises:
        ValueError: as `repo_url` and `release_ref`.
    """
    root = Path(root)
    url, ref = repo_url(root), release_ref(root)
    problems = []
    if is_placeholder(url):
        problems.append(f"pyproject.toml's [project.urls] Repository is the placeholder {url}, a "
                        "name nobody owns: set the course's real GitHub repository, then run "
                        f"`{_TOOL}` and `course-grade release`")
    want = _owner_name(url)
    files = [*(p for d in (*_NOTEBOOK_DIRS, "exercises") for p in sorted((root / d).glob("*.ipynb"))),
             root / "README.md", *sorted((root / "docs").glob("*.md"))]
    for path in files:
        if not path.is_file():
            continue
        found = set(_COLAB_LINK_RE.findall(path.read_text(encoding="utf-8")))
        for other in sorted(found - {want}):
            problems.append(f"{path.relative_to(root)}: a Colab link opens {other}, not {want}")
    problems += sync(root, check=True)
    inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=root,
                            capture_output=True, text=True)
    if inside.returncode == 0:
        tag = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"refs/tags/{ref}"],
                             cwd=root, capture_output=True, text=True)
        if tag.returncode != 0:
            problems.append(f"the setup cells clone the tag {ref} (v + pyproject.toml's version), "
                            f"which this checkout does not have: commit, then `git tag {ref}` "
                            "and push the tag with the release")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=_TOOL,
        description="Write the Colab badges, the setup cell and Colab's GPU metadata into every "
                    "lesson and solution notebook and the README, from pyproject.toml's "
                    "[project.urls] Repository and [project] version.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="change nothing; exit 1 if anything disagrees (exercises/ included)")
    mode.add_argument("--release-check", action="store_true",
                      help="change nothing; exit 1 unless the URL is set (not the placeholder), "
                           "every badge uses it, everything agrees and the release tag exists")
    mode.add_argument("--t4", action="store_true", help="print the T4 estimate and exit")
    parser.add_argument("--root", default=str(ROOT), help="the repository root (default: %(default)s)")
    parser.add_argument("--only", choices=("notebooks", "readme"),
                        help="rewrite (or check) only the notebooks or only README.md")
    args = parser.parse_args(argv)
    if args.t4:
        df = t4_estimate()
        print(df.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        return 0
    try:
        if args.release_check:
            out = release_check(args.root)
        else:
            out = sync(args.root, check=args.check,
                       parts=(args.only,) if args.only else ("notebooks", "readme"))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in out:
        print(line)
    if args.release_check:
        if not out:
            print(f"ready to release: {repo_url(args.root)} at {release_ref(args.root)}")
        return 1 if out else 0
    if args.check:
        return 1 if out else 0
    if not out:
        print("badges, setup cells and metadata already agree with", repo_url(args.root))
    elif any(line.startswith("solutions/") for line in out):
        print("now regenerate exercises/: course-grade release")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
