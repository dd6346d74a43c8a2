"""Checks on ids, payloads, TTLs and counts, made before anything reaches Redis.

Ids (runs, items, workers) are 1 to 200 characters from ``A-Z a-z 0-9`` and
``_ - . : @ / + =``. That keeps them safe inside Redis Cluster hash tags (no
``{`` ``}``), in shard tags (no ``#``), on a command line and in logs (no
whitespace or control characters). Every bound comes from :mod:`..limits`, the
same table the Lua scripts enforce.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ..errors import InvalidInput
from ..limits import (
    DELAY_MAX_MS,
    ID_MAX_LENGTH,
    JSON_MAX_BYTES,
    JSON_MAX_DEPTH,
    TIME_MAX_MS,
    TOKEN_MAX,
    TTL_MAX_MS,
    TTL_MIN_MS,
)
from .leases import Lease

ID_PATTERN = re.compile(rf"[A-Za-z0-9_.:@/+=-]{{1,{ID_MAX_LENGTH}}}")

__all__ = [
    "ID_MAX_LENGTH",
    "ID_PATTERN",
    "JSON_MAX_DEPTH",
    "TTL_MAX_MS",
    "TTL_MIN_MS",
    "check_id",
    "check_lease",
    "check_positive",
    "check_time_ms",
    "clip",
    "delay_to_ms",
    "encode_json",
    "parse_json",
    "stored_size",
    "ttl_to_ms",
]


def check_id(value: str, what: str = "id") -> str:
    """Returns ``value`` when it is a valid id, else raises InvalidInput."""
    if not isinstance(value, str):
        example = f" (e.g. '{value}')" if type(value) is int else ""
        raise InvalidInput(
            f"invalid {what} {clip(repr(value), 60)} of type {type(value).__name__}: an id "
            f"is a str{example}"
        )
    if not ID_PATTERN.fullmatch(value):
        raise InvalidInput(
            f"invalid {what} {value[:60]!r}: use 1-{ID_MAX_LENGTH} characters from "
            "A-Z a-z 0-9 _ - . : @ / + = (no braces, '#', spaces or control characters)"
        )
    return value


#: Whole numbers every JSON reader on the server side takes (64-bit); larger ones go as text.
INT_RANGE = (-(2**63), 2**63 - 1)


#: Values with no depth and nothing to check: found by their exact type, the commonest first.
_FLAT = frozenset({str, float, bool, type(None)})


def _depth(value: Any, what: str = "value", level: int = 0) -> int:
    """The nesting depth of a JSON value (0 for a scalar); past JSON_MAX_DEPTH levels it
    looks no deeper and answers JSON_MAX_DEPTH + 1, so it never recurses further.

    Raises InvalidInput for a whole number outside 64 bits (some server-side JSON
    readers refuse it, others round it)."""
    if isinstance(value, dict):
        children: Any = value.values()
    elif isinstance(value, list):
        children = value
    else:
        whole = isinstance(value, int) and not isinstance(value, bool)
        if whole and not INT_RANGE[0] <= value <= INT_RANGE[1]:
            raise InvalidInput(
                f"{what} holds the whole number {value}, outside 64 bits; send it as a string"
            )
        return 0
    if level >= JSON_MAX_DEPTH:
        return JSON_MAX_DEPTH + 1
    deepest = 0
    for child in children:
        if type(child) not in _FLAT:
            found = _depth(child, what, level + 1)
            if found > deepest:
                deepest = found
    return deepest + 1


def _too_deep(what: str) -> InvalidInput:
    return InvalidInput(f"{what} is nested more than {JSON_MAX_DEPTH} levels deep; flatten it")


#: Compact JSON, as encode_json writes it (one encoder: json.dumps would build one per call).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_json(value: Any, what: str = "payload", limit: int = JSON_MAX_BYTES) -> str:
    """Encodes ``value`` as compact JSON text no larger than ``limit`` bytes."""
    try:
        if _depth(value, what) > JSON_MAX_DEPTH:
            raise _too_deep(what)
        text = _ENCODER.encode(value)
        size = stored_size(text)  # a lone surrogate cannot be encoded: a UnicodeEncodeError
    except (TypeError, ValueError, RecursionError) as error:
        if isinstance(error, InvalidInput):
            raise
        raise InvalidInput(f"{what} is not JSON-serialisable: {error}") from None
    if size > limit:
        raise InvalidInput(
            f"{what} is {size} bytes as stored, over the {limit}-byte limit; keep it small"
        )
    return text


#: Characters the scripts' JSON encoder escapes inside a record as two (``\"``, ``\n``...),
#: and those it escapes as six (``\u00XX``: the other control characters and DEL).
_ESCAPED_AS_2 = re.compile('["\\\\/\b\f\n\r\t]')
_ESCAPED_AS_6 = re.compile("[\x00-\x07\x0b\x0e-\x1f\x7f]")


def stored_size(text: str) -> int:
    """Bytes of JSON ``text`` as it sits in an item record: escaped the way the scripts'
    encoder escapes a string (``"``, ``\\``, ``/`` and control characters)."""
    extra = len(_ESCAPED_AS_2.findall(text))
    if not text.isprintable():  # printable text holds no control character
        extra += 5 * len(_ESCAPED_AS_6.findall(text))
    return len(text.encode()) + extra


def parse_json(text: str, what: str = "payload", limit: int = JSON_MAX_BYTES) -> Any:
    """Parses JSON text given on a command line, checking its size and depth."""
    if len(text.encode(errors="surrogatepass")) > limit:
        raise InvalidInput(f"{what} is over the {limit}-byte limit; keep it small")
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as error:
        raise InvalidInput(
            f"{what} is not valid JSON ({error.msg} at {error.pos}): {text[:80]!r}"
        ) from None
    except RecursionError:
        raise _too_deep(what) from None
    encode_json(value, what, limit)
    return value


def _no_constant(name: str) -> Any:
    raise InvalidInput(f"JSON has no {name}; use a number or a string")


def _seconds_to_ms(seconds: float, what: str, low: int, high: int, low_text: str) -> int:
    """Seconds as whole ms within [low, high].

    A bad value is named as a number (``-1s`` whether given as -1 or -1.0), so that every
    caller gets the same message."""
    try:
        value = float(seconds)
        if not math.isfinite(value):
            raise ValueError
        ms = round(value * 1000)
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"{what} must be a finite number of seconds, got {seconds!r}") from None
    if not low <= ms <= high:
        raise InvalidInput(
            f"{what} {value:g}s is out of range: use {low_text} to {high // 1000} seconds"
        )
    return ms


def ttl_to_ms(seconds: float, what: str = "ttl") -> int:
    """Converts a TTL in seconds to whole milliseconds within the protocol's TTL bound."""
    return _seconds_to_ms(seconds, what, TTL_MIN_MS, TTL_MAX_MS, "0.001")


def delay_to_ms(seconds: float, what: str = "delay") -> int:
    """Converts a delay in seconds to whole milliseconds within the protocol's delay bound."""
    return _seconds_to_ms(seconds, what, 0, DELAY_MAX_MS, "0")


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, on a character boundary.

    A lone surrogate (how Python holds an undecodable byte) becomes ``\\udcff`` text.
    """
    data = text.encode(errors="backslashreplace")
    return data[:limit].decode(errors="ignore")


def check_positive(value: int, what: str, maximum: int = 1_000_000) -> int:
    """Returns ``value`` when 1 <= value <= maximum, else raises InvalidInput."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise InvalidInput(f"{what} must be a whole number from 1 to {maximum}, got {value!r}")
    return value


def check_lease(lease: Lease) -> None:
    """Raises InvalidInput unless the lease's ids and token are ones the protocol accepts."""
    check_id(lease.run_id, "run id")
    check_id(lease.item_id, "item id")
    if lease.lease_id:
        check_id(lease.lease_id, "lease id")
    if isinstance(lease.token, bool) or not isinstance(lease.token, int):
        raise InvalidInput(f"token must be a whole number from 1, got {lease.token!r}")
    if not 1 <= lease.token <= TOKEN_MAX:
        raise InvalidInput(f"token must be a whole number from 1 to {TOKEN_MAX}, got {lease.token}")


def check_time_ms(ms: int | None, what: str) -> int:
    """A time in ms on the server clock (0 or None: none), within the protocol's bound."""
    if ms is None:
        return 0
    if isinstance(ms, bool) or not isinstance(ms, int) or not 0 <= ms <= TIME_MAX_MS:
        raise InvalidInput(f"{what} must be whole milliseconds from 0 to {TIME_MAX_MS}, got {ms!r}")
    return ms
