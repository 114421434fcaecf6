"""Auto-checked conceptual questions for the graded exercises: ``quiz.check("bf16-no-scaler",
answer)`` checks a choice (``"b"``) or a number (rounded to ``digits`` decimals) against a bank,
``course_utils/quizzes/<exercise>.json``, that stores only the answer's salted hash (`answer_key`)
and the explanation sealed with the answer (`seal`): neither the cell nor the file gives it away.
A wrong answer gets the hint. `author` adds a question; `translate` adds a language, which
`check` prints to a learner of that language (`course_utils.i18n.language`).
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
import textwrap
from pathlib import Path

from .i18n import language, tr

__all__ = ["BANK_DIR", "answer_key", "seal", "unseal", "bank_entry", "question_bank", "check",
           "author", "translate"]

#: Where the question banks are: one JSON file per exercise, ``{question: entry}``.
BANK_DIR = Path(__file__).resolve().parent / "quizzes"


def _salted(question: str, answer, digits: int | None) -> str:
    """``question:answer``, the answer normalised."""
    if digits is None:
        if not isinstance(answer, str):
            raise TypeError(tr("this question takes a choice (a letter such as 'b'), got {kind} "
                               "{answer!r}.", kind=type(answer).__name__, answer=answer))
        return f"{question}:{answer.strip().lower()}"
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(answer):
        raise TypeError(tr("this question takes a finite number, got {answer!r}.", answer=answer))
    return f"{question}:{round(float(answer), digits):.{digits}f}"


def answer_key(question: str, answer, digits: int | None = None) -> str:
    """The first 16 hex digits of SHA-256 of ``question:answer``, a choice's case and surrounding
    spaces ignored (``digits`` None), a number rounded to ``digits`` decimals.

    Raises:
        TypeError: a number for a choice question or the reverse.
    """
    return hashlib.sha256(_salted(question, answer, digits).encode("utf-8")).hexdigest()[:16]


def _xor(question: str, answer, digits: int | None, raw: bytes) -> bytes:
    """``raw`` XOR a keystream of SHA-256 blocks of ``question:answer:i``."""
    key = _salted(question, answer, digits)
    blocks = (hashlib.sha256(f"{key}:{i}".encode("utf-8")).digest()
              for i in range(math.ceil(len(raw) / 32)))
    return bytes(a ^ b for a, b in zip(raw, b"".join(blocks)))


def seal(question: str, answer, text: str, digits: int | None = None) -> str:
    """``text`` sealed with the right answer to ``question``: its UTF-8 bytes XOR a SHA-256
    keystream of ``question:answer``, in base64. Only that answer opens it (`unseal`).

    Raises:
        TypeError: a number for a choice question or the reverse.
    """
    return base64.b64encode(_xor(question, answer, digits, text.encode("utf-8"))).decode("ascii")


def unseal(question: str, answer, sealed: str, digits: int | None = None) -> str:
    """The text `seal` sealed, opened with ``answer`` (garbage with a wrong one).

    Raises:
        TypeError: a number for a choice question or the reverse.
    """
    return _xor(question, answer, digits, base64.b64decode(sealed.encode("ascii"))).decode("utf-8")


def bank_entry(question: str, answer, explanation: str, hint: str,
               choices: str | None = "abcd", digits: int | None = None) -> dict:
    """The bank entry of ``question``: key, hint, sealed explanation, ``choices`` or ``digits``.

    Raises:
        TypeError: a number for a choice question or the reverse.
    """
    entry = {"key": answer_key(question, answer, digits), "hint": hint,
             "explanation": seal(question, answer, explanation, digits)}
    entry.update({"choices": choices} if digits is None else {"digits": digits})
    return entry


def question_bank(folder: str | Path | None = None) -> dict:
    """Every question of the banks in ``folder`` (default `BANK_DIR`), by id.

    Raises:
        ValueError: a question id in two banks, or an entry without key, hint or explanation.
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


def check(question: str, answer) -> None:
    """Check a learner's answer to a banked question; print its explanation if it is right
    (returns None: a cell ending with this call shows it once).

    Raises:
        AssertionError: the answer is missing, not one of the choices, or wrong (with the hint).
        ValueError: no bank holds the question (an authoring error).
    """
    bank = question_bank()
    if question not in bank:
        raise ValueError(f"no question bank in {BANK_DIR} holds {question!r}.")
    entry = bank[question]
    digits, choices = entry.get("digits"), entry.get("choices")
    words = {**entry, **entry.get(language(), {})}
    if answer is None or answer is Ellipsis:
        raise AssertionError(tr("{question}: no answer yet. Set the answer variable above.",
                                question=question))
    if choices is not None and (not isinstance(answer, str) or len(answer.strip()) != 1
                                or answer.strip().lower() not in choices.lower()):
        raise AssertionError(tr("{question}: answer with one of the letters {letters}; yours is "
                                "{answer!r}.", question=question, letters=", ".join(choices),
                                answer=answer))
    try:
        right = answer_key(question, answer, digits) == entry["key"]
    except TypeError as e:
        raise AssertionError(f"{question}: {e}") from None
    if not right:
        raise AssertionError(tr("{question}: not this one. Hint: {hint}", question=question,
                                hint=words["hint"]))
    text = unseal(question, answer, words["explanation"], digits)
    # Hangul is twice as wide as Latin letters
    print(textwrap.fill(tr("Right. {explanation}", explanation=text),
                        width=100 if language() == "en" else 50))


def author(question: str, answer, explanation: str, *, hint: str, bank: str,
           choices: str | None = "abcd", digits: int | None = None) -> str:
    """Write ``question`` into ``BANK_DIR / f"{bank}.json"`` (``bank``: the exercise's name,
    ``"04_scaling_out"``) and return the call its test cell makes.

    Raises:
        TypeError: a number for a choice question or the reverse.
    """
    path = BANK_DIR / f"{bank}.json"
    entries = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    entries[question] = bank_entry(question, answer, explanation, hint, choices, digits)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(entries, indent=1, ensure_ascii=False, sort_keys=True) + "\n",
                    encoding="utf-8")
    call = f"quiz.check({question!r}, answer)"
    print(call)
    return call


def translate(question: str, answer, lang: str, explanation: str, hint: str, *, bank: str) -> None:
    """Add ``question``'s explanation (sealed with the right ``answer``) and hint in ``lang`` to
    its entry in ``BANK_DIR / f"{bank}.json"``.

    Raises:
        ValueError: no such question in that bank, or ``answer`` is not its right answer.
    """
    path = BANK_DIR / f"{bank}.json"
    entries = json.loads(path.read_text(encoding="utf-8"))
    if question not in entries:
        raise ValueError(f"{path.name} has no question {question!r}.")
    entry = entries[question]
    digits = entry.get("digits")
    if answer_key(question, answer, digits) != entry["key"]:
        raise ValueError(f"{answer!r} is not the right answer to {question!r}: the explanation "
                         "is sealed with the right one.")
    entry[lang] = {"hint": hint, "explanation": seal(question, answer, explanation, digits)}
    path.write_text(json.dumps(entries, indent=1, ensure_ascii=False, sort_keys=True) + "\n",
                    encoding="utf-8")
