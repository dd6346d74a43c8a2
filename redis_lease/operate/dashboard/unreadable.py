"""A part of a page whose data in Redis cannot be read, shown as a note instead of failing
the page.

Anyone who can write the project's keys (the documented worker ACL can) may leave bytes
that are not UTF-8, or a record that does not parse, where the library reads text. The
library raises then (a ``ValueError``: ``UnicodeDecodeError``, ``JSONDecodeError`` or its
own "not an item record"); the dashboard shows that part of the page as
:class:`Unreadable`, with the stored text decoded with replacement, and the rest as usual.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ...errors import InvalidInput

T = TypeVar("T")
#: How much of an unreadable value a page shows.
SHOWN_MAX = 2000
log = logging.getLogger("redis_lease.dashboard.unreadable")  # the name logging configs know


@dataclass(frozen=True)
class Unreadable:
    """What could not be read, why (one line), and the stored text as far as it is known."""

    what: str
    reason: str
    text: str = ""


def readable(what: str, read: Callable[[], T]) -> T | Unreadable:
    """``read()``, or :class:`Unreadable` when the data it reads cannot be read.

    Bad input (:class:`~redis_lease.errors.InvalidInput`, a ValueError too) and every other
    error are raised as they are.
    """
    try:
        return read()
    except InvalidInput:
        raise
    except ValueError as error:
        found = unreadable(what, error)
        log.warning("%s cannot be read: %s", what, found.reason)
        return found


def unreadable(what: str, error: ValueError) -> Unreadable:
    """The note for ``error``, raised while reading ``what``."""
    if isinstance(error, UnicodeDecodeError):
        stored = bytes(error.object).decode("utf-8", "replace")
        reason = f"it holds bytes that are not UTF-8 text (at byte {error.start})"
    elif isinstance(error, json.JSONDecodeError):
        stored, reason = error.doc, f"it is not JSON ({error.msg})"
    else:
        stored, reason = "", str(error)
    return Unreadable(what, reason[:300], stored[:SHOWN_MAX])


def is_unreadable(value: object) -> bool:
    """Whether ``value`` is :class:`Unreadable` (the templates' ``is unreadable`` test)."""
    return isinstance(value, Unreadable)
