"""The Korean edition, kept in step with the English one: ``ko/notebooks/`` and ``ko/solutions/``
are generated from ``notebooks/`` and ``solutions/`` (``ko/exercises/`` from ``ko/solutions/`` by
``course-grade release``, as in English). Run from the repository root::

    python tools/editions.py             # write ko/ from the English notebooks and the Korean cells there
    python tools/editions.py --check     # exit 1 and say what is out of step (tests run it)
    python tools/editions.py --status    # per notebook: cells translated, stale, untranslated
    python tools/editions.py --accept ko/notebooks/01_amp_review.ipynb [CELL_ID ...]

A Korean notebook has the English notebook's cells, in its order, with its ids: every code cell is
the English cell byte for byte (the setup cell too: the kernel tells the edition from the
notebook's folder, `course_utils.i18n`), and every markdown cell holds its translation and, in its
metadata, ``translation.en_sha1``: the SHA-1 of the English cell's source it translates. When the
English cell changes, the hashes differ and ``--check`` names the cell: translate it again, then
``--accept`` the notebook and the cell ids (without ids: every markdown cell whose text is no
longer the English text). A markdown cell not yet translated holds the English text and no hash.
The Colab badge in a Korean title points at the Korean notebook. Korean markdown follows the
glossary, ``docs/glossary.md``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KO = "ko"
#: The English folders whose notebooks have Korean editions (exercises/ follow from solutions/).
FOLDERS = ("notebooks", "solutions")


def sha1(source) -> str:
    """The SHA-1 (hex) of a cell's source, given as a string or a list of lines."""
    text = "".join(source) if isinstance(source, list) else str(source)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else str(source)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _dumps(nb: dict) -> str:
    # nbformat.write's layout (indent 1, sorted keys, trailing newline), as nbstripout writes.
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def korean_path(english: Path, root: Path = ROOT) -> Path:
    """``notebooks/01_x.ipynb`` -> ``ko/notebooks/01_x.ipynb`` (under ``root``)."""
    return root / KO / english.relative_to(root)


def _ko_badge(text: str, rel: str) -> str:
    """The Colab badge of an English title, pointed at the Korean notebook ``rel`` (a solution's
    badge opens its exercise, as in English: the Korean exercise)."""
    text = text.replace(f"/blob/main/{rel}", f"/blob/main/{KO}/{rel}")
    if rel.startswith("solutions/"):
        exercise = "exercises/" + rel.split("/", 1)[1]
        text = text.replace(f"/blob/main/{exercise}", f"/blob/main/{KO}/{exercise}")
    return text


def build(english: dict, korean: dict | None, rel: str) -> dict:
    """The Korean notebook for the English notebook ``english`` (JSON), keeping the translations
    of ``korean`` (the current Korean notebook, or None): code cells and metadata from English,
    markdown cells from Korean where a cell of that id exists there, else the English text with
    no hash (untranslated)."""
    have = {c.get("id"): c for c in (korean or {}).get("cells", []) if c["cell_type"] == "markdown"}
    cells = []
    for cell in english["cells"]:
        cell = json.loads(json.dumps(cell))
        if cell["cell_type"] == "markdown":
            old = have.get(cell.get("id"))
            if old is not None and old.get("metadata", {}).get("translation"):
                cell["source"] = old["source"]
                cell["metadata"] = dict(cell.get("metadata", {}),
                                        translation=old["metadata"]["translation"])
            else:
                cell["metadata"] = dict(cell.get("metadata", {}), translation={"en_sha1": None})
            cell["source"] = _lines(_ko_badge(_text(cell["source"]), rel))
        cells.append(cell)
    nb = dict(english, cells=cells)
    nb["metadata"] = dict(english.get("metadata", {}), language="ko")
    return nb


def problems(english: dict, korean: dict | None, rel: str) -> list[str]:
    """What keeps ``korean`` from being the Korean edition of ``english``: a missing notebook,
    cells in one edition only or in another order, a code cell that differs, a markdown cell
    untranslated or translating an older English text."""
    if korean is None:
        return [f"{KO}/{rel}: missing (python tools/editions.py writes it)"]
    out = []
    en_ids = [c.get("id") for c in english["cells"]]
    ko_ids = [c.get("id") for c in korean["cells"]]
    if en_ids != ko_ids:
        only_en = [i for i in en_ids if i not in ko_ids]
        only_ko = [i for i in ko_ids if i not in en_ids]
        out.append(f"{KO}/{rel}: cells differ from the English notebook's (only in English: "
                   f"{only_en}; only in Korean: {only_ko}; or another order)")
        return out
    for en, ko in zip(english["cells"], korean["cells"]):
        cid = en.get("id")
        if en["cell_type"] != ko["cell_type"]:
            out.append(f"{KO}/{rel} [{cid}]: a {ko['cell_type']} cell, in English a {en['cell_type']}")
        elif en["cell_type"] == "code" and _text(en["source"]) != _text(ko["source"]):
            out.append(f"{KO}/{rel} [{cid}]: code differs from the English cell")
        elif en["cell_type"] == "markdown":
            stamp = ko.get("metadata", {}).get("translation", {}).get("en_sha1")
            if stamp is None:
                out.append(f"{KO}/{rel} [{cid}]: not translated")
            elif stamp != sha1(_ko_badge(_text(en["source"]), rel)):
                out.append(f"{KO}/{rel} [{cid}]: the English cell changed since it was translated")
    return out


def english_notebooks(root: Path = ROOT) -> list[Path]:
    """Every English notebook that has a Korean edition, in order."""
    return [p for folder in FOLDERS for p in sorted((root / folder).glob("[0-9][0-9]_*.ipynb"))]


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def sync(root: Path = ROOT, check: bool = False) -> list[str]:
    """Write (or with ``check``, only compare) every Korean notebook; return the problems left."""
    found = []
    for en_path in english_notebooks(root):
        rel = str(en_path.relative_to(root))
        english, ko_path = _read(en_path), korean_path(en_path, root)
        korean = _read(ko_path)
        if not check:
            korean = build(english, korean, rel)
            ko_path.parent.mkdir(parents=True, exist_ok=True)
            if _read(ko_path) != korean:
                ko_path.write_text(_dumps(korean), encoding="utf-8")
        found += problems(english, korean, rel)
    return found


def accept(ko_path: Path, cell_ids: Sequence[str], root: Path = ROOT) -> list[str]:
    """Stamp the markdown cells ``cell_ids`` of the Korean notebook ``ko_path`` (all whose text is
    no longer the English text, when none are given) as translating the current English cells.
    Returns the ids stamped.

    Raises:
        ValueError: ``ko_path`` is not a Korean notebook, or an id names no markdown cell.
    """
    ko_path = ko_path.resolve()
    try:
        rel = ko_path.relative_to(root / KO)
    except ValueError:
        raise ValueError(f"{ko_path} is not under {root / KO}") from None
    english, korean = _read(root / rel), _read(ko_path)
    if english is None or korean is None:
        raise ValueError(f"{ko_path}: no English notebook {rel} or no Korean notebook")
    en_cells = {c.get("id"): c for c in english["cells"] if c["cell_type"] == "markdown"}
    stamped = []
    for cell in korean["cells"]:
        cid = cell.get("id")
        if cell["cell_type"] != "markdown" or cid not in en_cells:
            continue
        en_text = _ko_badge(_text(en_cells[cid]["source"]), str(rel))
        if (cell_ids and cid in cell_ids) or (not cell_ids and _text(cell["source"]) != en_text):
            cell.setdefault("metadata", {})["translation"] = {"en_sha1": sha1(en_text)}
            stamped.append(cid)
    unknown = set(cell_ids) - set(stamped)
    if unknown:
        raise ValueError(f"no markdown cell {sorted(unknown)} in {ko_path}")
    ko_path.write_text(_dumps(korean), encoding="utf-8")
    return stamped


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="editions", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare only; exit 1 on any problem")
    p.add_argument("--status", action="store_true", help="count each notebook's cells")
    p.add_argument("--accept", nargs="+", metavar=("KO_NOTEBOOK", "CELL_ID"),
                   help="stamp translated cells of a Korean notebook")
    args = p.parse_args(argv)
    if args.accept:
        try:
            ids = accept(Path(args.accept[0]), args.accept[1:])
        except ValueError as e:
            print(f"editions: {e}", file=sys.stderr)
            return 2
        print(f"{args.accept[0]}: stamped {len(ids)} cell(s)")
        return 0
    found = sync(check=args.check or args.status)
    if args.status:
        for en_path in english_notebooks():
            rel = str(en_path.relative_to(ROOT))
            mine = [f for f in found if f.startswith(f"{KO}/{rel}")]
            n_md = sum(c["cell_type"] == "markdown" for c in _read(en_path)["cells"])
            print(f"{KO}/{rel}: {n_md - len(mine)} of {n_md} markdown cells current"
                  + (f"; {len(mine)} to do" if mine else ""))
        return 0
    for line in found:
        print(line)
    return 1 if (found and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
