"""The learner's language: every sentence the library prints goes through `tr`, which looks it up
in the catalogs ``course_utils/locale/<lang>/*.json`` and fills in its ``{name}`` fields
(``str.format``). English is the key: a catalog maps the English text to its translation, with
the same fields; a missing message prints in English (tests/test_i18n.py fails on any).

`language` is ``$COURSE_LANG`` (``en`` or ``ko``) if set; else Korean where the notebook this
kernel runs is in ``ko/notebooks``, ``ko/exercises`` or ``ko/solutions``, as the front end tells
it (``JPY_SESSION_NAME`` in Jupyter Server 2, IPython's ``__session__``, VS Code's
``__vsc_ipynb_file__``, the kernel's working folder, Colab's sessions API: best effort, and
untested); else English.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import re
import sys
from pathlib import Path

__all__ = ["LANG_ENV", "LANGUAGES", "language", "tr", "catalog", "label", "install_display"]

LANG_ENV = "COURSE_LANG"
LANGUAGES = ("en", "ko")
_LOCALE = Path(__file__).with_name("locale")
_EDITION = re.compile(r"(^|/)ko/(notebooks|exercises|solutions)(/|$)")


def _front_end_paths() -> list[str]:
    """Where the notebook this kernel runs may be, as the front end tells it (most direct first)."""
    paths = [os.environ.get("JPY_SESSION_NAME", "")]
    try:  # lazy: IPython is only there in a kernel
        from IPython import get_ipython
        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None:
        paths += [v for v in (shell.user_ns.get(n) for n in ("__session__", "__vsc_ipynb_file__"))
                  if isinstance(v, str)]
    paths.append(os.getcwd())
    if "google.colab" in sys.modules:
        paths += _colab_session_paths()
    return [p.replace("\\", "/") for p in paths if p]


def _colab_session_paths() -> list[str]:
    """The paths of Colab's sessions (its kernel's local Jupyter API), or [] where unreachable."""
    host, port = os.environ.get("COLAB_JUPYTER_IP"), os.environ.get("KMP_TARGET_PORT")
    if not (host and port):
        return []
    try:  # lazy: only on Colab
        import urllib.parse
        import urllib.request
        with urllib.request.urlopen(f"http://{host}:{port}/api/sessions", timeout=1) as r:
            sessions = json.loads(r.read().decode())
        return [urllib.parse.unquote(str(s.get("path", ""))) for s in sessions]
    except (OSError, ValueError):
        return []


def language() -> str:
    """``"en"`` or ``"ko"``: ``$COURSE_LANG``, else the notebook's edition, else English.

    Raises:
        ValueError: ``$COURSE_LANG`` names no language the course is written in.
    """
    env = os.environ.get(LANG_ENV, "").strip().lower()
    if env:
        if env not in LANGUAGES:
            raise ValueError(f"{LANG_ENV}={env!r}: the course is written in "
                             f"{', '.join(LANGUAGES)}.")
        return env
    return "ko" if any(_EDITION.search(p) for p in _front_end_paths()) else "en"


@functools.lru_cache(maxsize=None)
def catalog(lang: str) -> dict[str, str]:
    """The message catalog of ``lang``: English text -> translation (empty for English), merged
    from ``course_utils/locale/<lang>/*.json``.

    Raises:
        ValueError: an unknown language, or one English text translated two ways.
    """
    if lang not in LANGUAGES:
        raise ValueError(f"unknown language {lang!r}: expected one of {', '.join(LANGUAGES)}.")
    merged: dict[str, str] = {}
    for path in sorted((_LOCALE / lang).glob("*.json")) if lang != "en" else []:
        for en, text in json.loads(path.read_text(encoding="utf-8")).items():
            if merged.get(en, text) != text:
                raise ValueError(f"{path.name}: {en!r} is translated two ways in the catalog.")
            merged[en] = text
    return merged


def tr(text: str, /, **fields) -> str:
    """``text`` in the learner's language (`language`), its ``{name}`` fields filled from
    ``fields``: ``tr("{n} rounds", n=9)`` is ``"9회"`` in Korean.

    Raises:
        KeyError: a field the text names and ``fields`` lacks (a programming error).
    """
    translated = catalog(language()).get(text, text)
    return translated.format(**fields) if fields else translated


def label(text):
    """A table label in the learner's language (`tr` without fields); ``"block 3"`` without a
    translation of its own uses the catalog's ``"block {i}"``; a label that is not a string stays."""
    if not isinstance(text, str):
        return text
    texts = catalog(language())
    if text not in texts and (m := re.fullmatch(r"(.+) (\d+)", text)):
        if f"{m[1]} {{i}}" in texts:
            return tr(f"{m[1]} {{i}}", i=int(m[2]))
    return tr(text)


def install_display() -> bool:
    """In a kernel whose language is not English, show every pandas DataFrame and Styler with
    its labels translated (`label`), on a copy for display only: code reading a table by its
    English column names works in every edition.
    Returns True when installed (idempotent), False outside IPython or in English."""
    if language() == "en":
        return False
    try:  # lazy: IPython and pandas are only needed in a kernel
        import pandas as pd
        from IPython import get_ipython
        from pandas.io.formats.style import Styler
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False

    def shown(df):
        out = df.rename(columns=label, index=label)
        out.columns.names = [label(n) for n in out.columns.names]
        out.index.names = [label(n) for n in out.index.names]
        return out

    def styled(st):
        out = copy.deepcopy(st)    # its styles name columns in English: relabel, do not rename
        data = out.data.copy(deep=False)   # new Index objects: older pandas share them on copy
        data.index = data.index.set_names([label(n) for n in data.index.names])
        data.columns = data.columns.set_names([label(n) for n in data.columns.names])
        out.data, out.index, out.columns = data, data.index, data.columns
        return out.format_index(label, axis=0).format_index(label, axis=1)._repr_html_()

    formatters = shell.display_formatter.formatters
    formatters["text/html"].for_type(pd.DataFrame, lambda df: shown(df)._repr_html_())
    formatters["text/html"].for_type(Styler, styled)
    formatters["text/plain"].for_type(
        pd.DataFrame, lambda df, p, cycle: p.text(repr(shown(df))))
    return True
