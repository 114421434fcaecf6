"""course_utils.cli_args: the commands' argument types."""
from __future__ import annotations

import pytest

from course_utils.cli_args import parse_bytes


def test_parse_bytes():
    assert parse_bytes("14GiB") == 14 * 2**30
    assert parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes("2000") == 2000 and parse_bytes("1.5KiB") == 1536
    for bad in ("-1GiB", "lots", "3 parsecs"):
        with pytest.raises(Exception, match="expected a size"):
            parse_bytes(bad)


def test_a_korean_terminal_gets_the_commands_words_in_korean(monkeypatch, tmp_path):
    """Issue 28: under COURSE_LANG=ko an argument error and the help are Korean; the flags stay
    English."""
    import argparse

    from course_utils.cli import _parser
    from course_utils.cli_args import check_out_folder, comma_list, positive_int
    monkeypatch.setenv("COURSE_LANG", "ko")
    with pytest.raises(argparse.ArgumentTypeError, match="양의 정수를 기대했는데 '0'"):
        positive_int("0")
    with pytest.raises(argparse.ArgumentTypeError, match="알 수 없는 정밀도 \\['fp8'\\]"):
        comma_list(["fp32", "bf16"], "precision")("fp8")
    with pytest.raises(ValueError, match="상위 폴더 .* 없습니다"):
        check_out_folder(tmp_path / "no" / "such")
    help_text = _parser().format_help()
    assert "--batch-size" in help_text and "마이크로배치당 시퀀스 수" in help_text
