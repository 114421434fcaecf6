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


def test_a_sealed_explanation_opens_only_with_the_right_answer():
    sealed = quiz.seal("q3", "b", "bf16 keeps fp32's exponent bits.")
    assert "exponent" not in sealed and quiz.unseal("q3", " B ", sealed) == (
        "bf16 keeps fp32's exponent bits.")
    try:
        wrong = quiz.unseal("q3", "c", sealed)
    except UnicodeDecodeError:
        wrong = ""
    assert "exponent" not in wrong
    assert quiz.seal("q4", "b", "same text") != quiz.seal("q3", "b", "same text")  # salted


def test_ask_reads_the_bank_and_keeps_the_explanation_hidden(tmp_path, monkeypatch, capsys):
    import json
    bank = {"bytes": quiz.bank_entry("bytes", 16, "4 + 4 + 8 bytes.", "lesson 01 §7", digits=0),
            "bf16": quiz.bank_entry("bf16", "c", "fp32's exponent range.", "lesson 01 §1")}
    (tmp_path / "01_x.json").write_text(json.dumps(bank))
    monkeypatch.setattr(quiz, "BANK_DIR", tmp_path)
    assert "exponent" not in (tmp_path / "01_x.json").read_text()   # not readable in the file
    assert quiz.ask("bf16", "C") is None
    assert capsys.readouterr().out.count("exponent range") == 1
    with pytest.raises(AssertionError, match="lesson 01 §1") as e:
        quiz.ask("bf16", "a")
    assert "exponent" not in str(e.value)
    for bad in ("ab", "", "z", 3):
        with pytest.raises(AssertionError, match="one of the letters"):
            quiz.ask("bf16", bad)
    quiz.ask("bytes", 16.2)
    with pytest.raises(AssertionError, match="not this one"):
        quiz.ask("bytes", 12)
    with pytest.raises(KeyError, match="no bank|exactly one"):
        quiz.ask("missing", "a")
    (tmp_path / "02_y.json").write_text(json.dumps({"bf16": bank["bf16"]}))
    with pytest.raises(KeyError, match="exactly one"):
        quiz.ask("bf16", "c")


def test_the_course_banks_hold_no_readable_explanation_and_point_to_lesson_sections():
    import json
    for path in sorted(quiz.BANK_DIR.glob("*.json")):
        for question, entry in json.loads(path.read_text()).items():
            assert set(entry) >= {"key", "hint", "explanation"}, (path.name, question)
            opened = __import__("base64").b64decode(entry["explanation"]).decode("utf-8", "ignore")
            assert " the " not in opened and " and " not in opened, question   # sealed, not base64
            assert "§" in entry["hint"] or "Part" in entry["hint"], question
            assert not __import__("re").search(r"\bC\d+\b", entry["hint"]), question
