"""The packages' structure. Imports go one way: a module imports only from its own layer or the
layers below (LAYERS, bottom first; CONTRIBUTING.md explains each); no two modules import each
other in a circle; a function-local import (which a circle could hide behind) says why it is
lazy; a module over 400 lines says in its docstring why it is one module.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import``, at the
top of a module or inside a function, relative or absolute.
"""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Each package's layers, bottom first. A module may import its own layer and the layers below.
LAYERS = {
    "course_utils": [
        ("terms", ["terms", "i18n"]),
        ("machine and mechanisms", [
            "store", "hardware", "stand_in", "data", "checkpointing", "step_timing", "memory_timeline",
            "saved_tensors", "offload", "loss_scaling", "gradients", "formats", "fp32_matmul",
            "autocast_ops", "quiz",
            "cli_args", "stand_in", "chunked_loss"]),
        ("run description", ["config"]),
        ("model and estimate", ["models", "memory_model", "model_zoo"]),
        ("run guard", ["guard"]),
        ("training", ["training", "nonfinite", "learner_checks"]),
        ("measurement", ["measure"]),
        ("experiments and evidence", [
            "experiments", "search", "results", "evidence", "claims", "training_arms", "lora",
            "profiling", "extrapolate", "card", "distributed"]),
        ("presentation", ["plots", "dashboard"]),
        ("entry points", ["cli", "cli_profile", "colab", "__init__"]),
    ],
    "course_grade": [
        ("records", ["files", "results", "stop", "notebook"]),
        ("steps", ["release", "sandbox", "parallel", "execute", "assemble", "feedback",
                   "report"]),
        ("grading", ["grade", "gradebook"]),
        ("entry points", ["cli", "__main__", "__init__"]),
    ],
}

#: What a function-local import's comment starts with: the reason it is not at the top.
LAZY = "# lazy:"


def modules(package_dir: Path) -> dict[str, Path]:
    """``{"plots.ladder": path, "__init__": path, ...}``: every module of a package, by its
    name inside the package."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir).with_suffix("").parts
        name = ".".join(parts[:-1]) if parts[-1] == "__init__" and len(parts) > 1 else ".".join(parts)
        out[name] = path
    return out


def imports(package: str, package_dir: Path):
    """Every import of the package's own modules: ``[(importer, imported, lineno, local)]``
    (``local``: inside a function or class, not at the module's top)."""
    mods = modules(package_dir)
    found = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        for node in tree.body:  # a module-level try/if (tomllib or tomli) is still the top
            if isinstance(node, (ast.Try, ast.If)):
                top |= {id(n) for n in ast.walk(node)}
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ([] if name == "__init__" else name.split("."))[:None if is_pkg else -1]
                    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                    target = ".".join(base + ([node.module] if node.module else []))
                elif (node.module or "").split(".")[0] == package:
                    target = node.module[len(package) + 1:]
                else:
                    continue
                subs = [f"{target}.{a.name}".strip(".") for a in node.names]
                targets = [s for s in subs if s in mods] or [target or "__init__"]
            elif isinstance(node, ast.Import):
                targets = [a.name[len(package) + 1:] or "__init__" for a in node.names
                           if a.name.split(".")[0] == package]
            else:
                continue
            for t in targets:
                t = t or "__init__"
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != name:
                    found.append((name, t, node.lineno, id(node) not in top))
    return found


def layer_of(package: str, module: str) -> int:
    """The index of ``module``'s layer (a subpackage's modules share the subpackage's)."""
    head = module.split(".")[0]
    for i, (_, members) in enumerate(LAYERS[package]):
        if module in members or head in members:
            return i
    raise KeyError(module)


def cycles(edges: dict[str, set]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in list(edges):
        if v not in index:
            visit(v)
    return out


def problems(package: str, package_dir: Path) -> list[str]:
    """Every circle, upward import and unplaced module of a package, in words."""
    edges: dict[str, set] = {}
    out = []
    mods = modules(package_dir)
    for m in mods:
        try:
            layer_of(package, m)
        except KeyError:
            out.append(f"{package}.{m} has no layer: add it to LAYERS (tests/test_layers.py) "
                       "and to CONTRIBUTING.md")
    for importer, imported, line, _ in imports(package, package_dir):
        if importer.split(".")[0] == imported.split(".")[0] and "." in importer + imported:
            # inside a subpackage (plots.ladder -> plots._style): the subpackage's own affair,
            # its circles are still circles
            pass
        elif importer != "__init__":
            try:
                if layer_of(package, imported) > layer_of(package, importer):
                    out.append(f"upward import: {package}.{importer} (line {line}) imports "
                               f"{package}.{imported}, which sits in a higher layer")
            except KeyError:
                pass
        if imported != "__init__":
            edges.setdefault(importer, set()).add(imported)
    out += [f"circle: {' <-> '.join(c)}" for c in cycles(edges)]
    return out


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_imports_go_one_way_without_a_circle(package):
    assert problems(package, ROOT / package) == []


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_every_function_local_import_says_why_it_is_lazy(package):
    """A function-local import of anything (the course's modules, matplotlib, transformers...)
    carries a ``# lazy: <reason>`` comment on its line or the line above."""
    silent = []
    for path in modules(ROOT / package).values():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        top = {id(n) for n in tree.body}
        for node in tree.body:
            if isinstance(node, (ast.Try, ast.If)):
                top |= {id(n) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
                here = lines[node.lineno - 1]
                above = [lines[i].strip() for i in range(node.lineno - 2, -1, -1)]
                above = next((a for a in above if a and not a.startswith(("import ", "from "))), "")
                if LAZY not in here and LAZY not in above:
                    silent.append(f"{package}/{path.relative_to(ROOT / package)}:{node.lineno}")
    assert silent == [], f"function-local imports without a '{LAZY} reason' comment: {silent}"


def test_the_checker_finds_a_circle_an_upward_import_and_an_unplaced_module(tmp_path, monkeypatch):
    pkg = tmp_path / "course_utils"
    pkg.mkdir()
    files = {
        "__init__.py": "",
        "terms.py": "def f():\n    from .config import x  # lazy: a circle hidden in a function\n",
        "config.py": "from .terms import f\nx = 1\n",
        "hardware.py": "from . import guard\n",
        "guard.py": "",
        "newcomer.py": "",
    }
    for name, text in files.items():
        (pkg / name).write_text(textwrap.dedent(text))
    found = problems("course_utils", pkg)
    assert "circle: config <-> terms" in found
    assert any(p.startswith("upward import: course_utils.terms") for p in found)
    assert any(p.startswith("upward import: course_utils.hardware (line 1) imports "
                            "course_utils.guard") for p in found)
    assert any("course_utils.newcomer has no layer" in p for p in found)


def test_the_run_guard_reads_the_machine_and_the_estimate():
    """The guard sits above hardware, config and the memory model and uses all three; none of
    them imports it back (the old circle config -> hardware -> memory_model -> config)."""
    edges = imports("course_utils", ROOT / "course_utils")
    from_guard = {b for a, b, _, _ in edges if a == "guard"}
    assert {"hardware", "memory_model", "config"} <= from_guard
    assert not [(a, b) for a, b, _, _ in edges if b == "guard" and a in {"hardware", "memory_model",
                                                                             "config", "terms"}]


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_a_module_over_400_lines_says_why_in_its_docstring(package):
    """A long module is one subject on purpose, and its docstring says which ("Over 400 lines
    because ..."); otherwise it should be split."""
    silent = []
    for path in modules(ROOT / package).values():
        text = path.read_text()
        if len(text.splitlines()) > 400 and "Over 400 lines because" not in (
                ast.get_docstring(ast.parse(text)) or ""):
            silent.append(str(path.relative_to(ROOT)))
    assert silent == [], f"modules over 400 lines whose docstring gives no reason: {silent}"


#: The longest function the packages keep (issue 24: card.recommend was 189 lines).
MAX_FUNCTION_LINES = 80


@pytest.mark.parametrize("package", ["course_utils", "course_grade"])
def test_no_function_is_over_80_lines(package):
    long = []
    for name, path in modules(ROOT / package).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{package}.{name}.{node.name}: {lines} lines")
    assert not long, long
