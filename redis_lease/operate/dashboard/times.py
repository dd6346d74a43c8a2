"""Times in a page's lists: to the second, so that a column of them stays narrow and on one
line; the whole stored or printed time is the cell's title (and on the item's or job's page).
"""

from __future__ import annotations

import re

#: A UTC time in ISO 8601, as the CLI prints it (``+00:00``, ms) or RQ stores it (``Z``, µs).
_UTC_TIME = re.compile(r"(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})(\.\d+)?(Z|\+00:00)")


def short_time(text: str | None) -> str:
    """A UTC time to the second (``2026-12-07 17:25:15``); any other text as it is."""
    found = _UTC_TIME.fullmatch(text or "")
    return f"{found[1]} {found[2]}" if found else text or ""
