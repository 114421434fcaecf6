"""Auto-checked conceptual questions for the graded exercises ("interview questions").

A question's answer is a choice (``"b"``) or a number. The test cell that checks it stores only
a salted hash of the answer and the explanation in base64, so the released exercise does not show
the answer in plain text (a determined learner can still try every choice: these questions teach,
they do not examine). When the answer is right, the explanation is printed; when it is wrong, an
``AssertionError`` gives the hint (where in the course to look), never the answer.

Authoring (once, in a Python shell)::

    >>> from course_utils import quiz
    >>> quiz.author("bf16-no-scaler", "b", "bf16 has fp32's 8 exponent bits, so ...")
    # paste the printed check(...) call into the question's test cell

In the exercise::

    answer_bf16 = "b"            # the learner's answer
    quiz.check("bf16-no-scaler", answer_bf16, key="...", explanation="...", hint="...",
               choices="abcd")

Numbers are compared after rounding to ``digits`` decimals (``digits=0``: integers), so a
question that asks for a number says how to round it.

**Question banks** keep the explanation out of the cell the learner reads (issue 24 item 7): a
bank is a JSON file ``course_utils/quizzes/<exercise>.json`` of ``{question: {"key", "hint",
"explanation", "choices" | "digits"}}`` (the explanation in plain text, the answer only as its
`answer_key`), and the test cell is just ``quiz.check("no-sync", answer_no_sync())``. Authors add
an entry with ``quiz.author(question, answer, explanation, hint=..., bank="04_scaling_out")``.
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
import textwrap
from pathlib import Path

__all__ = ["answer_key", "encode", "check", "author", "BANK_DIR", "question_bank"]

#: Where the question banks are (one JSON file per exercise; see the module docstring).
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


def question_bank(folder: str | Path | None = None) -> dict:
    """Every question of the banks in ``folder`` (default `BANK_DIR`), by id.

    Raises:
        ValueError: a question id in two banks, or an entry without ``key``, ``hint`` and
            ``explanation``.
    """
    out: dict = {}
    for path in sorted(Path(folder or BANK_DIR).glob("*.json")):
        for qid, entry in json.loads(path.read_text(encoding="utf-8")).items():
            if qid in out:
                raise ValueError(f"question {qid!r} is in two banks ({path.name} and another).")
            if not {"key", "hint", "explanation"} <= set(entry):
                raise ValueError(f"{path.name}: question {qid!r} needs key, hint and explanation.")
            out[qid] = entry
    return out


def check(question: str, answer, *, key: str | None = None, explanation: str | None = None,
          hint: str | None = None, choices: str | None = None, digits: int | None = None) -> None:
    """Check a learner's answer; print the explanation (once) if it is right.

    Args:
        question: the question's id (as given to `answer_key`).
        answer: the learner's answer.
        key: `answer_key` of the right answer; None: the question comes from the banks
            (`question_bank`), with its explanation, hint, choices and digits.
        explanation: `encode`-d explanation, printed after a right answer.
        hint: where to look (shown with a wrong answer; never the answer itself).
        choices: for a choice question, the valid letters (e.g. ``"abcd"``).
        digits: for a number question, the decimals the answer is rounded to.

    Returns:
        None: a cell that ends with this call shows the explanation once (printed), not a
        second time as the cell's value.

    Raises:
        AssertionError: the answer is missing, not one of ``choices``, or wrong (with the hint).
        ValueError: no ``key`` and no bank holds the question.
    """
    if key is None:
        bank = question_bank()
        if question not in bank:
            raise ValueError(f"no question bank in {BANK_DIR} holds {question!r}.")
        entry = bank[question]
        key, hint = entry["key"], entry["hint"]
        explanation = encode(entry["explanation"])
        choices, digits = entry.get("choices"), entry.get("digits")
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
           choices: str | None = "abcd", hint: str = "...", bank: str | None = None) -> str:
    """The ``check(...)`` call to paste into a question's test cell (for course authors).

    With ``bank`` (an exercise's name, e.g. ``"04_scaling_out"``), the question is written into
    ``BANK_DIR / f"{bank}.json"`` (added or replaced) and the call is just
    ``quiz.check('<question>', answer)``.
    """
    if bank is not None:
        path = BANK_DIR / f"{bank}.json"
        entries = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        entries[question] = {"key": answer_key(question, answer, digits), "hint": hint,
                             "explanation": explanation,
                             **({"choices": choices} if digits is None else {"digits": digits})}
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        call = f"quiz.check({question!r}, answer)"
        print(call)
        return call
    args = [repr(question), "answer", f"key={answer_key(question, answer, digits)!r}",
            f"explanation={encode(explanation)!r}", f"hint={hint!r}"]
    if digits is None:
        args.append(f"choices={choices!r}")
    else:
        args.append(f"digits={digits}")
    call = "quiz.check(" + ", ".join(args) + ")"
    print(call)
    return call
