"""docs/method.md, the one page on how the course measures, in step with the library it names."""
import re
from pathlib import Path

from course_utils.claims import STATUSES
from course_utils.step_timing import VERDICTS

METHOD = Path(__file__).resolve().parents[1] / "docs" / "method.md"


def _table_words(section: str) -> list[str]:
    """The bold first-column words of the first table under the heading ``section``."""
    text = METHOD.read_text(encoding="utf-8")
    body = text.split(f"\n{section}\n", 1)[1]
    first_cells = re.findall(r"^\|([^|]*)\|", body.split("\n#", 1)[0], flags=re.MULTILINE)
    return [w for cell in first_cells for w in re.findall(r"\*\*(.+?)\*\*", cell)]


def test_the_verdict_words_are_the_librarys():
    """Every word `step_timing.time_ratio` can end in has its row, and no other word has one."""
    assert sorted(_table_words("### Verdict words")) == sorted(VERDICTS)


def test_the_claim_statuses_are_the_librarys():
    assert sorted(_table_words("## Claims and verdicts")) == sorted(STATUSES)
