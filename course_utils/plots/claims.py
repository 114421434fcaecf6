"""The claims ledger as a coloured HTML table (a pandas Styler, not a figure)."""
from __future__ import annotations

import html
import re
from types import MappingProxyType

from ..i18n import label, tr

# One colour per status of course_utils.claims.STATUSES.
_STATUS_STYLE = MappingProxyType({
    "held": "background-color: #C8E6C9", "busted": "background-color: #FFCDD2",
    "depends": "background-color: #FFE0B2", "inconclusive": "background-color: #FFF9C4",
    "not measured here": "background-color: #E0E0E0"})

# How each basis of course_utils.claims.Verdict is shown: words of their own, so that a catalog
# translates them without translating "none" (also a checkpoint policy's name) everywhere.
_BASIS_SHOWN = MappingProxyType({"measured": "measured", "derived": "derived (arithmetic)",
                                 "none": "no basis"})


def styled_claims(table):
    """`course_utils.claims.claims_table` (columns ``says``, ``status``, ``evidence``, ``where``)
    as a ``pandas`` Styler: status coloured, markdown links in ``where`` clickable, labels,
    statuses and bases in the learner's language (`course_utils.i18n.label`; the data stay
    English).

    Raises:
        ValueError: no rows, or one of those columns missing.
    """
    need = {"says", "status", "evidence", "where"}
    if len(table) == 0 or need - set(table.columns):
        raise ValueError(tr("styled_claims needs a claims_table() with rows and columns {columns}.",
                            columns=sorted(need)))

    def links(text):
        text = html.escape(str(text))
        return re.sub(r"\[([^\]]+)\]\(([^)\s]+)\)", r'<a href="\2">\1</a>', text)

    view = table.copy()
    view["where"] = [links(w) for w in view["where"]]
    view["says"] = [html.escape(str(s)) for s in view["says"]]
    view["evidence"] = [html.escape(str(s)) for s in view["evidence"]]
    style = (view.style
             .map(lambda s: _STATUS_STYLE.get(s, ""), subset=["status"])
             .format(label, subset=["status"]))
    if "basis" in view.columns:
        style = style.format(lambda b: label(_BASIS_SHOWN.get(b, b)), subset=["basis"])
    return (style
            .format_index(label, axis=1)
            .set_properties(**{"text-align": "left", "vertical-align": "top"})
            .set_table_styles([{"selector": "th", "props": [("text-align", "left")]}]))
