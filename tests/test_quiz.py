"""The conceptual questions' checker: right answers print the explanation, wrong ones the hint."""
import pytest

from course_utils import quiz


def test_choice_question_right_and_wrong(capsys):
    key = quiz.answer_key("q1", "b")
    expl = quiz.encode("because bf16 has fp32's exponent range.")
    assert quiz.check("q1", " B ", key=key, explanation=expl, hint="lesson 01 §3",
                      choices="abcd") is None  # a cell ending with it shows the text once
    assert capsys.readouterr().out.count("exponent range") == 1
    with pytest.raises(AssertionError, match="lesson 01 §3") as e:
        quiz.check("q1", "c", key=key, explanation=expl, hint="lesson 01 §3", choices="abcd")
    assert "exponent" not in str(e.value)  # the explanation is not given away
    with pytest.raises(AssertionError, match="one of the letters"):
        quiz.check("q1", "z", key=key, explanation=expl, hint="h", choices="abcd")
    with pytest.raises(AssertionError, match="no answer yet"):
        quiz.check("q1", None, key=key, explanation=expl, hint="h", choices="abcd")


def test_number_question_rounds_and_is_salted():
    key = quiz.answer_key("bytes-per-param", 16, digits=0)
    expl = quiz.encode("4 + 4 + 8")
    quiz.check("bytes-per-param", 16.2, key=key, explanation=expl, hint="h", digits=0)
    with pytest.raises(AssertionError, match="not this one"):
        quiz.check("bytes-per-param", 12, key=key, explanation=expl, hint="h", digits=0)
    with pytest.raises(AssertionError, match="finite number"):
        quiz.check("bytes-per-param", "16", key=key, explanation=expl, hint="h", digits=0)
    assert quiz.answer_key("other", 16, digits=0) != key  # the question id salts the key


def test_author_prints_a_call_that_checks(capsys):
    call = quiz.author("q2", "a", "explained", hint="see §2")
    assert "explained" not in call and "choices='abcd'" in call
    answer = "a"  # noqa: F841 - read by the evaluated call
    capsys.readouterr()
    eval(call, {"quiz": quiz, "answer": "a"})
    assert capsys.readouterr().out.count("explained") == 1


def test_a_banked_question_keeps_its_explanation_out_of_the_cell(tmp_path, monkeypatch, capsys):
    """Issue 24 item 7: the test cell holds only the question's id; the explanation comes from
    the bank, printed after a right answer only, and the hint names a lesson section."""
    monkeypatch.setattr(quiz, "BANK_DIR", tmp_path)
    call = quiz.author("q9", "b", "bf16 keeps fp32's exponent.", hint="lesson 01 §2", bank="01_x")
    assert call == "quiz.check('q9', answer)"
    capsys.readouterr()
    with pytest.raises(AssertionError, match="lesson 01 §2") as e:
        quiz.check("q9", "a")
    assert "exponent" not in str(e.value) and capsys.readouterr().out == ""
    with pytest.raises(AssertionError, match="one of the letters"):
        quiz.check("q9", "z")
    quiz.check("q9", "b")
    assert capsys.readouterr().out.count("fp32's exponent") == 1
    with pytest.raises(ValueError, match="no question bank"):
        quiz.check("q10", "b")
    (tmp_path / "02_y.json").write_text('{"q9": {"key": "k", "hint": "h", "explanation": "e"}}')
    with pytest.raises(ValueError, match="two banks"):
        quiz.question_bank()


def test_the_course_banks_answer_their_exercises():
    """Every banked question names a lesson section in its hint, and its key is one letter's."""
    bank = quiz.question_bank()
    assert {"ddp-memory", "fsdp-activations", "no-sync", "ckpt-quiz-faster"} <= set(bank)
    for qid, entry in bank.items():
        assert "lesson" in entry["hint"] and "§" in entry["hint"], qid
        if "choices" in entry:
            letters = entry["choices"]
            assert sum(quiz.answer_key(qid, c) == entry["key"] for c in letters) == 1, qid
