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
