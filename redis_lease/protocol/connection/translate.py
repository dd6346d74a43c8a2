"""The one place where Redis errors and error replies become this library's errors.

Use :func:`translating_errors` as a ``with`` block around Redis calls. For an error reply
taken from a pipeline, call its :meth:`~ErrorDoor.error`.

Connection, login, permission, timeout, TLS and cluster failures become
:class:`~redis_lease.errors.RedisUnavailable` and its classes (exit 6); script error
replies their :class:`~redis_lease.errors.LeaseError`
(:func:`~redis_lease.protocol.error_replies.from_reply`). URLs are masked in every
message (:func:`~.urls.safe_url`).
"""

from __future__ import annotations

import hashlib
import re
import ssl
from functools import cache
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.exceptions import (
    AskError,
    AuthenticationError,
    ClusterDownError,
    ClusterError,
    MovedError,
    NoPermissionError,
    RedisClusterException,
    RedisClusterUnreachableError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.sentinel import MasterNotFoundError

from ...errors import (
    ClusterBusy,
    InvalidInput,
    LeaseError,
    PermissionDenied,
    RedisFull,
    RedisUnavailable,
    TLSFailed,
)
from ..error_replies import SCRIPT_CODES, from_reply
from ..scripts import KEY_COUNTS, source
from .tls import tls_message
from .urls import is_cluster_url, safe_url
from .urls import where as _where

#: What a call to Redis may raise: redis-py's errors (a cluster's own are not RedisErrors)
#: and the socket's.
REDIS_FAILURES = (redis.RedisError, RedisClusterException, OSError)
_DENIED_COMMAND = re.compile(r"no permissions to run the '([^']+)' command", re.IGNORECASE)
#: How the server words an ACL refusal, in a script or not (Redis 6 to 8).
_DENIED = re.compile(r"no permissions to|can't run this command|can't access", re.IGNORECASE)
_SCRIPT_SHA = re.compile(r"script: ([0-9a-f]{40})")
#: How the server refuses a SELECT of a database it does not have.
#: Replies of a server that refuses every call for now, before running it: a script ran
#: past ``busy-reply-threshold`` (BUSY).
BUSY_CODES = ("BUSY",)
_NO_DATABASE = re.compile(r"DB index is out of range", re.IGNORECASE)
#: A reply of a server over its maxmemory that evicts nothing (redis-py drops its ``OOM``
#: code in a pipeline's error text).
_FULL = re.compile(r"command not allowed when used memory > 'maxmemory'")


def translate(
    url: str,
    error: BaseException,
    *,
    run_id: str | None = None,
    item_id: str | None = None,
    token: int | None = None,
) -> Exception:
    """Returns the library's error for anything a Redis call raised or replied.

    :func:`translating_errors` calls it; every call path goes through that.

    Connection, login, permission, timeout and TLS failures become
    :class:`~redis_lease.errors.RedisUnavailable` (exit 6); script error replies become
    their :class:`~redis_lease.errors.LeaseError`
    (:func:`~redis_lease.protocol.error_replies.from_reply`); any other reply is a
    LeaseError naming the server. ``url`` is masked in every message.

    Args:
        url: the URL the client came from ('' when unknown).
        error: what redis-py raised, or an error reply taken from a pipeline.
        run_id: the run the call was about, if any (likewise ``item_id`` and ``token``).
    """
    context: dict[str, Any] = {"run_id": run_id, "item_id": item_id, "token": token}
    if isinstance(error, TLSFailed) or _tls_cause(error) is not None:
        return _tls_failed(url, error, context)
    denied = _permission_denied(error, context)
    if denied is not None:
        return denied
    if isinstance(error, AuthenticationError) or _reply_code(error) in ("NOAUTH", "WRONGPASS"):
        return _login_refused(url, error, context)
    moving = _cluster_moving(url, error, context)
    if moving is not None:
        return moving
    if isinstance(error, MasterNotFoundError):  # its text holds the sentinels' clients
        service = str(error).partition("'")[2].partition("'")[0]
        return RedisUnavailable(
            f"{_where(url)}: no sentinel answers with a primary for {service!r}; check the "
            "sentinels' addresses and the service name in --url",
            **context,
        )
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return RedisUnavailable(
            f"{_where(url)} is unreachable ({error}); check --url or REDIS_URL", **context
        )
    if isinstance(error, redis.exceptions.OutOfMemoryError) or _FULL.search(str(error)):
        return RedisFull(
            f"{_where(url)} is full (used memory over its maxmemory, and its policy evicts "
            "nothing): it refused the call; free memory, raise maxmemory, or finish or "
            "delete old runs (docs/durability.md)",
            **context,
        )
    if _reply_code(error) in BUSY_CODES:  # refused before running: nothing was written
        return RedisUnavailable(
            f"{_where(url)} is busy ({error}); the call did not run: retry", **context
        )
    if isinstance(error, redis.ResponseError) and _reply_code(error) in SCRIPT_CODES:
        return from_reply(error, **context)
    if isinstance(error, redis.ResponseError) and _NO_DATABASE.search(str(error)):
        return _no_database(url, context)
    if isinstance(error, LeaseError):
        return error
    return LeaseError(f"unexpected reply from {_where(url)}: {error}", **context)


def _cluster_moving(url: str, error: BaseException, context: dict[str, Any]) -> LeaseError | None:
    """The error for a cluster's redirection or refusal the client could not follow; None
    for other errors.

    The server checks a script's keys before running it, so the refused attempt ran
    nothing (an earlier attempt that timed out may have).
    """
    code = _reply_code(error)
    if isinstance(error, (TryAgainError, ClusterDownError, SlotNotCoveredError)) or code in (
        "TRYAGAIN",
        "CLUSTERDOWN",
    ):
        return ClusterBusy(
            f"{_where(url)} is moving or missing hash slots ({code or type(error).__name__}): "
            "the server refused the call before running it; retry (workers do)",
            **context,
        )
    if isinstance(error, (MovedError, AskError)) or code in ("MOVED", "ASK"):
        if is_cluster_url(url):
            return ClusterBusy(
                f"{_where(url)} kept redirecting the call ({code}): the server did not run it; "
                "retry (workers do)",
                **context,
            )
        return InvalidInput(
            f"{_where(url)} is a Redis Cluster node (it answered {code}): use "
            "redis+cluster://HOST:PORT[,HOST:PORT...] (README 'Scaling out')",
            **context,
        )
    if isinstance(error, RedisClusterUnreachableError):
        return RedisUnavailable(
            f"{_where(url)}: no node of the cluster answers; check --url or REDIS_URL", **context
        )
    if isinstance(error, (RedisClusterException, ClusterError)) and "TTL" in str(error):
        return ClusterBusy(
            f"{_where(url)} is moving or missing hash slots (the client's retries ran out): "
            "the server refused the call before running it; retry (workers do)",
            **context,
        )
    if code == "CROSSSLOT" or (
        isinstance(error, RedisClusterException) and "same key slot" in str(error)
    ):
        return InvalidInput(
            "the keys of one call span hash slots (CROSSSLOT): on Redis Cluster every guarded "
            "key must carry the shard's hash tag {<run_id>#<shard>} (README 'Scaling out')",
            **context,
        )
    return None


def _no_database(url: str, context: dict[str, Any]) -> InvalidInput:
    """The URL names a database the server does not have (its ``databases`` setting)."""
    try:
        database = urlsplit(url).path.strip("/") or "0"
    except ValueError:
        database = "?"
    return InvalidInput(
        f"{_where(url)} has no database {database} (the server's 'databases' setting bounds "
        "them, 16 by default: 0-15); use one it has in --url, e.g. redis://HOST:6379/0",
        **context,
    )


def _reply_code(error: BaseException) -> str:
    """The error reply's code (``NOPERM``, ``LEASE_LOST``...), '' for other errors."""
    code = getattr(error, "status_code", None)
    if isinstance(code, str) and code:
        return code
    if isinstance(error, redis.ResponseError):
        return str(error).partition(" ")[0]
    return ""


def _tls_cause(error: BaseException) -> ssl.SSLError | None:
    """The TLS error behind a connection error redis-py raised, if any."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _tls_failed(url: str, error: BaseException, context: dict[str, Any]) -> TLSFailed:
    if isinstance(error, TLSFailed):
        message = error.message
    else:
        cause = _tls_cause(error)
        message = tls_message(safe_url(url) or "Redis", str(getattr(cause, "reason", cause)))
    return TLSFailed(message, **context)


def _permission_denied(error: BaseException, context: dict[str, Any]) -> PermissionDenied | None:
    """PermissionDenied for a NOPERM reply, in a script or not; None for other errors."""
    text = str(error)
    refused = isinstance(error, NoPermissionError) or _reply_code(error) == "NOPERM"
    if not (refused or (isinstance(error, redis.ResponseError) and _DENIED.search(text))):
        return None
    command = _DENIED_COMMAND.search(text)
    name = command.group(1).replace("|", " ").upper() if command else None
    if name is not None:
        problem = f"not run {name}: grant it"
    elif "access" in text and "channel" in text:
        problem = "not access the channels it needs: grant their channel pattern"
    elif "access" in text and "key" in text:
        problem = "not access the keys it needs: grant their key pattern"
    else:
        script = _script_name(text)
        where = f"script {script!r}" if script else "a script"
        problem = f"not run a command of {where}: grant it"
    return PermissionDenied(
        f"the Redis user may {problem} (see docs/security.md)", command=name, **context
    )


def _script_name(text: str) -> str | None:
    match = _SCRIPT_SHA.search(text)
    return _script_shas().get(match.group(1)) if match else None


@cache
def _script_shas() -> dict[str, str]:
    return {hashlib.sha1(source(name).encode()).hexdigest(): name for name in KEY_COUNTS}


def _login_refused(url: str, error: BaseException, context: dict[str, Any]) -> RedisUnavailable:
    text = str(error)
    if _reply_code(error) == "NOAUTH" or "authenticated" in text:
        return RedisUnavailable(
            f"{_where(url)} needs a password (NOAUTH): check --url or REDIS_URL, e.g. "
            "redis://USER:PASSWORD@HOST:6379/0",
            **context,
        )
    return RedisUnavailable(
        f"{_where(url)} refused the login ({text}); check the user and password in --url",
        **context,
    )


class ErrorDoor:
    """Translates Redis errors into this library's errors.

    Used as a ``with`` block, it raises a Redis error from inside the block again as this
    library's error (:func:`translate`). :meth:`error` does the same for an error reply
    taken from a pipeline. This library's own errors pass through unchanged."""

    __slots__ = ("item_id", "run_id", "token", "url")

    def __init__(
        self,
        url: str,
        run_id: str | None = None,
        item_id: str | None = None,
        token: int | None = None,
    ) -> None:
        self.url, self.run_id, self.item_id, self.token = url, run_id, item_id, token

    def error(self, error: BaseException) -> Exception:
        """The library's error for what a call raised or replied."""
        return translate(
            self.url, error, run_id=self.run_id, item_id=self.item_id, token=self.token
        )

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(error, REDIS_FAILURES):
            raise self.error(error) from None


def full_refusal(url: str, error: BaseException) -> RedisFull | None:
    """The :class:`~redis_lease.errors.RedisFull` that ``error`` is (a full Redis's
    refusal, raw or already translated), for the Redis at ``url``; None for any other."""
    if isinstance(error, RedisFull):
        return error
    if not isinstance(error, redis.RedisError):
        return None
    translated = translate(url, error)
    return translated if isinstance(translated, RedisFull) else None


def translating_errors(
    url: str,
    *,
    run_id: str | None = None,
    item_id: str | None = None,
    token: int | None = None,
) -> ErrorDoor:
    """Returns the error translator for calls to the Redis at ``url`` ('' when unknown).

    The run, item and token (each when known) are attached to the errors it raises.
    Every call path of the library goes through it."""
    return ErrorDoor(url, run_id, item_id, token)
