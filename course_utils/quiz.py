"""Auto-checked conceptual questions for the graded exercises ("interview questions").

A question's answer is a choice (``"b"``) or a number. The test cell that checks it stores only
a salted hash of the answer; the explanation, which gives the answer away, lives out of the
learner's sight until the answer is right: in a question bank of `course_utils.quizzes` (a module
per exercise, ``EXPLANATIONS = {question id: text}``), or, in older cells, base64 in the cell
itself. A determined learner can still try every choice: these questions teach, they do not
examine. When the answer is right, the explanation is printed; when it is wrong, an
``AssertionError`` gives the hint (where in the course to look), never the answer.

Authoring (once, in a Python shell), after adding the explanation to the exercise's bank::

    >>> from course_utils import quiz
    >>> quiz.author("bf16-no-scaler", "b", hint="lesson 01 §3")
    # paste the printed check(...) call into the question's test cell

In the exercise::

    answer_bf16 = "b"            # the learner's answer
    quiz.check("bf16-no-scaler", answer_bf16, key="...", hint="...", choices="abcd")

Numbers are compared after rounding to ``digits`` decimals (``digits=0``: integers), so a
question that asks for a number says how to round it.
"""
from __future__ import annotations

import base64
import hashlib
import importlib
import math
import pkgutil
import textwrap

from . import quizzes

__all__ = ["answer_key", "encode", "explanation_of", "check", "author"]


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


def explanation_of(question: str) -> str:
    """The explanation of ``question`` from the question banks (the ``EXPLANATIONS`` dict of each
    module of `course_utils.quizzes`).

    Raises:
        KeyError: no bank explains ``question``, or two do (the modules are named).
    """
    found = {}
    for info in pkgutil.iter_modules(quizzes.__path__):
        bank = importlib.import_module(f"{quizzes.__name__}.{info.name}")
        if question in getattr(bank, "EXPLANATIONS", {}):
            found[info.name] = bank.EXPLANATIONS[question]
    if len(found) != 1:
        raise KeyError(f"question {question!r} is explained by {len(found)} question banks "
                       f"({', '.join(found) or 'none'}) of course_utils.quizzes; it needs one.")
    return next(iter(found.values()))


def check(question: str, answer, *, key: str, hint: str, explanation: str | None = None,
          choices: str | None = None, digits: int | None = None) -> None:
    """Check a learner's answer; print the explanation (once) if it is right.

    Args:
        question: the question's id (as given to `answer_key`).
        answer: the learner's answer.
        key: `answer_key` of the right answer.
        hint: where to look (shown with a wrong answer; never the answer itself).
        explanation: None (default) to print the question bank's (`explanation_of`), or an
            `encode`-d explanation stored in the cell.
        choices: for a choice question, the valid letters (e.g. ``"abcd"``).
        digits: for a number question, the decimals the answer is rounded to.

    Returns:
        None: a cell that ends with this call shows the explanation once (printed), not a
        second time as the cell's value.

    Raises:
        AssertionError: the answer is missing, not one of ``choices``, or wrong (with the hint).
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
    text = (explanation_of(question) if explanation is None
            else base64.b64decode(explanation.encode("ascii")).decode("utf-8"))
    print(textwrap.fill(f"Right. {text}", width=100))


def author(question: str, answer, explanation: str | None = None, digits: int | None = None,
           choices: str | None = "abcd", hint: str = "...") -> str:
    """The ``check(...)`` call to paste into a question's test cell (for course authors):
    without ``explanation`` the call prints the question bank's (`explanation_of`); with one,
    the call carries it `encode`-d."""
    args = [repr(question), "answer", f"key={answer_key(question, answer, digits)!r}",
            f"hint={hint!r}"]
    if explanation is not None:
        args.insert(3, f"explanation={encode(explanation)!r}")
    if digits is None:
        args.append(f"choices={choices!r}")
    else:
        args.append(f"digits={digits}")
    call = "quiz.check(" + ", ".join(args) + ")"
    print(call)
    return call
