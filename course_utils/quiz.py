"""Auto-checked conceptual questions for the graded exercises ("interview questions").

A question's answer is a choice (``"b"``) or a number. The checker stores only a salted hash of
the right answer, so the released exercise does not show it in plain text (a determined learner
can still try every choice: these questions teach, they do not examine). When the answer is
right, the explanation is printed; when it is wrong, an ``AssertionError`` gives the hint (the
lesson section to read again), never the answer.

Two ways to store a question:

* **A question bank** (`ask`): the test cell reads ``quiz.ask("bf16-no-scaler", answer)`` and
  nothing more. The key, hint and explanation live in ``course_utils/quizzes/<exercise>.json``,
  the explanation *sealed* with the right answer (`seal`: XOR with a SHA-256 keystream of
  ``question:answer``), so it stays hidden until that answer is given, also from a learner
  who opens the file.
* Inline (`check`): the cell carries the key and the base64 explanation itself.

Authoring a bank entry (once, in a Python shell)::

    >>> from course_utils import quiz
    >>> quiz.bank_entry("bf16-no-scaler", "c", "bf16 has fp32's 8 exponent bits, so ...",
    ...                 hint="lesson 01 §1 (number formats)")
    # add the printed entry to course_utils/quizzes/<exercise>.json

Numbers are compared after rounding to ``digits`` decimals (``digits=0``: integers), so a
question that asks for a number says how to round it.
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
import textwrap
from pathlib import Path

__all__ = ["answer_key", "encode", "check", "author", "BANK_DIR", "seal", "unseal",
           "bank_entry", "ask"]

#: Where the question banks live: one JSON file per exercise, ``{question: entry}``.
BANK_DIR = Path(__file__).resolve().parent / "quizzes"


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


def check(question: str, answer, *, key: str, explanation: str, hint: str,
          choices: str | None = None, digits: int | None = None) -> None:
    """Check a learner's answer; print the explanation (once) if it is right.

    Args:
        question: the question's id (as given to `answer_key`).
        answer: the learner's answer.
        key: `answer_key` of the right answer.
        explanation: `encode`-d explanation, printed after a right answer.
        hint: where to look (shown with a wrong answer; never the answer itself).
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
    text = base64.b64decode(explanation.encode("ascii")).decode("utf-8")
    print(textwrap.fill(f"Right. {text}", width=100))


def author(question: str, answer, explanation: str, digits: int | None = None,
           choices: str | None = "abcd", hint: str = "...") -> str:
    """The ``check(...)`` call to paste into a question's test cell (for course authors)."""
    args = [repr(question), "answer", f"key={answer_key(question, answer, digits)!r}",
            f"explanation={encode(explanation)!r}", f"hint={hint!r}"]
    if digits is None:
        args.append(f"choices={choices!r}")
    else:
        args.append(f"digits={digits}")
    call = "quiz.check(" + ", ".join(args) + ")"
    print(call)
    return call


def _keystream(question: str, normalised: str, n: int) -> bytes:
    out, i = b"", 0
    while len(out) < n:
        out += hashlib.sha256(f"{question}:{normalised}:{i}".encode("utf-8")).digest()
        i += 1
    return out[:n]


def seal(question: str, answer, text: str, digits: int | None = None) -> str:
    """``text`` sealed with the right answer to ``question``: its UTF-8 bytes XOR a SHA-256
    keystream of ``question:answer`` (`answer_key`'s normalisation), in base64. Only that
    answer opens it (`unseal`).

    Raises:
        TypeError: a number for a choice question or the reverse.
    """
    raw = text.encode("utf-8")
    ks = _keystream(question, _normalise(answer, digits), len(raw))
    return base64.b64encode(bytes(a ^ b for a, b in zip(raw, ks))).decode("ascii")


def unseal(question: str, answer, sealed: str, digits: int | None = None) -> str:
    """The text `seal` sealed, opened with ``answer`` (garbage, or a UnicodeDecodeError, with
    a wrong one: check the answer's key first).

    Raises:
        TypeError: a number for a choice question or the reverse.
    """
    raw = base64.b64decode(sealed.encode("ascii"))
    ks = _keystream(question, _normalise(answer, digits), len(raw))
    return bytes(a ^ b for a, b in zip(raw, ks)).decode("utf-8")


def bank_entry(question: str, answer, explanation: str, hint: str,
               choices: str | None = "abcd", digits: int | None = None) -> dict:
    """The entry of ``question`` for a question bank (for course authors): the answer's key,
    the hint, the explanation sealed with the answer, and ``choices`` or ``digits``.

    Raises:
        TypeError: a number for a choice question or the reverse.
    """
    entry = {"key": answer_key(question, answer, digits), "hint": hint,
             "explanation": seal(question, answer, explanation, digits)}
    entry.update({"choices": choices} if digits is None else {"digits": digits})
    return entry


def _entry(question: str) -> dict:
    found = {}
    for path in sorted(BANK_DIR.glob("*.json")):
        bank = json.loads(path.read_text(encoding="utf-8"))
        if question in bank:
            found[path.name] = bank[question]
    if len(found) != 1:
        where = ", ".join(found) if found else f"no bank in {BANK_DIR}"
        raise KeyError(f"question {question!r}: expected in exactly one bank, found in {where}.")
    return next(iter(found.values()))


def ask(question: str, answer) -> None:
    """Check a learner's answer to a question of a bank (`BANK_DIR`); print the explanation,
    opened with the answer, if it is right.

    Returns:
        None: a cell that ends with this call shows the explanation once.

    Raises:
        AssertionError: the answer is missing, not one of the question's choices, or wrong
            (with the hint: the lesson section to read again).
        KeyError: the question is in no bank, or in more than one.
    """
    e = _entry(question)
    digits = e.get("digits")
    if answer is None or answer is Ellipsis:
        raise AssertionError(f"{question}: no answer yet. Set the answer variable above.")
    choices = e.get("choices")
    if choices is not None and (not isinstance(answer, str) or len(answer.strip()) != 1
                                or answer.strip().lower() not in choices.lower()):
        raise AssertionError(f"{question}: answer with one of the letters "
                             f"{', '.join(choices)}; yours is {answer!r}.")
    try:
        right = answer_key(question, answer, digits) == e["key"]
    except TypeError as err:
        raise AssertionError(f"{question}: {err}") from None
    if not right:
        raise AssertionError(f"{question}: not this one. Hint: {e['hint']}")
    print(textwrap.fill(f"Right. {unseal(question, answer, e['explanation'], digits)}", width=100))

