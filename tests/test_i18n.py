"""The learner's language (course_utils.i18n), Hangul in charts, and the Korean edition's sync tool
(tools/editions.py)."""
import io
import json
import sys
import warnings
from pathlib import Path

import matplotlib
import pytest

from course_utils import i18n
from course_utils.plots import _style

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import editions  # noqa: E402


@pytest.fixture
def no_front_end(monkeypatch, tmp_path):
    monkeypatch.delenv("COURSE_LANG", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)


def test_language_from_the_environment_then_the_notebook_edition(no_front_end, monkeypatch,
                                                                    tmp_path):
    assert i18n.language() == "en"
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/me/course/ko/notebooks/01_amp_review.ipynb")
    assert i18n.language() == "ko"
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/ko/course/notebooks/01_amp_review.ipynb")
    assert i18n.language() == "en"  # a folder named ko elsewhere in the path is no edition
    monkeypatch.delenv("JPY_SESSION_NAME")
    (tmp_path / "ko" / "exercises").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "ko" / "exercises")  # nbclient and Jupyter start kernels here
    assert i18n.language() == "ko"
    monkeypatch.setenv("COURSE_LANG", "en")  # the environment decides first
    assert i18n.language() == "en"
    monkeypatch.setenv("COURSE_LANG", "fr")
    with pytest.raises(ValueError, match="written in en, ko"):
        i18n.language()


def test_tr_translates_and_fills_fields_and_falls_back_to_english(no_front_end, monkeypatch):
    i18n.catalog.cache_clear()
    monkeypatch.setattr(i18n, "catalog", lambda lang: {"{n} rounds": "{n}회"} if lang == "ko" else {})
    assert i18n.tr("{n} rounds", n=9) == "9 rounds"
    monkeypatch.setenv("COURSE_LANG", "ko")
    assert i18n.tr("{n} rounds", n=9) == "9회"
    assert i18n.tr("not in the catalog {x}", x=1) == "not in the catalog 1"


def test_every_korean_message_keeps_the_fields_of_its_english_text():
    import string
    fields = lambda text: sorted(f for _, f, _, _ in string.Formatter().parse(text) if f)  # noqa: E731
    i18n.catalog.cache_clear()
    for en, ko in i18n.catalog("ko").items():
        assert fields(en) == fields(ko), (en, ko)


def _draw(text: str, caplog=None) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = _style.new_figure((3, 1.5))
        fig.add_subplot().set_title(text)
        fig.suptitle(text, fontweight="bold")
        fig.savefig(io.BytesIO(), format="png")
    found = [str(w.message) for w in caught if "missing from" in str(w.message)]
    if caplog is not None:  # matplotlib logs "findfont: Failed to find font weight bold ..."
        found += [r.getMessage() for r in caplog.records if "findfont" in r.getMessage()]
    return found


def test_hangul_is_drawn_in_a_font_that_has_it_and_would_be_boxes_without_it(monkeypatch, caplog):
    """A Korean label renders with no glyph missing (matplotlib warns "Glyph ... missing from
    font(s)" for each box it draws); the same label without the bundled font does warn."""
    label = "활성화 체크포인팅: 피크 메모리 −12 MiB"
    with matplotlib.rc_context():
        assert _style.use_hangul_font()
        assert _draw(label, caplog) == []   # no box, and a bold title finds a bold face
    with matplotlib.rc_context({"font.family": ["DejaVu Sans"]}):
        monkeypatch.setattr(_style, "use_hangul_font", lambda: False)
        assert _draw(label), "DejaVu Sans alone has no Hangul: the check above could not fail"


def _nb(cells):
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _md(cid, text):
    return {"cell_type": "markdown", "id": cid, "metadata": {}, "source": [text]}


def _code(cid, text):
    return {"cell_type": "code", "id": cid, "metadata": {}, "source": [text],
            "outputs": [], "execution_count": None}


@pytest.fixture
def course(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "solutions").mkdir()
    en = _nb([_md("title", "# Lesson\n[![Open In Colab](x)](https://colab.research.google.com/"
                           "github/o/r/blob/main/notebooks/01_a.ipynb)"),
              _code("c1", "x = 1\n"), _md("m1", "Some words.")])
    (tmp_path / "notebooks" / "01_a.ipynb").write_text(json.dumps(en))
    return tmp_path


def test_editions_generate_check_and_accept(course):
    found = editions.sync(course)
    ko_path = course / "ko" / "notebooks" / "01_a.ipynb"
    ko = json.loads(ko_path.read_text())
    assert [c["id"] for c in ko["cells"]] == ["title", "c1", "m1"]
    assert "blob/main/ko/notebooks/01_a.ipynb" in "".join(ko["cells"][0]["source"])
    assert sorted(found) == sorted([f"ko/notebooks/01_a.ipynb [{i}]: not translated"
                                    for i in ("title", "m1")])
    ko["cells"][2]["source"] = ["몇 마디."]  # translate one cell and accept it
    ko_path.write_text(json.dumps(ko))
    assert editions.accept(ko_path, [], course) == ["m1"]
    assert editions.sync(course, check=True) == ["ko/notebooks/01_a.ipynb [title]: not translated"]
    # an English change makes the translation stale; a code change is carried over by a sync
    en_path = course / "notebooks" / "01_a.ipynb"
    en = json.loads(en_path.read_text())
    en["cells"][2]["source"] = ["Some other words."]
    en["cells"][1]["source"] = ["x = 2\n"]
    en_path.write_text(json.dumps(en))
    stale = editions.sync(course, check=True)
    assert "ko/notebooks/01_a.ipynb [c1]: code differs from the English cell" in stale
    assert "ko/notebooks/01_a.ipynb [m1]: the English cell changed since it was translated" in stale
    after = editions.sync(course)
    assert "ko/notebooks/01_a.ipynb [m1]: the English cell changed since it was translated" in after
    assert not any("code differs" in f for f in after)
    assert json.loads(ko_path.read_text())["cells"][2]["source"] == ["몇 마디."]  # kept
    # a cell in one edition only
    en["cells"].append(_md("m2", "New."))
    en_path.write_text(json.dumps(en))
    assert any("only in English: ['m2']" in f for f in editions.sync(course, check=True))
    with pytest.raises(ValueError, match="no markdown cell"):
        editions.accept(ko_path, ["nope"], course)


def test_a_korean_kernel_shows_table_labels_translated_and_keeps_them_in_code(no_front_end,
                                                                              monkeypatch):
    import pandas as pd
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()
    monkeypatch.setattr("IPython.get_ipython", lambda: shell)
    monkeypatch.setattr(i18n, "catalog", lambda lang: {"peak MiB": "최대 할당 메모리 MiB",
                                                       "config": "구성"} if lang == "ko" else {})
    df = pd.DataFrame({"config": ["fp32"], "peak MiB": [1.5]}).set_index("config")
    assert not i18n.install_display()            # English: nothing to install
    monkeypatch.setenv("COURSE_LANG", "ko")
    assert i18n.install_display()
    html = shell.display_formatter.formatters["text/html"](df)
    assert "최대 할당 메모리 MiB" in html and "구성" in html and "peak MiB" not in html
    assert list(df.columns) == ["peak MiB"] and df.index.name == "config"   # the table itself
    # a Styler too (the claims ledger, lesson 01's formats): labels relabelled, styles kept
    styler = df.style.map(lambda v: "color: red", subset=["peak MiB"])
    html = shell.display_formatter.formatters["text/html"](styler)
    assert "최대 할당 메모리 MiB" in html and "구성" in html and "peak MiB" not in html
    assert "color: red" in html and df.index.name == "config"
    from pandas.io.formats.style import Styler
    shell.display_formatter.formatters["text/html"].pop(Styler)
    shell.display_formatter.formatters["text/html"].pop(pd.DataFrame)
    shell.display_formatter.formatters["text/plain"].pop(pd.DataFrame)


def test_a_numbered_label_takes_its_numbered_translation(no_front_end, monkeypatch):
    """Issue 28: lesson 05's per-block rows ("block 0", "block 1") show as 블록 0, 블록 1."""
    monkeypatch.setenv("COURSE_LANG", "ko")
    i18n.catalog.cache_clear()
    assert [i18n.label(t) for t in ("block 0", "block 12", "outside the blocks", "fp16 2", 3)] == [
        "블록 0", "블록 12", "블록 바깥", "fp16 2", 3]


def _tr_calls():
    """Every tr("...") call with a literal text in course_utils and in the English notebooks'
    code cells (the Korean ones run the same code): (file, text)."""
    import ast

    from nbcells import code
    sources = [(path, path.read_text()) for path in sorted((ROOT / "course_utils").rglob("*.py"))]
    sources += [(path, code(path)) for folder in ("notebooks", "exercises", "solutions")
                for path in sorted((ROOT / folder).glob("*.ipynb"))]
    for path, source in sources:
        for node in ast.walk(ast.parse(source)):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr",
                                                                                 "")) == "tr"
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                yield path.relative_to(ROOT).as_posix(), node.args[0].value


def test_every_message_the_library_speaks_has_its_korean_text():
    """Issue 28: every sentence the library prints goes through tr(); the Korean catalog has each
    one, with the same fields."""
    i18n.catalog.cache_clear()
    ko = i18n.catalog("ko")
    missing = sorted({f"{where}: {text!r}" for where, text in _tr_calls() if text not in ko})
    assert not missing, f"{len(missing)} message(s) without Korean text:\n" + "\n".join(missing[:20])


# ------------------------------------------------------------------ the Korean edition in step

def test_the_korean_edition_is_in_step_with_the_english_one():
    """Issue 28: every Korean notebook has the English one's cells and ids, code byte for byte,
    and every markdown cell translates the English cell as it is now (tools/editions.py)."""
    problems = editions.sync(ROOT, check=True)
    assert not problems, "\n".join(problems[:20]) + "\n(python tools/editions.py --status)"


def test_the_korean_exercises_are_released_and_grade_like_the_english_ones():
    """The Korean exercises are a fresh release of ko/solutions, and both editions' exercises
    have the same test cells, grade ids and points: a class is graded alike in either."""
    from course_grade import load_sources
    from course_grade.release import check_release
    assert check_release(ROOT / "ko" / "solutions", ROOT / "ko" / "exercises") == []
    en, ko = load_sources(ROOT / "solutions"), load_sources(ROOT / "ko" / "solutions")
    assert sorted(en) == sorted(ko)
    for name in en:
        assert en[name].tests == ko[name].tests, name
        assert en[name].max_points == ko[name].max_points > 0


def test_the_korean_readme_opens_every_korean_notebook():
    """README.ko.md has an "Open in Colab" badge for each Korean lesson and exercise, and each
    opens a file that exists."""
    import re
    readme = (ROOT / "README.ko.md").read_text(encoding="utf-8")
    targets = set(re.findall(r"colab\.research\.google\.com/github/[^/]+/[^/]+/blob/main/"
                             r"(ko/[\w/]+\.ipynb)", readme))
    wanted = {p.relative_to(ROOT).as_posix() for folder in ("notebooks", "exercises")
              for p in (ROOT / "ko" / folder).glob("[0-9][0-9]_*.ipynb")}
    assert wanted and wanted <= targets
    assert all((ROOT / t).is_file() for t in targets)


def test_a_korean_student_bundle_keeps_its_edition_folder(tmp_path):
    from course_grade.release import release_student
    written = {p.relative_to(tmp_path / "b").as_posix()
               for p in release_student(tmp_path / "b", ROOT / "ko" / "solutions")}
    assert "ko/notebooks/01_amp_review.ipynb" in written
    assert "ko/exercises/01_loss_scaling.ipynb" in written
    assert {"docs/method.ko.md", "docs/glossary.md", "README.ko.md"} <= written
    assert not any(p.startswith(("solutions/", "ko/solutions/")) for p in written)
