"""Guarded writes: conditions and writes that a commit applies with the fence.

Each condition or write names a key; the keys are passed to the commit script
after the shard's keys (in Redis Cluster they must share the shard's hash tag).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidInput


@dataclass(frozen=True)
class FieldEquals:
    """Holds when hash ``key``'s ``field`` equals ``value`` (compared as text); never when
    ``key`` holds another type."""

    key: str
    field: str
    value: str | int | float


@dataclass(frozen=True)
class KeyExists:
    """Holds when ``key`` exists."""

    key: str


@dataclass(frozen=True)
class KeyMissing:
    """Holds when ``key`` does not exist."""

    key: str


Condition = FieldEquals | KeyExists | KeyMissing


@dataclass(frozen=True)
class Write:
    """One write: ``op`` is hset, hdel, sadd, srem, zadd, zrem or del.

    Use the constructors :meth:`hset`, :meth:`hdel`, :meth:`sadd`, :meth:`srem`,
    :meth:`zadd`, :meth:`zrem` and :meth:`delete`.
    """

    op: str
    key: str
    data: Any = field(default=None)

    @classmethod
    def hset(cls, key: str, fields: Mapping[str, str | int | float]) -> Write:
        """Set hash fields."""
        return cls("hset", key, {f: str(v) for f, v in fields.items()})

    @classmethod
    def hdel(cls, key: str, fields: Sequence[str]) -> Write:
        """Delete hash fields."""
        return cls("hdel", key, list(fields))

    @classmethod
    def sadd(cls, key: str, members: Sequence[str]) -> Write:
        """Add set members."""
        return cls("sadd", key, list(members))

    @classmethod
    def srem(cls, key: str, members: Sequence[str]) -> Write:
        """Remove set members."""
        return cls("srem", key, list(members))

    @classmethod
    def zadd(cls, key: str, scores: Mapping[str, float]) -> Write:
        """Add sorted-set members with scores."""
        return cls("zadd", key, dict(scores))

    @classmethod
    def zrem(cls, key: str, members: Sequence[str]) -> Write:
        """Remove sorted-set members."""
        return cls("zrem", key, list(members))

    @classmethod
    def delete(cls, key: str) -> Write:
        """Delete a key."""
        return cls("del", key)


_DATA_NAME = {
    "hset": "fields",
    "hdel": "fields",
    "sadd": "members",
    "srem": "members",
    "zadd": "scores",
    "zrem": "members",
}


def encode(conditions: Iterable[Condition], writes: Iterable[Write]) -> tuple[list[str], str, str]:
    """The guarded keys and the conditions and writes as the commit script takes them (JSON).

    Raises:
        InvalidInput: a key is not UTF-8 text, or a value cannot be sent as JSON.
    """
    keys: list[str] = []

    def number(key: str) -> int:
        if key not in keys:
            keys.append(key)
        return keys.index(key) + 1

    encoded_conditions: list[dict[str, Any]] = []
    for c in conditions:
        if isinstance(c, FieldEquals):
            encoded_conditions.append(
                {"if": "equals", "key": number(c.key), "field": c.field, "value": str(c.value)}
            )
        else:
            kind = "exists" if isinstance(c, KeyExists) else "missing"
            encoded_conditions.append({"if": kind, "key": number(c.key)})
    encoded_writes: list[dict[str, Any]] = []
    for w in writes:
        entry: dict[str, Any] = {"do": w.op, "key": number(w.key)}
        if w.op in _DATA_NAME:
            entry[_DATA_NAME[w.op]] = w.data
        encoded_writes.append(entry)
    try:  # the keys go to Redis as UTF-8 text, the conditions and writes as JSON
        for key in keys:
            if isinstance(key, str):
                key.encode()
        return keys, json.dumps(encoded_conditions), json.dumps(encoded_writes)
    except (TypeError, ValueError) as error:
        raise InvalidInput(f"guarded conditions or writes cannot be sent: {error}") from None
