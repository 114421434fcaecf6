"""Run the course on Colab, or anywhere `course_utils` is missing: the repository URL, the
"Open in Colab" badges, the setup cell that starts every notebook, and what that cell calls.

The repository URL is declared once, in ``pyproject.toml`` (``[project.urls] Repository``).
Everything else is generated from it by one command, run from the repository root::

    python -m course_utils.colab            # rewrite badges and setup cells
    python -m course_utils.colab --check    # exit 1 and say what disagrees (tests/test_colab.py)

It rewrites ``notebooks/*.ipynb`` and ``solutions/*.ipynb`` (``exercises/`` is generated from
``solutions/`` by ``course-grade release``, so run that next; an exercise's badge points at
``exercises/``) and the generated blocks of ``README.md``. In each notebook it puts the badge
under the title (the first markdown cell) and the setup cell (id ``colab-setup``) after the
learning objectives, before any other code; it keeps every cell id and writes notebooks the way
nbstripout does, and running it twice changes nothing.

The setup cell fetches the course where `course_utils` cannot be imported and runs this file's
`install_missing` (standard library only, so it runs before any requirement is there):
``pip install --no-deps -e`` of the course, then only the requirements that do not import, never
torch and never an ipywidgets already present. Then it puts the course on ``sys.path`` (so this
kernel imports it without a restart) and calls `finish_setup`, which says where the course came
from and prints this machine's hardware and recipe. Where `course_utils` imports, the cell only
prints that. ``COURSE_SOURCE`` (a URL or a local clone) overrides where the course is fetched
from.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ROOT", "repo_url", "colab_url", "badge", "setup_cell_source", "badge_target",
           "apply_to_notebook", "sync", "requirements", "install_missing", "finish_setup",
           "describe_setup", "optional_import", "t4_estimate", "main"]

#: The repository root (this package's parent folder) in a checkout.
ROOT = Path(__file__).resolve().parents[1]
SETUP_ID = "colab-setup"
BRANCH = "main"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
_BADGE_RE = re.compile(r"\[!\[Open In Colab\]\(https://colab\.research\.google\.com/assets/"
                       r"colab-badge\.svg\)\]\([^)\s]*\)")
_NOTEBOOK_DIRS = ("notebooks", "solutions")
#: Import names of requirements whose distribution name differs.
_IMPORT_NAMES = {"pyyaml": "yaml", "scikit-learn": "sklearn", "pillow": "PIL"}
#: Never installed or upgraded by the setup cell: Colab's builds match its GPU and front end.
_NEVER_TOUCH = ("torch",)
_KEEP_IF_PRESENT = ("ipywidgets",)


# --------------------------------------------------------------------------- the one URL

def _toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            return _toml_fallback(path.read_text(encoding="utf-8"))
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _toml_fallback(text: str) -> dict:
    # Enough of TOML for this file on a Python without tomllib: the urls and the dependencies.
    urls = dict(re.findall(r'^(\w+)\s*=\s*"([^"]+)"', text.split("[project.urls]", 1)[-1]
                           .split("\n[", 1)[0], re.M))
    deps = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text, re.M | re.S)
    return {"project": {"urls": urls,
                        "dependencies": re.findall(r'"([^"]+)"', deps.group(1)) if deps else []}}


def repo_url(root: str | os.PathLike = ROOT) -> str:
    """The course's repository URL: ``[project.urls] Repository`` in ``root/pyproject.toml``.

    Raises:
        ValueError: no pyproject.toml there, no such entry, or not a ``https://github.com/OWNER/NAME``
            URL (Colab opens notebooks from GitHub).
    """
    path = Path(root) / "pyproject.toml"
    if not path.is_file():
        raise ValueError(f"{path} not found: run this from a checkout of the course.")
    url = _toml(path).get("project", {}).get("urls", {}).get("Repository")
    if not url:
        raise ValueError(f"{path} declares no [project.urls] Repository = \"https://github.com/...\".")
    _owner_name(url)
    return url


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

_SETUP_TEMPLATE = '''\
# Setup: run this cell first. Where course_utils is missing (a fresh Colab runtime) it fetches the
# course, makes it importable in this kernel (no restart needed) and installs only what is missing;
# it never reinstalls torch or ipywidgets. Elsewhere it prints this machine's hardware and recipe.
import importlib.util
import os
import runpy
import subprocess
import sys

COURSE_URL = "{url}"  # generated from pyproject.toml

checkout = None
if importlib.util.find_spec("course_utils") is None:
    here = os.getcwd()  # inside a copy of the course (notebooks/ or its root)? use that copy
    checkout = next((d for d in (here, os.path.dirname(here))
                     if os.path.isfile(os.path.join(d, "course_utils", "__init__.py"))), None)
    if checkout is None:
        checkout = os.path.abspath(os.path.basename(COURSE_URL))
        if not os.path.isdir(os.path.join(checkout, "course_utils")):
            source = os.environ.get("COURSE_SOURCE", COURSE_URL)  # a URL or a local clone
            print(f"fetching the course: git clone --depth=1 {{source}} {{checkout}}")
            subprocess.run(["git", "clone", "--quiet", "--depth=1", source, checkout], check=True)
    # Install what is missing first (colab.py needs only the standard library), then import.
    runpy.run_path(os.path.join(checkout, "course_utils", "colab.py"))["install_missing"](checkout)
    sys.path.insert(0, checkout)
    importlib.invalidate_caches()
importlib.import_module("course_utils.colab").finish_setup(checkout)
'''


def setup_cell_source(url: str) -> str:
    """The setup cell's code, with the repository ``url`` written in."""
    _owner_name(url)
    return _SETUP_TEMPLATE.format(url=url)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else str(source)


def _setup_cell(url: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "id": SETUP_ID, "metadata": {},
            "outputs": [], "source": _lines(setup_cell_source(url))}


def _with_badge(text: str, line: str) -> str:
    if _BADGE_RE.search(text):
        return _BADGE_RE.sub(lambda _: line, text, count=1)
    lines = text.split("\n")
    at = next((i + 1 for i, s in enumerate(lines) if s.startswith("# ")), 0)
    return "\n".join(lines[:at] + (["", line] if at else [line, ""]) + lines[at:])


def apply_to_notebook(nb: dict, url: str, target: str) -> dict:
    """Return ``nb`` (a notebook as JSON) with the badge for ``target`` under its title and the
    setup cell first among its code cells, after the learning objectives.

    Existing badges and setup cells are rewritten in place (their ids kept); every other cell is
    kept as it is. ``nb`` is not modified.

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
    cell = cells.pop(setups[0]) if setups else None
    if cell is None:
        cell = _setup_cell(url)
    else:
        cell["cell_type"], cell["source"] = "code", _lines(setup_cell_source(url))
        cell["outputs"], cell["execution_count"] = [], None
    first_code = next((i for i, c in enumerate(cells) if c["cell_type"] == "code"), len(cells))
    objectives = next((i for i, c in enumerate(cells[:first_code])
                       if "objective" in _text(c["source"]).lower()), None)
    at = first_code if objectives is None else objectives + 1
    cells.insert(at, cell)
    return nb


def _dumps(nb: dict) -> str:
    # nbformat.write's layout (indent 1, sorted keys, trailing newline), as nbstripout writes.
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------- README blocks

def _block(text: str, name: str, body: str) -> str:
    start, end = f"<!-- {name}: generated by python -m course_utils.colab -->", f"<!-- /{name} -->"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
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
#: shows 15 GiB usable).
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

    from .config import config_for, step_flops
    from .memory_model import estimate

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
                     "peak_GiB": est.peak_allocated / 2**30, "in_ladder": precision != "bf16"})
    df = pd.DataFrame(rows)
    df.attrs.update(size=size, gpu=gpu, tokens=base.tokens_per_step,
                    shape=f"{base.n_layers} layers, d_model {base.d_model}, "
                          f"seq {base.seq_len}, batch {base.batch_size}",
                    cpu_gflop=step_flops(config_for("cpu", device="cpu")) / 1e9,
                    gflop=step_flops(base) / 1e9)
    return df


def _t4_block(size: str = "t4") -> str:
    from .timing import default_budget_s, steps_for_budget

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
        f"rows) runs rounds of all of them for {budget:g} s (`timing.default_budget_s`): about "
        f"{rounds} rounds, {total:.0f} s with a warm-up and a memory step each. "
        "`python -m course_utils.colab --t4` prints the table."])


# --------------------------------------------------------------------------- the command

def sync(root: str | os.PathLike = ROOT, check: bool = False,
         parts: Sequence[str] = ("notebooks", "readme")) -> list[str]:
    """Bring badges and setup cells in line with the repository URL; return what changed (or,
    with ``check``, what disagrees, changing nothing). ``parts``: the notebooks, the README or
    both."""
    root = Path(root)
    url = repo_url(root)
    out = []
    folders = (_NOTEBOOK_DIRS + (("exercises",) if check else ())) if "notebooks" in parts else ()
    for folder in folders:
        for path in sorted((root / folder).glob("*.ipynb")):
            text = path.read_text(encoding="utf-8")
            new = _dumps(apply_to_notebook(json.loads(text), url, badge_target(path.relative_to(root))))
            if new != text:
                rel = path.relative_to(root)
                if check:
                    why = ("run `python -m course_utils.colab`" if folder != "exercises"
                           else "run `python -m course_utils.colab`, then `course-grade release`")
                    out.append(f"{rel}: its Colab badge or setup cell disagrees with "
                               f"pyproject.toml's URL or is missing ({why})")
                else:
                    path.write_text(new, encoding="utf-8")
                    out.append(f"{rel}: badge and setup cell written")
    readme = root / "README.md"
    if "readme" in parts and readme.is_file():
        text = readme.read_text(encoding="utf-8")
        new = _block(_block(text, "colab-badges", _badge_table(url, root)), "t4-estimate", _t4_block())
        if new != text:
            if check:
                out.append("README.md: its Colab badges or T4 estimate are out of date "
                           "(run `python -m course_utils.colab`)")
            else:
                readme.write_text(new, encoding="utf-8")
                out.append("README.md: Colab badges and T4 estimate written")
    return out


# --------------------------------------------------------------------------- in the kernel

def requirements(root: str | os.PathLike) -> list[str]:
    """The runtime requirements (``[project] dependencies``) of the course at ``root``."""
    return list(_toml(Path(root) / "pyproject.toml").get("project", {}).get("dependencies", []))


def _name(spec: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    if not m:
        raise ValueError(f"cannot read a package name from the requirement {spec!r}")
    return m.group(1)


def _importable(name: str) -> bool:
    module = _IMPORT_NAMES.get(name.lower(), name.lower().replace("-", "_").replace(".", "_"))
    return importlib.util.find_spec(module) is not None


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


@dataclass
class SetupReport:
    """What `install_missing` did: ``pip`` (the pip commands run), ``installed`` (requirements
    that were missing), ``kept`` (name -> version already present, left alone), ``problems``."""

    pip: list = field(default_factory=list)
    installed: list = field(default_factory=list)
    kept: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)


def _pip(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def install_missing(checkout: str | os.PathLike, run: Callable = _pip,
                    say: Callable = print) -> SetupReport:
    """Install the course at ``checkout`` into this Python without touching what is there.

    ``pip install --no-deps -e checkout`` (the ``course-bench``/``course-grade`` commands, and
    the import after a restart), then one ``pip install`` of the requirements that do not import
    here, with torch pinned to the installed build. torch itself is never installed or upgraded,
    nor is an ipywidgets that imports (Colab's 7.x front end needs its own). ``run(args)`` runs pip
    (tests pass a fake); ``say`` prints each step.

    Raises:
        RuntimeError: torch is not installed (install the build for this machine first) or pip
            failed to install a missing requirement.
    """
    report = SetupReport()
    if not _importable("torch"):
        raise RuntimeError("torch is not installed in this Python. Install the build for your "
                           "machine (https://pytorch.org/get-started/locally/), then run this "
                           "cell again: the course never installs torch itself.")
    args = ["install", "--quiet", "--no-deps", "-e", str(checkout)]
    report.pip.append(args)
    r = run(args)
    if r.returncode == 0:
        say(f"installed the course: pip install --no-deps -e {checkout} "
            "(course-bench and course-grade commands; imports after a restart too)")
    else:
        tail = (r.stderr or r.stdout or "").strip().splitlines()[-1:] or ["no message"]
        report.problems.append(f"pip install --no-deps -e {checkout} failed: {tail[0]}")
        say(f"could not pip-install the course ({tail[0]}); this kernel imports it from "
            f"{checkout} anyway. After a restart, run this cell again.")
    missing = []
    for spec in requirements(checkout):
        name = _name(spec)
        if _importable(name):
            report.kept[name] = _version(name)
        elif name.lower() in _NEVER_TOUCH:
            continue
        else:
            missing.append(spec)
    if report.kept:
        say("already installed, left as they are: "
            + ", ".join(f"{n} {v}" for n, v in report.kept.items()))
    if missing:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(f"torch=={_version('torch')}\n")
            constraints = f.name
        args = ["install", "--quiet", *missing, "-c", constraints]
        report.pip.append(args)
        r = run(args)
        os.unlink(constraints)
        if r.returncode != 0:
            tail = (r.stderr or r.stdout or "").strip().splitlines()[-1:] or ["no message"]
            raise RuntimeError(f"pip could not install {', '.join(missing)}: {tail[0]}")
        report.installed = missing
        importlib.invalidate_caches()
        say(f"installed what was missing: {', '.join(missing)}")
    else:
        say("nothing else was missing")
    return report


def describe_setup(hw=None) -> str:
    """Two lines: where `course_utils` comes from, and the hardware ``hw`` (default: this
    machine's), its recipe and size profile (the facts the lessons plan from)."""
    import torch

    import course_utils

    from .config import size_profile
    from .hardware import detect, is_emulated, recommend_precision

    hw = hw or detect()
    rec = recommend_precision(hw)
    where = hw.name + (f", compute capability {hw.compute_capability[0]}."
                       f"{hw.compute_capability[1]}" if hw.compute_capability else "")
    recipe = rec.precision + (" autocast + GradScaler" if rec.grad_scaler else
                              " autocast" if rec.precision != "fp32" else "")
    emulated = [p for p in ("bf16", "fp16") if is_emulated(hw, p)]
    return (f"course_utils from {Path(course_utils.__file__).parent.parent}, torch "
            f"{torch.__version__}\n{hw.device} ({where}): recipe {recipe}"
            + (f"; {' and '.join(emulated)} emulated here" if emulated else "")
            + f"; size profile {size_profile(hw)}")


def finish_setup(checkout: str | os.PathLike | None = None) -> None:
    """The setup cell's last call, once `course_utils` imports: say where it was found when the
    cell had to find or fetch it (``checkout``), then print `describe_setup`."""
    if checkout is not None:
        print(f"course_utils imports in this kernel from {checkout} (put on sys.path: no restart "
              "needed)")
    print(describe_setup())


def optional_import(module: str, extra: str, purpose: str):
    """Import an optional package, or say how to install it and return None.

    For a lesson section that needs a package outside the course's runtime, e.g.
    ``transformers = optional_import("transformers", "hf", "the Hugging Face section")``.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        print(f"{module} is not installed, so {purpose} is skipped. To run it: "
              f"`%pip install {module}` (or `pip install -e \".[{extra}]\"` in the course's "
              "folder; `make course` includes it), restart the kernel and run the notebook again.")
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.colab",
        description="Write the Colab badges and the setup cell into every lesson and solution "
                    "notebook and the README, from pyproject.toml's [project.urls] Repository.")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if anything disagrees (exercises/ included)")
    parser.add_argument("--root", default=str(ROOT), help="the repository root (default: %(default)s)")
    parser.add_argument("--only", choices=("notebooks", "readme"),
                        help="rewrite (or check) only the notebooks or only README.md")
    parser.add_argument("--t4", action="store_true", help="print the T4 estimate and exit")
    args = parser.parse_args(argv)
    if args.t4:
        df = t4_estimate()
        print(df.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        return 0
    try:
        out = sync(args.root, check=args.check,
                   parts=(args.only,) if args.only else ("notebooks", "readme"))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in out:
        print(line)
    if args.check:
        return 1 if out else 0
    if not out:
        print("badges and setup cells already agree with", repo_url(args.root))
    elif any(line.startswith("solutions/") for line in out):
        print("now regenerate exercises/: course-grade release")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
