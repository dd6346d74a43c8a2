"""Reading the attempt log: each shard's capped stream of ended attempts.

The scripts write it (one entry per ended attempt, see ``lua/include/attempt_log.lua``);
this module reads it newest first. An item's entries are all in its shard's stream, which
is read backwards in pages until enough are found or the stream (capped at
limits.ATTEMPT_LOG_CAP entries) ends: never more than one shard's log.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from ..connection.clients import as_text
from ..leases import Attempt

#: Entries read per XREVRANGE when looking for one item's entries.
PAGE = 500

__all__ = ["PAGE", "item_attempts", "latest"]


def _before(entry_id: str) -> str:
    """The stream id just before ``entry_id`` (an inclusive end for the next page); the
    smallest id a stream holds is 0-1."""
    ms, _, seq = entry_id.partition("-")
    if int(seq) > 0:
        return f"{ms}-{int(seq) - 1}"
    return f"{int(ms) - 1}-{2**64 - 1}"


def _decode(entries: Any) -> list[tuple[str, dict[str, str]]]:
    return [
        (as_text(entry_id), {as_text(k): as_text(v) for k, v in fields.items()})
        for entry_id, fields in entries
    ]


def item_attempts(client: redis.Redis, key: str, item_id: str, limit: int) -> list[Attempt]:
    """The newest ``limit`` entries of ``item_id`` in the stream ``key``, newest first."""
    found: list[Attempt] = []
    end = "+"
    while True:
        page = _decode(client.xrevrange(key, max=end, min="-", count=PAGE))
        for entry_id, fields in page:
            if fields.get("item") == item_id:
                found.append(Attempt.from_entry(entry_id, fields))
                if len(found) == limit:
                    return found
        if len(page) < PAGE or page[-1][0] == "0-1":
            return found
        end = _before(page[-1][0])


def latest(client: redis.Redis, keys: Sequence[str], limit: int) -> list[Attempt]:
    """The newest ``limit`` entries over the streams ``keys`` (one round trip), newest first."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.xrevrange(key, max="+", min="-", count=limit)
    merged = [
        Attempt.from_entry(entry_id, fields)
        for entries in pipe.execute()
        for entry_id, fields in _decode(entries)
    ]
    merged.sort(key=lambda a: tuple(int(part) for part in a.entry_id.split("-")), reverse=True)
    return merged[:limit]
