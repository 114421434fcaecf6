"""Auto-checked conceptual questions for the graded exercises ("interview questions").

A question's answer is a choice (``"b"``) or a number. The test cell that checks it stores only
a salted hash of the answer, so the released exercise does not show the answer; the explanation
lives here, in `course_utils.quiz_explanations` (keyed by the question's id), out of the cell
the learner reads, and is printed only after a right answer. (A determined learner can still try
every choice or read the module: these questions teach, they do not examine.) A wrong answer
raises an ``AssertionError`` with the hint (the lesson section to reread), never the answer.

Authoring (once, in a Python shell)::

    >>> from course_utils import quiz
    >>> quiz.author("bf16-no-scaler", "b", hint="lesson 01, §3 ...")
    # add the explanation to course_utils/quiz_explanations.py under "bf16-no-scaler",
    # then paste the printed check(...) call into the question's test cell

In the exercise::

    answer_bf16 = "b"            # the learner's answer
    quiz.check("bf16-no-scaler", answer_bf16, key="...", hint="...", choices="abcd")

Numbers are compared after rounding to ``digits`` decimals (``digits=0``: integers), so a
question that asks for a number says how to round it. An older test cell may still pass its
explanation as base64 (``explanation=``, `encode`).
"""
from __future__ import annotations

import base64
import hashlib
import math
import textwrap

__all__ = ["answer_key", "encode", "check", "author", "explanation_for"]


def _normalise(answer, digits: int | None) -> str:
    if digits is None:
        if not isinstance(answer, str):
            raise TypeError(f"this question takes a choice (a letter such as 'b'), got "
                            f"{type(answer).__name__} {answer!r}.")
        return answer.strip().lower()
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(answer):
        raise TypeError(f"this question takes a finite number, got {answer!r}.")
    return f"{round(float(answer), digits):.{digits}f}"


def answer_key(question: str, answer, digits: int | None = None) -> str:
    """The key a test cell stores: the first 16 hex digits of SHA-256 of ``question:answer``.

    Args:
        question: the question's id (the salt: equal answers to different questions differ).
        answer: a choice (string, case and surrounding spaces ignored) or a number.
        digits: ``None`` for a choice; for a number, the decimals it is rounded to.

    Raises:
        TypeError: a number for a choice question or the reverse.
    """
    text = f"{question}:{_normalise(answer, digits)}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def encode(text: str) -> str:
    """``text`` as base64 (UTF-8), the form a test cell stores an explanation in."""
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


def explanation_for(question: str) -> str:
    """The explanation of ``question`` kept in `course_utils.quiz_explanations`.

    Raises:
        ValueError: no explanation is kept for ``question`` (an authoring error).
    """
    from .quiz_explanations import EXPLANATIONS  # the texts load only when a question is checked
    if question not in EXPLANATIONS:
        raise ValueError(f"no explanation for question {question!r} in "
                         "course_utils/quiz_explanations.py: add one there.")
    return EXPLANATIONS[question]


def check(question: str, answer, *, key: str, hint: str, explanation: str | None = None,
          choices: str | None = None, digits: int | None = None) -> None:
    """Check a learner's answer; print the explanation (once) if it is right.

    Args:
        question: the question's id (as given to `answer_key`).
        answer: the learner's answer.
        key: `answer_key` of the right answer.
        hint: where to look (shown with a wrong answer; never the answer itself).
        explanation: None (the default): `explanation_for` ``question``, out of the cell; or an
            `encode`-d text (older cells).
        choices: for a choice question, the valid letters (e.g. ``"abcd"``).
        digits: for a number question, the decimals the answer is rounded to.

    Returns:
        None: a cell that ends with this call shows the explanation once (printed), not a
        second time as the cell's value.

    Raises:
        AssertionError: the answer is missing, not one of ``choices``, or wrong (with the hint).
        ValueError: no explanation kept for ``question`` and none given.
    """
    if answer is None or answer is Ellipsis:
        raise AssertionError(f"{question}: no answer yet. Set the answer variable above.")
    if choices is not None:
        if not isinstance(answer, str) or answer.strip().lower() not in choices.lower():
            raise AssertionError(f"{question}: answer with one of the letters "
                                 f"{', '.join(choices)}; yours is {answer!r}.")
    try:
        got = answer_key(question, answer, digits)
    except TypeError as e:
        raise AssertionError(f"{question}: {e}") from None
    if got != key:
        raise AssertionError(f"{question}: not this one. Hint: {hint}")
    text = (explanation_for(question) if explanation is None
            else base64.b64decode(explanation.encode("ascii")).decode("utf-8"))
    print(textwrap.fill(f"Right. {text}", width=100))


def author(question: str, answer, explanation: str | None = None, digits: int | None = None,
           choices: str | None = "abcd", hint: str = "...") -> str:
    """The ``check(...)`` call to paste into a question's test cell (for course authors).

    The explanation belongs in `course_utils.quiz_explanations` under ``question``; the call
    carries it (base64) only when ``explanation`` is given, for a question kept nowhere else."""
    args = [repr(question), "answer", f"key={answer_key(question, answer, digits)!r}"]
    if explanation is not None:
        args.append(f"explanation={encode(explanation)!r}")
    args.append(f"hint={hint!r}")
    if digits is None:
        args.append(f"choices={choices!r}")
    else:
        args.append(f"digits={digits}")
    call = "quiz.check(" + ", ".join(args) + ")"
    print(call)
    return call
