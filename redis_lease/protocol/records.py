"""An item as stored: its packed record, its last errors, an effect's record, decoded.

The packed form is ``lua/include/record.lua``'s; these read what the scripts wrote.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


def from_ms(ms: int) -> datetime:
    """A server time in milliseconds as an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, UTC)


def decode_text(value: Any) -> str:
    """A text Redis gave (bytes or str) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _loads(text: str | bytes | None) -> Any:
    return json.loads(text) if text else None


@dataclass(frozen=True)
class ItemError:
    """One of an item's last errors: its text, and the attempt, time and trace id it came
    from (0, None and '' when the entry does not say)."""

    error: str
    attempt: int = 0
    at: datetime | None = None
    trace_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The error as JSON-ready data (``at`` in ISO 8601 UTC, or None)."""
        return {
            "error": self.error,
            "attempt": self.attempt,
            "at": self.at.isoformat(timespec="milliseconds") if self.at else None,
            "trace_id": self.trace_id,
        }


def parse_errors(text: str | bytes | None) -> tuple[ItemError, ...]:
    """The errors kept in ``<item id>#e``, oldest first: a JSON array of
    ``{"error", "attempt", "at", "trace"}`` objects (no errors for a text of another form)."""
    if text is None:
        return ()
    raw = decode_text(text)  # bytes that are not UTF-8 raise: the caller notes them
    try:
        entries = json.loads(raw)
    except ValueError:
        return ()
    if not isinstance(entries, list):
        return ()
    return tuple(
        ItemError(
            error=e["error"],
            attempt=int(e.get("attempt") or 0),
            at=from_ms(int(e["at"])) if e.get("at") else None,
            trace_id=str(e.get("trace") or ""),
        )
        for e in entries
        if isinstance(e, dict) and isinstance(e.get("error"), str)
    )


@dataclass(frozen=True)
class ItemRecord:
    """An item as stored, for inspection: ``error`` is its last error, ``errors`` its last
    few (limits.ERROR_HISTORY), oldest first."""

    run_id: str
    item_id: str
    shard: int
    state: str
    token: int
    attempts: int
    payload: Any
    lease_id: str | None = None
    owner: str | None = None
    expires_at_ms: int | None = None
    result: Any = None
    error: str | None = None
    errors: tuple[ItemError, ...] = ()

    @classmethod
    def from_record(
        cls,
        run_id: str,
        item_id: str,
        shard: int,
        raw: bytes | str,
        result: bytes | str | None = None,
        error: bytes | str | None = None,
    ) -> ItemRecord:
        """Decodes a stored record (which holds the payload) and its texts (result, errors)."""
        rec = parse_record(raw)
        payload = rec.get("payload")
        errors = parse_errors(error)
        return cls(
            run_id=run_id,
            item_id=item_id,
            shard=shard,
            state=rec["state"],
            token=int(rec.get("token") or 0),
            attempts=int(rec.get("attempts") or 0),
            payload=_loads(payload),
            lease_id=rec.get("lease_id"),
            owner=rec.get("owner"),
            expires_at_ms=int(rec["expires_at"]) if rec.get("expires_at") else None,
            result=_loads(result),
            error=errors[-1].error if errors else None,
            errors=errors,
        )


#: The fields of a packed item record, in order (see lua/include/record.lua).
RECORD_FIELDS = (
    "state", "token", "attempts", "lease_id", "owner", "leased_at", "expires_at", "done_at",
    "outcome", "late", "eligible_at", "payload",
)  # fmt: skip
_NUMBERS = frozenset(("token", "attempts", "leased_at", "expires_at", "done_at", "eligible_at"))
#: The suffixes of an item's texts beside its record in the items hash: result, error.
TEXT_SUFFIXES = {"result": "#r", "error": "#e"}


def parse_record(raw: bytes | str) -> dict[str, Any]:
    """An item record as a dict, from its packed form. Absent fields are left out.

    Raises:
        ValueError: the text is not a packed record.
    """
    text = decode_text(raw)
    parts = text.split("|", len(RECORD_FIELDS) - 1)
    if len(parts) != len(RECORD_FIELDS) or not parts[0].isalpha():
        raise ValueError(f"not an item record: {text[:80]!r}")
    packed: dict[str, Any] = {}
    for name, value in zip(RECORD_FIELDS, parts, strict=True):
        if value == "":
            continue
        if name in _NUMBERS and not value.isdigit():
            raise ValueError(f"not an item record: {text[:80]!r}")
        packed[name] = int(value) if name in _NUMBERS else value
    if "late" in packed:
        packed["late"] = packed["late"] == "1"
    return packed


def read_items(fields: Mapping[Any, Any]) -> dict[str, dict[str, Any]]:
    """The records of an items hash (all of its fields, as HGETALL gives them), each a
    :func:`parse_record` dict with its ``result`` text, its last ``error`` text and its
    ``errors`` (:func:`parse_errors`)."""
    texts = {decode_text(k): decode_text(v) for k, v in fields.items()}
    records: dict[str, dict[str, Any]] = {}
    for field_name, raw in texts.items():
        if "#" in field_name:
            continue
        rec = parse_record(raw)
        for name, suffix in TEXT_SUFFIXES.items():
            if field_name + suffix in texts:
                rec[name] = texts[field_name + suffix]
        if "error" in rec:
            rec["errors"] = parse_errors(rec["error"])
            rec["error"] = rec["errors"][-1].error if rec["errors"] else None
        records[field_name] = rec
    return records


def effect_record(raw: str | bytes) -> dict[str, Any]:
    """An effect record with its result (stored as JSON text) decoded."""
    record: dict[str, Any] = json.loads(raw)
    if isinstance(record.get("result"), str):
        record["result"] = json.loads(record["result"])
    return record
