"""Checks on ids, payloads and TTLs, made before anything reaches Redis.

Ids (runs, items, workers) are 1 to 200 characters from ``A-Z a-z 0-9`` and
``_ - . : @ / + =``. That keeps them safe inside Redis Cluster hash tags (no
``{`` ``}``), in shard tags (no ``#``), on a command line and in logs (no
whitespace or control characters).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import InvalidInput

ID_MAX_LENGTH = 200
ID_PATTERN = re.compile(r"[A-Za-z0-9_.:@/+=-]{1,200}")
PAYLOAD_MAX_BYTES = 64 * 1024
TTL_MIN_MS = 1
TTL_MAX_MS = 7 * 24 * 3600 * 1000


def check_id(value: str, what: str = "id") -> str:
    """Returns ``value`` when it is a valid id, else raises InvalidInput."""
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        shown = value if isinstance(value, str) else type(value).__name__
        raise InvalidInput(
            f"invalid {what} {shown!r}: use 1-{ID_MAX_LENGTH} characters from "
            "A-Z a-z 0-9 _ - . : @ / + = (no braces, '#', spaces or control characters)"
        )
    return value


def encode_json(value: Any, what: str = "payload", limit: int = PAYLOAD_MAX_BYTES) -> str:
    """Encodes ``value`` as compact JSON text no larger than ``limit`` bytes."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise InvalidInput(f"{what} is not JSON-serialisable: {error}") from None
    size = len(text.encode())
    if size > limit:
        raise InvalidInput(f"{what} is {size} bytes, over the {limit}-byte limit; keep it small")
    return text


def parse_json(text: str, what: str = "payload", limit: int = PAYLOAD_MAX_BYTES) -> Any:
    """Parses JSON text given on a command line, checking its size."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidInput(
            f"{what} is not valid JSON ({error.msg} at {error.pos}): {text!r}"
        ) from None
    encode_json(value, what, limit)
    return value


def ttl_to_ms(seconds: float, what: str = "ttl") -> int:
    """Converts a TTL in seconds to whole milliseconds within the allowed bounds."""
    try:
        ms = round(float(seconds) * 1000)
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"{what} must be a number of seconds, got {seconds!r}") from None
    if not TTL_MIN_MS <= ms <= TTL_MAX_MS:
        raise InvalidInput(
            f"{what} {seconds!r}s is out of range: use 0.001 to {TTL_MAX_MS // 1000} seconds"
        )
    return ms


def check_positive(value: int, what: str, maximum: int = 1_000_000) -> int:
    """Returns ``value`` when 1 <= value <= maximum, else raises InvalidInput."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise InvalidInput(f"{what} must be a whole number from 1 to {maximum}, got {value!r}")
    return value
