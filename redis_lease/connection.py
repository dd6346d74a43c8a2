"""Redis clients from URLs, and the error translation for connection failures.

``redis://``, ``rediss://`` and ``unix://`` URLs go to redis-py; ``fakeredis://NAME``
is the embedded backend: an in-process fakeredis server (with Lua), one per
NAME, shared by every client of this process that names it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.exceptions import AuthenticationError, AuthorizationError, NoPermissionError

from .errors import InvalidInput, RedisUnavailable

_fake_servers: dict[str, Any] = {}
_checked_policy: set[str] = set()


class EvictionPolicyWarning(UserWarning):
    """Redis may evict keys (``maxmemory-policy`` is not ``noeviction``): leases could vanish."""


def client_from_url(url: str, **options: Any) -> redis.Redis:
    """A Redis client for ``url``; raises InvalidInput for an unknown scheme."""
    scheme = urlsplit(url).scheme
    if scheme == "fakeredis":
        try:
            import fakeredis
        except ImportError:  # pragma: no cover - fakeredis is a dependency
            raise InvalidInput(
                "fakeredis:// needs fakeredis: pip install 'fakeredis[lua]'"
            ) from None
        name = urlsplit(url).netloc or "default"
        server = _fake_servers.setdefault(name, fakeredis.FakeServer())
        return fakeredis.FakeRedis(server=server, **options)
    if scheme not in ("redis", "rediss", "unix"):
        raise InvalidInput(
            f"unsupported Redis URL {url!r}: use redis://, rediss://, unix:// or fakeredis://"
        )
    options.setdefault("socket_connect_timeout", 5)
    options.setdefault("socket_timeout", 30)
    options.setdefault("health_check_interval", 30)
    try:
        return redis.Redis.from_url(url, **options)
    except ValueError as error:
        raise InvalidInput(f"invalid Redis URL {url!r}: {error}") from None


def warn_unless_noeviction(client: redis.Redis, url: str) -> None:
    """Warns once per URL when the server may evict keys."""
    if url in _checked_policy or url.startswith("fakeredis"):
        return
    _checked_policy.add(url)
    with redis_errors(url):
        try:
            policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
        except redis.ResponseError:  # CONFIG disabled (managed Redis): nothing to check
            return
    if policy and policy != "noeviction":
        warnings.warn(
            f"Redis at {safe_url(url)} has maxmemory-policy {policy}: leases and tokens may be "
            "evicted; set maxmemory-policy noeviction",
            EvictionPolicyWarning,
            stacklevel=3,
        )


def as_text(value: Any) -> str:
    """A value read from Redis (bytes, unless decode_responses is set) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def safe_url(url: str) -> str:
    """The URL without its password."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


def unavailable(url: str, error: redis.RedisError | OSError) -> RedisUnavailable | None:
    """RedisUnavailable for a connection, auth or timeout failure; None for other errors."""
    if isinstance(error, (AuthenticationError, AuthorizationError, NoPermissionError)):
        return RedisUnavailable(
            f"Redis at {safe_url(url)} refused the login ({error}); check the password in --url"
        )
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return RedisUnavailable(
            f"Redis at {safe_url(url)} is unreachable ({error}); check --url or REDIS_URL"
        )
    if isinstance(error, redis.ResponseError) and str(error).startswith(
        ("NOAUTH", "WRONGPASS", "NOPERM")
    ):
        return RedisUnavailable(
            f"Redis at {safe_url(url)} refused the command ({error}); check the credentials"
        )
    return None


@contextmanager
def redis_errors(url: str) -> Iterator[None]:
    """Turns redis-py's connection, auth and timeout errors into RedisUnavailable."""
    try:
        yield
    except (redis.RedisError, OSError) as error:
        translated = unavailable(url, error)
        if translated is None:
            raise
        raise translated from None
