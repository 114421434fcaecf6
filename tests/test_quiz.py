"""The conceptual questions' checker: a test cell is quiz.check(question, answer); the question
bank holds the key, the hint and the explanation sealed with the right answer."""
import base64
import json
import re

import pytest

from course_utils import quiz


@pytest.fixture
def bank(tmp_path, monkeypatch):
    entries = {"bytes": quiz.bank_entry("bytes", 16, "4 + 4 + 8 bytes.", "lesson 01 §7", digits=0),
               "bf16": quiz.bank_entry("bf16", "c", "fp32's exponent range.", "lesson 01 §1")}
    (tmp_path / "01_x.json").write_text(json.dumps(entries))
    monkeypatch.setattr(quiz, "BANK_DIR", tmp_path)
    return tmp_path


def test_a_right_answer_opens_the_explanation_and_a_wrong_one_gets_the_hint(bank, capsys):
    assert "exponent" not in (bank / "01_x.json").read_text()   # not readable in the file
    assert quiz.check("bf16", " C ") is None   # a cell ending with it shows the text once
    assert capsys.readouterr().out.count("exponent range") == 1
    with pytest.raises(AssertionError, match="lesson 01 §1") as e:
        quiz.check("bf16", "a")
    assert "exponent" not in str(e.value) and capsys.readouterr().out == ""
    for bad in ("ab", "", "z", 3):
        with pytest.raises(AssertionError, match="one of the letters"):
            quiz.check("bf16", bad)
    with pytest.raises(AssertionError, match="no answer yet"):
        quiz.check("bf16", None)


def test_a_number_question_rounds_and_is_salted(bank, capsys):
    quiz.check("bytes", 16.2)
    assert "4 + 4 + 8" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="not this one"):
        quiz.check("bytes", 12)
    with pytest.raises(AssertionError, match="finite number"):
        quiz.check("bytes", "16")
    assert quiz.answer_key("other", 16, digits=0) != quiz.answer_key("bytes", 16, digits=0)


def test_a_question_in_no_bank_or_in_two_is_an_authoring_error(bank):
    with pytest.raises(ValueError, match="no question bank"):
        quiz.check("missing", "a")
    (bank / "02_y.json").write_text(json.dumps({"bf16": {"key": "k", "hint": "h",
                                                         "explanation": "e"}}))
    with pytest.raises(ValueError, match="two banks"):
        quiz.question_bank()


def test_a_sealed_explanation_opens_only_with_the_right_answer():
    sealed = quiz.seal("q3", "b", "bf16 keeps fp32's exponent bits.")
    assert "exponent" not in sealed
    assert quiz.unseal("q3", " B ", sealed) == "bf16 keeps fp32's exponent bits."
    try:
        wrong = quiz.unseal("q3", "c", sealed)
    except UnicodeDecodeError:
        wrong = ""
    assert "exponent" not in wrong
    assert quiz.seal("q4", "b", "same text") != quiz.seal("q3", "b", "same text")  # salted


def test_author_writes_the_bank_and_returns_the_cells_call(bank, capsys):
    call = quiz.author("q9", "b", "bf16 keeps fp32's exponent.", hint="lesson 01 §2", bank="01_x")
    assert call == "quiz.check('q9', answer)"
    capsys.readouterr()
    eval(call, {"quiz": quiz, "answer": "b"})
    assert capsys.readouterr().out.count("fp32's exponent") == 1


def test_the_course_banks_hold_no_readable_explanation_and_point_to_lesson_sections():
    for path in sorted(quiz.BANK_DIR.glob("*.json")):
        for question, entry in json.loads(path.read_text()).items():
            assert set(entry) >= {"key", "hint", "explanation"}, (path.name, question)
            opened = base64.b64decode(entry["explanation"]).decode("utf-8", "ignore")
            assert " the " not in opened and " and " not in opened, question   # sealed
            assert re.search(r"lesson 0\d §\d", entry["hint"]), (question, entry["hint"])
            assert not re.search(r"\bC\d+\b", entry["hint"]), question
            if "choices" in entry:   # exactly one letter is right
                keys = [quiz.answer_key(question, c) for c in entry["choices"]]
                assert keys.count(entry["key"]) == 1, question
    assert {"amp-bf16-no-scaler", "ckpt-quiz-faster", "no-sync",
            "ex05-largest-batch"} <= set(quiz.question_bank())


def test_a_translated_question_speaks_the_learners_language(bank, monkeypatch, capsys):
    quiz.translate("bf16", "c", "ko", "bf16은 fp32의 지수 범위를 가집니다.", "레슨 01 §1", bank="01_x")
    with pytest.raises(ValueError, match="not the right answer"):
        quiz.translate("bf16", "a", "ko", "x", "y", bank="01_x")
    monkeypatch.setenv("COURSE_LANG", "ko")
    with pytest.raises(AssertionError, match="레슨 01 §1"):
        quiz.check("bf16", "a")
    quiz.check("bf16", "c")
    assert "지수 범위" in capsys.readouterr().out
    monkeypatch.setenv("COURSE_LANG", "en")
    quiz.check("bf16", "c")
    assert "exponent range" in capsys.readouterr().out
    quiz.check("bytes", 16)   # not translated: English in every language
    assert "4 + 4 + 8" in capsys.readouterr().out


def test_a_korean_kernel_gets_the_checkers_words_in_korean(bank, capsys, monkeypatch):
    """Issue 28: the checker's own phrases are Korean under COURSE_LANG=ko (the hint and the
    explanation are the bank's: English here, where the entry has no Korean)."""
    monkeypatch.setenv("COURSE_LANG", "ko")
    with pytest.raises(AssertionError, match="bf16: 이 답이 아닙니다. 힌트: lesson 01 §1"):
        quiz.check("bf16", "a")
    with pytest.raises(AssertionError, match="a, b, c, d 중 한 글자로 답하세요"):
        quiz.check("bf16", "z")
    quiz.check("bf16", "c")
    assert capsys.readouterr().out.startswith("정답입니다. fp32's exponent range.")
