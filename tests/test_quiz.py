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


def test_an_explanation_from_the_question_bank_stays_out_of_the_cell(capsys, monkeypatch):
    """Exercise cells call check() without an explanation: the bank's is printed only after a
    right answer, and a question no bank (or two banks) explains is a clear error."""
    from course_utils.quizzes import exercise02
    key = quiz.answer_key("ckpt-quiz-faster", "b")
    with pytest.raises(AssertionError, match="not this one"):
        quiz.check("ckpt-quiz-faster", "a", key=key, hint="lesson 02 §3", choices="abcd")
    assert capsys.readouterr().out == ""
    quiz.check("ckpt-quiz-faster", "b", key=key, hint="lesson 02 §3", choices="abcd")
    assert "eager mode" in capsys.readouterr().out
    with pytest.raises(KeyError, match="needs one"):
        quiz.explanation_of("no-such-question")
    call = quiz.author("ckpt-quiz-faster", "b", hint="see §3")
    assert "explanation=" not in call
    monkeypatch.setitem(exercise02.EXPLANATIONS, "q-twice", "once")
    import sys
    import types
    twin = types.ModuleType("course_utils.quizzes.twin")
    twin.EXPLANATIONS = {"q-twice": "again"}
    monkeypatch.setitem(sys.modules, "course_utils.quizzes.twin", twin)
    monkeypatch.setattr(quiz.pkgutil, "iter_modules", lambda path: [
        types.SimpleNamespace(name="exercise02"), types.SimpleNamespace(name="twin")])
    with pytest.raises(KeyError, match="2 question banks"):
        quiz.explanation_of("q-twice")
