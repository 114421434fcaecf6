"""The learner's side of the setup cell that starts every notebook (written by
``tools/colab_cells.py``): `install_missing` on the copy of the course it found, then
`finish_setup`. The cell runs this file by path before any requirement is installed, so it
imports only the standard library at module level; it never installs or upgrades torch
(Colab's build matches its GPU) nor anything that already imports.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["read_toml", "requirements", "SetupReport", "install_missing", "describe_setup",
           "finish_setup", "optional_import", "tr"]

#: Import names of requirements whose distribution name differs.
_IMPORT_NAMES = {"pyyaml": "yaml", "scikit-learn": "sklearn", "pillow": "PIL"}
#: Never installed or upgraded by the setup cell: Colab's builds match its GPU and front end.
_NEVER_TOUCH = ("torch",)


def _i18n():
    """The package's `course_utils.i18n`, else the ``i18n.py`` beside this file, else None."""
    if __package__:
        from . import i18n  # lazy: the package's own, when this file is imported as a module
        return i18n
    for name in ("course_utils.i18n", "_course_i18n"):
        if name in sys.modules:
            return sys.modules[name]
    here = globals().get("__file__")
    sibling = Path(here).with_name("i18n.py") if here else None
    if sibling is None or not sibling.is_file():
        return None
    spec = importlib.util.spec_from_file_location("_course_i18n", sibling)
    module = importlib.util.module_from_spec(spec)
    sys.modules["_course_i18n"] = module
    spec.loader.exec_module(module)
    return module


def tr(text: str, /, **fields) -> str:
    """``text`` in the learner's language (`course_utils.i18n.tr`), also where this file runs
    before the course imports; English with ``fields`` filled in where no catalog is found."""
    i18n = _i18n()
    if i18n is None:
        return text.format(**fields) if fields else text
    return i18n.tr(text, **fields)


def read_toml(path: str | os.PathLike) -> dict:
    """``path`` (a TOML file) as a dict: tomllib, tomli, or on a Python 3.10 without tomli
    `_toml_fallback` (enough for pyproject.toml)."""
    try:
        import tomllib  # lazy: Python >= 3.11 only
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # lazy: on Python 3.10, if at all
        except ModuleNotFoundError:
            return _toml_fallback(Path(path).read_text(encoding="utf-8"))
    return tomllib.loads(Path(path).read_text(encoding="utf-8"))


def _toml_fallback(text: str) -> dict:
    urls = dict(re.findall(r'^(\w+)\s*=\s*"([^"]+)"', text.split("[project.urls]", 1)[-1]
                           .split("\n[", 1)[0], re.M))
    deps = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text, re.M | re.S)
    version = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    project = {"urls": urls,
               "dependencies": re.findall(r'"([^"]+)"', deps.group(1)) if deps else []}
    if version:
        project["version"] = version.group(1)
    return {"project": project}


def _wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            raise ValueError(tr("{wheel} has no *.dist-info/METADATA: not a wheel.", wheel=wheel))
        text = z.read(meta).decode("utf-8")
    specs = re.findall(r"^Requires-Dist:\s*(.+?)\s*$", text, re.M)
    return [s for s in specs if not re.search(r";.*\bextra\s*==", s)]


def requirements(source: str | os.PathLike) -> list[str]:
    """The runtime requirements of the course at ``source``: ``[project] dependencies`` of a
    folder's ``pyproject.toml``, a wheel's ``Requires-Dist`` without an ``extra`` marker;
    ValueError for a folder without ``pyproject.toml`` or a file that is not a wheel."""
    path = Path(source)
    if path.suffix == ".whl":
        return _wheel_requirements(path)
    if not (path / "pyproject.toml").is_file():
        raise ValueError(tr("{path} has no pyproject.toml: not a copy of the course.", path=path))
    return list(read_toml(path / "pyproject.toml").get("project", {}).get("dependencies", []))


def _name(spec: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    if not m:
        raise ValueError(tr("cannot read a package name from the requirement {spec!r}", spec=spec))
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


def _last_line(r) -> str:
    return ((r.stderr or r.stdout or "").strip().splitlines()[-1:] or [tr("no message")])[0]


def install_missing(source: str | os.PathLike, run: Callable = _pip,
                    say: Callable = print) -> SetupReport:
    """Install the course at ``source`` (a folder with ``pyproject.toml``, or a wheel) into this
    Python without touching what is there: ``pip install --no-deps`` of it (editable for a
    folder, which this kernel imports from ``sys.path`` anyway if that fails), then one ``pip
    install`` of the requirements that do not import here, torch pinned to the installed build.
    ``run(args)`` runs pip (tests pass a fake); ``say`` prints each step. RuntimeError if torch
    is not installed or pip fails on the wheel or a requirement; ValueError if ``source`` is
    neither a copy of the course nor a wheel."""
    report = SetupReport()
    if not _importable("torch"):
        raise RuntimeError(tr("torch is not installed in this Python. Install the build for your "
                              "machine (https://pytorch.org/get-started/locally/), then run this "
                              "cell again: the course never installs torch itself."))
    wheel = Path(source).suffix == ".whl"
    specs = requirements(source)
    args = ["install", "--quiet", "--no-deps", *([] if wheel else ["-e"]), str(source)]
    report.pip.append(args)
    r = run(args)
    if r.returncode == 0:
        say(tr("installed the course: {command} (course-bench and course-grade commands; "
               "imports after a restart too)",
               command=f"pip install --no-deps {'' if wheel else '-e '}{source}"))
    elif wheel:
        raise RuntimeError(tr("pip could not install the wheel {source}: {error}", source=source,
                              error=_last_line(r)))
    else:
        report.problems.append(tr("{command} failed: {error}",
                                  command=f"pip install --no-deps -e {source}",
                                  error=_last_line(r)))
        say(tr("could not pip-install the course ({error}); this kernel imports it from {source} "
               "anyway. After a restart, run this cell again.", error=_last_line(r),
               source=source))
    missing = []
    for spec in specs:
        name = _name(spec)
        if _importable(name):
            report.kept[name] = _version(name)
        elif name.lower() not in _NEVER_TOUCH:
            missing.append(spec)
    if report.kept:
        say(tr("already installed, left as they are: {packages}",
               packages=", ".join(f"{n} {v}" for n, v in report.kept.items())))
    if missing:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(f"torch=={_version('torch')}\n")
            constraints = f.name
        args = ["install", "--quiet", *missing, "-c", constraints]
        report.pip.append(args)
        r = run(args)
        os.unlink(constraints)
        if r.returncode != 0:
            raise RuntimeError(tr("pip could not install {packages}: {error}",
                                  packages=", ".join(missing), error=_last_line(r)))
        report.installed = missing
        importlib.invalidate_caches()
        say(tr("installed what was missing: {packages}", packages=", ".join(missing)))
    else:
        say(tr("nothing else was missing"))
    return report


def describe_setup(hw=None) -> str:
    """One line (two under a stand-in GPU): where `course_utils` comes from, and the hardware
    ``hw`` (default: this machine's), its recipe and size profile."""
    # lazy: the setup cell runs this file with the standard library alone, before installing
    import torch

    import course_utils
    from course_utils.config import size_profile
    from course_utils.hardware import detect, is_emulated, recommend_precision

    hw = hw or detect()
    rec = recommend_precision(hw)
    where = hw.name + (f", compute capability {hw.compute_capability[0]}."
                       f"{hw.compute_capability[1]}" if hw.compute_capability else "")
    recipe = rec.precision + (" autocast + GradScaler" if rec.grad_scaler else
                              " autocast" if rec.precision != "fp32" else "")
    emulated = [p for p in ("bf16", "fp16") if is_emulated(hw, p)]
    fields = dict(folder=Path(course_utils.__file__).parent.parent, torch=torch.__version__,
                  device=hw.device, where=where, recipe=recipe, size=size_profile(hw))
    if emulated:
        line = tr("course_utils from {folder}, torch {torch}; {device} ({where}): recipe "
                  "{recipe}; {emulated} emulated here; size profile {size}", **fields,
                  emulated=emulated[0] if len(emulated) == 1
                  else tr("{first} and {second}", first=emulated[0], second=emulated[1]))
    else:
        line = tr("course_utils from {folder}, torch {torch}; {device} ({where}): recipe "
                  "{recipe}; size profile {size}", **fields)
    return line + (f"\n{hw.stand_in}" if getattr(hw, "stand_in", "") else "")


def finish_setup(source: str | os.PathLike | None = None) -> None:
    """The setup cell's last call, once `course_utils` imports: say where it was found
    (``source``: the folder put on ``sys.path`` or the wheel installed), then `describe_setup`."""
    if source is not None and Path(source).suffix == ".whl":
        print(tr("course_utils imports in this kernel from the wheel {source} (installed: no "
                 "restart needed)", source=source))
    elif source is not None:
        print(tr("course_utils imports in this kernel from {source} (put on sys.path: no restart "
                 "needed)", source=source))
    print(describe_setup())
    from course_utils.i18n import install_display  # lazy: the course imports only now
    install_display()   # a Korean kernel shows table labels in Korean


def optional_import(module: str, extra: str, purpose: str):
    """Import an optional package, or say how to install it and return None, e.g.
    ``transformers = optional_import("transformers", "hf", "the Hugging Face section")``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        print(tr("{module} is not installed, so {purpose} is skipped. To run it: `%pip install "
                 "{module}` (or `pip install -e \".[{extra}]\"` in the course's folder; `make "
                 "course` includes it), restart the kernel and run the notebook again.",
                 module=module, purpose=purpose, extra=extra))
        return None
