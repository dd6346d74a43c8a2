"""The attempt log's entries: how each attempt on an item ended (lua/include/attempt_log.lua)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .records import decode_text, from_ms

#: What ended an attempt, as the attempt log names it (see lua/include/attempt_log.lua).
ATTEMPT_EVENTS = ("committed", "retry", "dead", "released", "refused", "takeover", "expired")


@dataclass(frozen=True)
class Attempt:
    """One entry of a shard's attempt log: how one attempt on an item ended.

    ``event`` is one of :data:`ATTEMPT_EVENTS`. For ``refused`` (a holder call refused
    with LEASE_LOST) ``token`` is the token the caller sent, ``error`` the refusal's
    detail, and ``attempt``, ``worker`` and the durations are unknown (0, '' and None).
    ``queue_age_seconds`` is the wait from eligible to claimed, ``duration_seconds`` from
    claimed to the entry (None when unknown).
    """

    at: datetime
    item_id: str
    attempt: int
    token: int
    event: str
    queue_age_seconds: float | None
    duration_seconds: float | None
    worker: str
    error: str | None
    trace_id: str
    label: str = ""
    entry_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The attempt as JSON-ready data (``at`` in ISO 8601 UTC)."""
        return {
            "at": self.at.isoformat(timespec="milliseconds"),
            "item": self.item_id,
            "attempt": self.attempt,
            "token": self.token,
            "event": self.event,
            "queue_age_seconds": self.queue_age_seconds,
            "duration_seconds": self.duration_seconds,
            "worker": self.worker,
            "error": self.error,
            "trace_id": self.trace_id,
            "label": self.label,
            "entry_id": self.entry_id,
        }

    @classmethod
    def from_entry(cls, entry_id: bytes | str, fields: Mapping[Any, Any]) -> Attempt:
        """Decodes one stream entry (its id, whose first part is the time in ms, and fields)."""
        entry = decode_text(entry_id)
        values = {decode_text(k): decode_text(v) for k, v in fields.items()}

        def seconds(name: str) -> float | None:
            value = values.get(name, "")
            return int(value) / 1000 if value.isdigit() else None

        return cls(
            at=from_ms(int(entry.split("-", 1)[0])),
            item_id=values.get("item", ""),
            attempt=int(values.get("attempt") or 0),
            token=int(values.get("token") or 0),
            event=values.get("event", ""),
            queue_age_seconds=seconds("queue_ms"),
            duration_seconds=seconds("run_ms"),
            worker=values.get("worker", ""),
            error=values.get("error") or None,
            trace_id=values.get("trace", ""),
            label=values.get("label", ""),
            entry_id=entry,
        )
