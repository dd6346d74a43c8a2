"""Redis clients from URLs, and the one translation of what Redis answers into our errors.

``redis://``, ``rediss://`` and ``unix://`` URLs go to redis-py; ``fakeredis://NAME``
is the embedded backend: an in-process fakeredis server (with Lua), one per
NAME, shared by every client of this process that names it.

Clients made here connect within :data:`CONNECT_TIMEOUT` seconds (the TLS
handshake included) and retry connection errors and timeouts with exponential
backoff (:func:`retry_policy`), so a reset costs a reconnect, not the caller's
work. :func:`translate` turns every failure into a :class:`~.errors.RedisLeaseError`;
:func:`safe_url` masks the secrets of a URL in every message.
"""

from __future__ import annotations

import hashlib
import re
import ssl
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import RedisCluster
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
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError

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
from .errors import (
    SCRIPT_CODES,
    ClusterBusy,
    InvalidInput,
    LeaseError,
    PermissionDenied,
    RedisUnavailable,
    TLSFailed,
    from_reply,
)
from .scripts import KEY_COUNTS, source
from .tls import TLS_FILE_PARAMS as TLS_FILE_PARAMS  # re-exported: TLS lives in .tls
from .tls import VERIFIED, check_tls_params, tls_message
from .tls import InsecureTLSWarning as InsecureTLSWarning
from .tls import TLSConnection as TLSConnection
from .tls import with_tls as with_tls

#: Seconds to connect, TLS handshake included (``socket_connect_timeout``).
CONNECT_TIMEOUT = 3.0
#: Seconds to wait for an answer (``socket_timeout``).
SOCKET_TIMEOUT = 30.0
#: Retries of a command after a connection error or timeout, and their backoff (seconds).
RETRIES, BACKOFF_BASE, BACKOFF_CAP = 4, 0.1, 2.0

_T = TypeVar("_T")

#: What a call to Redis may raise: redis-py's errors (a cluster's own are not RedisErrors)
#: and the socket's.
REDIS_FAILURES = (redis.RedisError, RedisClusterException, OSError)
#: The URL schemes of real servers (fakeredis:// aside).
_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES, *SENTINEL_SCHEMES)

_fake_servers: dict[str, Any] = {}
_checked_policy: set[str] = set()
_checked_mode: set[str] = set()

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: One or more hosts with optional ports, as a URL's authority (no userinfo).
_HOSTS = re.compile(
    r"(?:[\w.-]+|\[[0-9A-Fa-f:.]*\])(?::\d*)?(?:,(?:[\w.-]+|\[[0-9A-Fa-f:.]*\])(?::\d*)?)*"
)
_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;][^=&#;]*(?:pass|pwd|secret|token|auth|credential)[^=&#;]*=)[^&#;]*",
    re.IGNORECASE,
)
_DENIED_COMMAND = re.compile(r"no permissions to run the '([^']+)' command", re.IGNORECASE)
#: How the server words an ACL refusal, in a script or not (Redis 6 to 8).
_DENIED = re.compile(r"no permissions to|can't run this command|can't access", re.IGNORECASE)
_SCRIPT_SHA = re.compile(r"script: ([0-9a-f]{40})")
#: How the server refuses a SELECT of a database it does not have.
_NO_DATABASE = re.compile(r"DB index is out of range", re.IGNORECASE)


class EvictionPolicyWarning(UserWarning):
    """Redis may evict keys (``maxmemory-policy`` is not ``noeviction``): leases could vanish."""


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


def retry_policy() -> Retry:
    """Retries after connection errors and timeouts (not a refused login), with backoff."""
    backoff = ExponentialWithJitterBackoff(base=BACKOFF_BASE, cap=BACKOFF_CAP)
    return _TransientRetry(backoff, RETRIES)


def client_from_url(url: str, **options: Any) -> redis.Redis:
    """A Redis client for ``url``.

    Unless ``options`` say otherwise it connects within :data:`CONNECT_TIMEOUT`
    seconds (TLS handshake included) and retries connection errors and timeouts
    (:func:`retry_policy`).

    Raises:
        InvalidInput: the URL is malformed or its scheme unsupported (the password masked).
    """
    scheme = _scheme(url)
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
        with redis_errors(url):  # a cluster client finds the cluster's nodes as it is made
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
    try:
        return redis.Redis.from_url(url, **options)
    except ValueError:  # its text may quote a piece of the password: not shown
        raise InvalidInput(
            f"invalid Redis URL {safe_url(url)!r}: use redis://[USER:PASSWORD@]HOST:PORT/DB "
            "with its options as documented (docs/cli.md)"
        ) from None


def _scheme(url: str) -> str:
    match = _SCHEME.match(url) if isinstance(url, str) else None
    if match is None:
        raise InvalidInput(
            f"invalid Redis URL {safe_url(str(url))!r}: use redis://HOST:PORT/DB, rediss://..., "
            "unix://PATH or fakeredis://NAME"
        )
    return match.group(1).lower()


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
    try:
        import fakeredis
    except ImportError:  # pragma: no cover - fakeredis is a dependency
        raise InvalidInput("fakeredis:// needs fakeredis: pip install 'fakeredis[lua]'") from None
    name = url.split("://", 1)[1].split("/", 1)[0] or "default"
    server = _fake_servers.setdefault(name, fakeredis.FakeServer())
    client: redis.Redis = fakeredis.FakeRedis(server=server, **options)
    return client


def resilient(client: redis.Redis) -> redis.Redis:
    """A client for the same server as ``client`` whose connections retry (:func:`retry_policy`).

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
    options["retry"] = retry_policy()
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


def warn_unless_noeviction(client: redis.Redis, url: str) -> None:
    """Warns once per URL (an :class:`EvictionPolicyWarning`) when the server may evict keys.

    The CLI prints it as a ``danger:`` line and shard jobs log it as an error:
    an evicting server can lose items, which a run then counts as lost.
    """
    if url in _checked_policy or url.startswith("fakeredis"):
        return
    _checked_policy.add(url)
    with redis_errors(url):
        danger = eviction_danger(client)
    if danger:
        warnings.warn(f"Redis at {safe_url(url)}: {danger}", EvictionPolicyWarning, stacklevel=3)


def check_server(client: redis.Redis, url: str) -> None:
    """The checks of a server a store is about to use, once per URL: a cluster node behind a
    plain URL is refused (:func:`refuse_cluster_node`), an evicting one warned about
    (:func:`warn_unless_noeviction`)."""
    refuse_cluster_node(client, url)
    warn_unless_noeviction(client, url)


def refuse_cluster_node(client: redis.Redis, url: str) -> None:
    """Refuses a ``redis://`` URL naming a node of a cluster, before anything is written
    (its writes would stop at the first key of another node's slot).

    Checked once per URL with ``HELLO`` (which every ACL user may send); a server
    too old to answer it without a protocol version is not checked.

    Raises:
        InvalidInput: the server runs in cluster mode.
    """
    if url in _checked_mode or _scheme(url) not in ("redis", "rediss", "unix"):
        return
    with redis_errors(url):
        try:
            reply = client.execute_command("HELLO")  # type: ignore[no-untyped-call]
        except redis.ResponseError:
            return
    _checked_mode.add(url)
    if not isinstance(reply, dict):  # RESP2: a flat list of names and values
        reply = dict(zip(reply[::2], reply[1::2], strict=False))
    mode = reply.get("mode", reply.get(b"mode"))
    if as_text(mode or "") == "cluster":
        raise InvalidInput(
            f"{_where(url)} is a Redis Cluster node: use redis+cluster://HOST:PORT"
            "[,HOST:PORT...] (README 'Scaling out')"
        )


def eviction_danger(client: redis.Redis) -> str | None:
    """A one-line danger when the server may evict keys, else None (also when CONFIG is refused).

    Any ``maxmemory-policy`` but ``noeviction`` can drop item records, leases and
    tokens (``allkeys-*``) or a finished run's keys before their retention ends
    (``volatile-*``); see docs/durability.md.
    """
    try:
        if is_cluster(client):  # every primary's own setting
            replies: Any = client.config_get(
                "maxmemory-policy", target_nodes=RedisCluster.PRIMARIES
            )
            found = (
                [r for r in replies.values()] if "maxmemory-policy" not in replies else [replies]
            )
        else:
            found = [client.config_get("maxmemory-policy")]  # one reply: a dict
    except redis.ResponseError:  # CONFIG disabled (managed Redis): nothing to check
        return None
    policies = {as_text(dict(reply or {}).get("maxmemory-policy", "")) for reply in found}
    policy = next((p for p in sorted(policies) if p and p != "noeviction"), "")
    if not policy:
        return None
    return (
        f"maxmemory-policy is {policy}: Redis may evict item records, leases and tokens, and "
        "items would be lost; set maxmemory-policy noeviction (docs/durability.md)"
    )


def as_text(value: Any) -> str:
    """A value read from Redis (bytes, unless decode_responses is set) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def safe_url(url: str) -> str:
    """The URL with its secrets masked: the userinfo password and secret query parameters.

    The userinfo runs from ``//`` to the last ``@`` before the path, or, when what
    comes before the path is not a host (a password with ``/`` or ``?`` in it), to
    the last ``@`` of all; so a password with ``#``, ``?``, ``@`` or ``/`` in it is
    masked whole; a userinfo without ``:`` (a password in
    the user's place) is masked whole too. Regex-free of urlsplit, so it never
    raises, also for URLs that ``urlsplit`` refuses (a bad port, a broken IPv6
    address) and for multi-host (sentinel, cluster) URLs.
    """
    text = str(url)
    start = text.find("//")
    if start >= 0:
        start += 2
        slash = text.find("/", start)
        authority_end = slash if slash >= 0 else len(text)
        at = text.rfind("@", start, authority_end)
        if at < 0 and not _HOSTS.fullmatch(text[start:authority_end]):
            at = text.rfind("@", start)  # not a host: a password with a '/' or '?' in it
        if at >= 0:
            userinfo = text[start:at]
            user, colon, _secret = userinfo.partition(":")
            masked = f"{user}:***" if colon else "***"
            text = f"{text[:start]}{masked}{text[at:]}"
    return _SECRET_PARAM.sub(lambda m: f"{m['name']}***", text)


def _where(url: str) -> str:
    return f"Redis at {safe_url(url)}" if url else "Redis"


def translate(
    url: str,
    error: BaseException,
    *,
    run_id: str | None = None,
    item_id: str | None = None,
    token: int | None = None,
) -> Exception:
    """The library's error for anything a Redis call raised or replied, for every call path.

    Connection, login, permission, timeout and TLS failures become
    :class:`~.errors.RedisUnavailable` (exit 6); script error replies become
    their :class:`~.errors.LeaseError` (:func:`~.errors.from_reply`); any other
    reply is a LeaseError naming the server. ``url`` is masked in every message.

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


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


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
    elif "access" in text and ("key" in text or "channel" in text):
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


@contextmanager
def redis_errors(
    url: str,
    *,
    run_id: str | None = None,
    item_id: str | None = None,
    token: int | None = None,
) -> Iterator[None]:
    """Raises what :func:`translate` makes of any Redis failure inside the block."""
    try:
        yield
    except REDIS_FAILURES as error:
        if isinstance(error, LeaseError):
            raise
        raise translate(url, error, run_id=run_id, item_id=item_id, token=token) from None


def queue_time(pipe: Any) -> None:
    """Queues ``TIME`` in a non-transactional pipeline; its reply is (seconds, micros).

    A cluster's pipeline refuses its ``time()`` method, not the command itself (sent to one node).
    """
    pipe.execute_command("TIME")
