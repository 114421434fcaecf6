"""The conceptual questions' checker: right answers print the explanation, wrong ones the hint."""
import re

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


def test_the_explanation_is_kept_out_of_the_cell_and_printed_after_a_right_answer(capsys):
    """Exercise 03's cells pass no explanation: it comes from course_utils.quiz_explanations,
    only after a right answer, and points to a lesson section, not to a claim ID."""
    from course_utils.quiz_explanations import EXPLANATIONS
    key = quiz.answer_key("bf16-halves-memory", "b")
    quiz.check("bf16-halves-memory", "b", key=key, hint="lesson 03, §2", choices="abcd")
    out = capsys.readouterr().out
    assert out.startswith("Right.") and "optimizer step" in out
    with pytest.raises(AssertionError) as e:
        quiz.check("bf16-halves-memory", "a", key=key, hint="lesson 03, §2", choices="abcd")
    assert "optimizer step" not in str(e.value)
    with pytest.raises(ValueError, match="no explanation"):
        quiz.check("nobody-wrote-this", "a", key=quiz.answer_key("nobody-wrote-this", "a"), hint="h",
                   choices="abcd")
    for text in EXPLANATIONS.values():
        assert "lesson" in text and not re.search(r"\bC\d+\b", text), text
