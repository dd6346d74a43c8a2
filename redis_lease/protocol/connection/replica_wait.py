"""Waiting for replicas: the store's option to hand out a claim only once replicas have it.

Replication is asynchronous: a primary answers before its replicas have the write, and a
failover to a replica that lacks a claim grants its token again. A store made with
``wait_replicas=N`` sends ``WAIT N wait_timeout_ms`` after each claim and each effect's
intent, on the same connection and in the same round trip
(:meth:`~redis_lease.protocol.scripts.Scripts.call_waited`), and hands nothing out that
fewer than N replicas acknowledged (docs/durability.md).

The option comes from the store's arguments or from its URL's query
(``redis://HOST:6379/0?wait_replicas=1&wait_timeout_ms=500``); :func:`without_wait` takes
it out of a URL before redis-py reads the URL, which would pass it on to its connections.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from ...errors import InvalidInput
from ...limits import DEFAULT_WAIT_TIMEOUT_MS, WAIT_REPLICAS_MAX, WAIT_TIMEOUT_MAX_MS
from ...limits import WAIT_TIMEOUT_MIN_MS as WAIT_TIMEOUT_MIN_MS
from .urls import safe_url

#: The URL parameters of the option.
WAIT_PARAMS = ("wait_replicas", "wait_timeout_ms")


@dataclass(frozen=True)
class ReplicaWait:
    """How many replicas must acknowledge a claim or an intent, and for how long to wait.

    Attributes:
        replicas: replicas that must have the write before it is handed out (1 or more).
        timeout_ms: how long to wait for them, in ms.
    """

    replicas: int
    timeout_ms: int = DEFAULT_WAIT_TIMEOUT_MS


def _number(text: object, name: str, low: int, high: int) -> int:
    """An option's value as a whole number from ``low`` to ``high``, else InvalidInput."""
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        value = None
    elif isinstance(text, int):
        value = text
    else:
        value = int(text) if text.strip().isdigit() else None
    if value is None or not low <= value <= high:
        raise InvalidInput(
            f"invalid {name} {text!r}: use a whole number from {low} to {high} "
            "(docs/durability.md, 'Waiting for replicas')"
        )
    return value


def url_params(url: str) -> dict[str, str]:
    """The option's parameters as the URL's query gives them (percent-decoded)."""
    query = url.partition("#")[0].partition("?")[2]
    found = {}
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name in WAIT_PARAMS:
            found[name] = unquote(value)
    return found


def without_wait(url: str) -> str:
    """``url`` without the option's parameters (unchanged when it has none)."""
    head, hash_, fragment = url.partition("#")
    base, mark, query = head.partition("?")
    if not mark:
        return url
    kept = [p for p in query.split("&") if p.partition("=")[0] not in WAIT_PARAMS]
    if len(kept) == len(query.split("&")):
        return url
    rest = "&".join(kept)
    return f"{base}{'?' + rest if rest else ''}{hash_}{fragment}"


def replica_wait(
    url: str = "", replicas: int | None = None, timeout_ms: int | None = None
) -> ReplicaWait | None:
    """The option as given (``replicas``, ``timeout_ms``), else as ``url`` says; None when
    the store does not wait (no replicas asked for, or 0).

    Raises:
        InvalidInput: a value that is not a whole number within its bound, or a timeout
            given without replicas to wait for.
    """
    params = url_params(url) if url else {}
    shown = f" in {safe_url(url)!r}" if params else ""
    given_replicas: object = replicas if replicas is not None else params.get("wait_replicas")
    given_timeout: object = timeout_ms if timeout_ms is not None else params.get("wait_timeout_ms")
    count = (
        0
        if given_replicas is None
        else _number(given_replicas, f"wait_replicas{shown}", 0, WAIT_REPLICAS_MAX)
    )
    if given_timeout is None:
        wait_ms = DEFAULT_WAIT_TIMEOUT_MS
    else:
        wait_ms = _number(
            given_timeout, f"wait_timeout_ms{shown}", WAIT_TIMEOUT_MIN_MS, WAIT_TIMEOUT_MAX_MS
        )
        if given_replicas is None:
            raise InvalidInput(
                f"wait_timeout_ms{shown} is given, but no wait_replicas: add wait_replicas=N "
                "(the replicas a claim waits for) or drop wait_timeout_ms"
            )
    return ReplicaWait(count, wait_ms) if count else None
