"""Run and item ids in the dashboard's URLs: one reversible escape, used by every route.

An id may hold ``/`` (ids are A-Z a-z 0-9 ``_ - . : @ / + =``), which routing would
read as a path separator: ``/runs/x/items/y/items/z`` names no run for sure. In a
URL each ``/`` of an id is written ``~``, a character no id may hold, so the escape
is reversible and a path segment is always one whole id. :class:`IdConverter` (the
``<id:...>`` converter) writes ids this way in every ``url_for`` and reads them
back in every route.
"""

from __future__ import annotations

from typing import Any

from werkzeug.routing import BaseConverter

#: The URL converter's name: ``<id:run_id>``.
CONVERTER = "id"
#: What stands for ``/`` inside an id's path segment.
SLASH = "~"


def id_to_url(value: str) -> str:
    """``value`` with each ``/`` written as ``~`` (one path segment)."""
    return value.replace("/", SLASH)


def id_from_url(segment: str) -> str:
    """The id a path segment written by :func:`id_to_url` stands for."""
    return segment.replace(SLASH, "/")


class IdConverter(BaseConverter):
    """One path segment holding a run or item id, ``/`` written as ``~``."""

    regex = "[^/]+"

    def to_python(self, value: str) -> str:
        """The id in the URL's segment."""
        return id_from_url(value)

    def to_url(self, value: Any) -> str:
        """The id as one quoted path segment."""
        return super().to_url(id_to_url(str(value)))
