"""Redis clients from URLs.

``redis://``, ``rediss://`` and ``unix://`` URLs go to redis-py's ``Redis``,
``redis+cluster://`` to its ``RedisCluster``, ``redis+sentinel://`` to a primary
found through Sentinel (:mod:`.cluster`); ``fakeredis://NAME`` is the embedded
backend: an in-process fakeredis server (with Lua), one per NAME, shared by every
client of this process that names it.

Clients made here connect within :data:`CONNECT_TIMEOUT` seconds (the TLS
handshake included) and retry connection errors and timeouts with exponential
backoff (:func:`retry_policy`), so a reset costs a reconnect, not the caller's
work. What they raise is translated in :mod:`.translate`; :mod:`.server_checks`
checks the server they reach.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import AuthenticationError
from redis.retry import Retry

from ...errors import InvalidInput
from ...extras import optional_import
from .cluster import (
    CLUSTER_SCHEMES,
    SENTINEL_SCHEMES,
    cluster_client,
    describe_cluster,
    describe_sentinel,
    is_cluster,
    is_sentinel,
    sentinel_client,
)
from .replica_wait import without_wait
from .tls import VERIFIED, check_tls_params
from .tls import InsecureTLSWarning as InsecureTLSWarning
from .tls import TLSConnection as TLSConnection
from .tls import with_tls as with_tls
from .translate import translating_errors
from .urls import safe_url, scheme_of

#: Seconds to connect, TLS handshake included (``socket_connect_timeout``).
CONNECT_TIMEOUT = 3.0
#: Seconds to wait for an answer (``socket_timeout``).
SOCKET_TIMEOUT = 30.0
#: Retries of a command after a connection error or timeout, and their backoff (seconds).
RETRIES, BACKOFF_BASE, BACKOFF_CAP = 4, 0.1, 2.0

_T = TypeVar("_T")

#: The URL schemes of real servers (fakeredis:// aside).
_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES, *SENTINEL_SCHEMES)

_fake_servers: dict[str, Any] = {}


class _TransientRetry(Retry):
    """redis-py's Retry, except for a refused login: a password does not mend by waiting."""

    def call_with_retry(
        self,
        do: Callable[[], _T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> _T:
        def transient(error: Exception) -> bool:
            if isinstance(error, AuthenticationError):
                return False
            return is_retryable is None or is_retryable(error)

        return super().call_with_retry(do, fail, transient, with_failure_count)


def retry_backoff() -> ExponentialWithJitterBackoff:
    """The backoff between two tries of :func:`retry_policy`."""
    return ExponentialWithJitterBackoff(base=BACKOFF_BASE, cap=BACKOFF_CAP)


def retry_policy() -> Retry:
    """Retries after connection errors and timeouts (not a refused login), with backoff."""
    return _TransientRetry(retry_backoff(), RETRIES)


def client_from_url(url: str, **options: Any) -> redis.Redis:
    """A Redis client for ``url``.

    Unless ``options`` say otherwise it connects within :data:`CONNECT_TIMEOUT`
    seconds (TLS handshake included) and retries connection errors and timeouts
    (:func:`retry_policy`).

    The store's own URL parameters (``wait_replicas``, ``wait_timeout_ms``: see
    :mod:`.replica_wait`) are left out of the client's options.

    Raises:
        InvalidInput: the URL is malformed or its scheme unsupported (the password masked).
    """
    url = without_wait(url)
    scheme = scheme_of(url)
    if scheme == "fakeredis":
        return _fake_client(url, options)
    if scheme not in _SCHEMES:
        raise InvalidInput(
            f"unsupported Redis URL {safe_url(url)!r}: use redis://, rediss://, unix://, "
            "redis+cluster://, rediss+cluster://, redis+sentinel:// or fakeredis://"
        )
    check_tls_params(url, "rediss" if scheme.startswith("rediss") else scheme)
    options.setdefault("socket_connect_timeout", CONNECT_TIMEOUT)
    options.setdefault("socket_timeout", SOCKET_TIMEOUT)
    options.setdefault("retry", retry_policy())
    if scheme in CLUSTER_SCHEMES:
        if scheme == "rediss+cluster":
            options.setdefault("connection_class", TLSConnection)
            for name, value in VERIFIED.items():  # the URL's own parameters still win
                options.setdefault(name, value)
        with translating_errors(url):  # a cluster client finds the cluster's nodes as it is made
            return cluster_client(url, safe_url(url), options)
    options.setdefault("health_check_interval", 30)
    if scheme in SENTINEL_SCHEMES:
        return sentinel_client(url, safe_url(url), options)
    if scheme != "unix":
        _check_network_url(url)
    if scheme == "rediss":
        options.setdefault("connection_class", TLSConnection)
        for name, value in VERIFIED.items():  # the URL's own parameters still win
            options.setdefault(name, value)
    _name_the_driver(options)
    try:
        return redis.Redis.from_url(url, **options)
    except ValueError:  # its text may quote a piece of the password: not shown
        raise InvalidInput(
            f"invalid Redis URL {safe_url(url)!r}: use redis://[USER:PASSWORD@]HOST:PORT/DB "
            "with its options as documented (docs/cli.md)"
        ) from None


def _name_the_driver(options: dict[str, Any]) -> None:
    """redis-py's name and version for the server (``CLIENT SETINFO``) as redis-py makes
    them, its version taken from ``redis.__version__``: redis-py 7 and later look for it
    in every installed package's metadata when the first connection is made (tens of ms)."""
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # an older redis-py, which finds its version as it is imported
        return
    options.setdefault("driver_info", DriverInfo(lib_version=redis.__version__))


def _check_network_url(url: str) -> None:
    """Refuses what redis-py would reject with a raw error or silently ignore."""
    shown = safe_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # its text may quote a piece of the password: not shown
        raise InvalidInput(
            f"invalid Redis URL {shown!r}: its host or port cannot be read; use "
            "redis://HOST:PORT/DB (percent-encode '#', '?', '/' and '@' in a password)"
        ) from None
    if port == 0:
        raise InvalidInput(f"invalid Redis URL {shown!r}: the port must be from 1 to 65535")
    database = parts.path.strip("/")
    if database and not database.isdigit():
        raise InvalidInput(
            f"invalid Redis URL {shown!r}: the database {database!r} must be a number, "
            "e.g. redis://HOST:6379/0"
        )


def _fake_client(url: str, options: dict[str, Any]) -> redis.Redis:
    fakeredis = optional_import("fakeredis", "demo", "the embedded backend (fakeredis://)")
    name = url.split("://", 1)[1].split("/", 1)[0] or "default"
    server = _fake_servers.setdefault(name, fakeredis.FakeServer())
    client: redis.Redis = fakeredis.FakeRedis(server=server, **options)
    return client


def resilient(client: redis.Redis, retry: Retry | None = None) -> redis.Redis:
    """A client for the same server as ``client`` whose connections retry (:func:`retry_policy`,
    or ``retry`` when given).

    For a connection made elsewhere (e.g. the one RQ hands a job): its pool's
    options are kept, the retry policy is set, and ``client`` is left as it was.
    An embedded (fakeredis) client is returned as it is.
    """
    if type(client).__module__.startswith("fakeredis") or is_sentinel(client):
        return client  # a sentinel's connections got the retry policy where they were made
    pool = client.connection_pool
    # The pool adds these for itself; a new pool makes its own.
    options = {
        name: value
        for name, value in pool.connection_kwargs.items()
        if name not in ("himport_registry", "maint_notifications_pool_handler")
    }
    options["retry"] = retry if retry is not None else retry_policy()
    if options.get("socket_connect_timeout") is None:
        options["socket_connect_timeout"] = CONNECT_TIMEOUT
    connection_class = pool.connection_class
    if connection_class is redis.SSLConnection:
        connection_class = TLSConnection
    if issubclass(connection_class, redis.SSLConnection):
        for name, value in VERIFIED.items():
            options.setdefault(name, value)
    new_pool = type(pool)(connection_class=connection_class, **options)
    return redis.Redis.from_pool(new_pool)


def describe(client: redis.Redis) -> str:
    """A URL-like name of the client's server for messages (never with a password)."""
    if is_cluster(client):
        return describe_cluster(client)
    if is_sentinel(client):
        return describe_sentinel(client)
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    tls = issubclass(client.connection_pool.connection_class, redis.SSLConnection)
    where = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
    return f"{'rediss' if tls else 'redis'}://{where}"


def as_text(value: Any) -> str:
    """A value read from Redis (bytes, unless decode_responses is set) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def queue_time(pipe: Any) -> None:
    """Queues ``TIME`` in a non-transactional pipeline; its reply is (seconds, micros).

    A cluster's pipeline refuses its ``time()`` method, not the command itself (sent to one node).
    """
    pipe.execute_command("TIME")


def time_ms(reply: Any) -> int:
    """A ``TIME`` reply (seconds, microseconds) as epoch milliseconds: the server's clock
    as every script reads it (``now_ms`` of ``lua/include/protocol.lua``)."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def server_ms(client: Any) -> int:
    """The Redis server's clock in epoch milliseconds (one ``TIME``); inside a pipeline,
    :func:`queue_time` and :func:`time_ms` of its reply."""
    return time_ms(client.time())
