"""What grading produces: one SubmissionResult per file, one TestResult per test cell.

Every text in a result (the submission's path, messages, notes, the error) has passed through
:func:`clean_text`: learner code chooses its exception messages and cell ids, and learners choose
their file names, so terminal escape sequences and control characters are removed or escaped
before the grader prints or writes anything.
"""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import asdict, dataclass, field

# ANSI/VT escape sequences: CSI (ESC [ ... final), OSC (ESC ] ... BEL or ST), other ESC x, C1 CSI.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[@-Z\\-_]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
)
# Control (Cc), format (Cf: bidirectional overrides, zero-width), surrogate (Cs: undecodable
# bytes), line and paragraph separators: never written as such.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def clean_text(text: object) -> str:
    """``text`` made safe to print and to write to a CSV: one line, no terminal control.

    Terminal escape sequences (colours, cursor moves, OSC titles and links) are removed; any
    other control, format or surrogate character, newlines and tabs included, is written as its
    Python escape (``\\n``, ``\\x07``, ``\\u202e``, ``\\udcff``). Printable text is unchanged.
    """
    return _escape_unsafe(_ESCAPES.sub("", str(text)))


def _escape_unsafe(text: str) -> str:
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if unicodedata.category(ch) in _UNSAFE_CATEGORIES
        else ch
        for ch in text
    )


def display_path(path: str | os.PathLike) -> str:
    """A path as text that any terminal and any UTF-8 file accept.

    Bytes of the file name that are not UTF-8 are written as ``\\xNN`` (``backslashreplace``),
    and control characters as their escapes (a file name may hold a newline or ESC): nothing is
    removed, so two files never display alike.
    """
    raw = os.fsencode(path)
    return _escape_unsafe(raw.decode("utf-8", "backslashreplace"))


@dataclass
class TestResult:
    """One test cell of one submission: ``points`` of ``max_points``, status and first message.

    ``status`` is ``"pass"``, ``"fail"`` (the cell raised or timed out) or ``"not run"``
    (an earlier cell timed out beyond recovery, stopped or crashed the kernel, or the notebook
    ran out of time). Points are the source's ``nbgrader.points``.
    """

    __test__ = False  # not a pytest test class

    grade_id: str
    points: float
    max_points: float
    status: str
    message: str = ""


@dataclass
class SubmissionResult:
    """The grade of one submission (a file), or why it could not be graded (``error``).

    ``submission`` is the file's path as displayed (see :func:`display_path`); ``seconds`` is
    the wall-clock time its grading took.
    """

    submission: str
    source: str | None = None
    tests: list[TestResult] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    @property
    def graded(self) -> bool:
        """True if the submission was executed and scored (possibly with issues)."""
        return self.error is None

    @property
    def score(self) -> float:
        """Points earned (0 if not graded)."""
        return float(sum(test.points for test in self.tests))

    @property
    def max_score(self) -> float:
        """Points available in the matched source (0 if none matched or not graded)."""
        return float(sum(test.max_points for test in self.tests))

    def cleaned(self) -> "SubmissionResult":
        """This result with :func:`clean_text` applied to every text (returns ``self``)."""
        self.submission = _escape_unsafe(self.submission)
        self.source = None if self.source is None else clean_text(self.source)
        self.issues = [clean_text(issue) for issue in self.issues]
        self.error = None if self.error is None else clean_text(self.error)
        for test in self.tests:
            test.grade_id = clean_text(test.grade_id)
            test.message = clean_text(test.message)
        return self

    def to_dict(self) -> dict:
        """A JSON-ready dict: the fields plus ``graded``, ``score`` and ``max_score``."""
        data = asdict(self)
        data.update(graded=self.graded, score=self.score, max_score=self.max_score)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "SubmissionResult":
        """The result :meth:`to_dict` wrote (a line of the grading log), texts cleaned again.
        Raises ValueError if ``data`` is not such a dict."""
        try:
            tests = [
                TestResult(str(t["grade_id"]), float(t["points"]), float(t["max_points"]),
                           str(t["status"]), str(t.get("message", "")))
                for t in data.get("tests", [])
            ]
            result = cls(
                submission=str(data["submission"]),
                source=None if data.get("source") is None else str(data["source"]),
                tests=tests,
                issues=[str(issue) for issue in data.get("issues", [])],
                error=None if data.get("error") is None else str(data["error"]),
                seconds=float(data.get("seconds", 0.0)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"not a grading result: {type(error).__name__}: {error}") from None
        return result.cleaned()
