"""Redis Cluster and Sentinel clients from URLs, and what differs on a cluster.

- ``redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...][?OPTIONS]`` (``rediss+cluster://``
  with TLS) selects redis-py's :class:`~redis.cluster.RedisCluster`; the hosts are
  startup nodes, the rest of the cluster is discovered. A cluster has database 0 only.
- ``redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB][?OPTIONS]``
  asks the sentinels at the hosts for the primary of ``SERVICE`` (redis-py's
  :class:`~redis.sentinel.Sentinel`) and follows it through failovers. The user and
  password are the data nodes'; ``sentinel_username`` and ``sentinel_password``
  options log in to the sentinels when they need it.

Every script touches one hash slot (the shard's tag), so the scripts run
unchanged on a cluster; RQ does not (its commands span slots), so on a cluster
RQ's queues live on a plain Redis of their own (the queue URL).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, quote

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import parse_url
from redis.sentinel import Sentinel, SentinelConnectionPool

from ...errors import InvalidInput

#: The URL schemes of a cluster, and of a primary found through sentinels.
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel",)
#: Seconds between two questions to the sentinels about which server is the primary.
PRIMARY_CHECK = 0.5
#: The options read by the sentinel client itself, not by the primary's connections.
_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")


@dataclass(frozen=True)
class MultiHostURL:
    """A URL naming several hosts: cluster startup nodes or sentinels."""

    scheme: str
    userinfo: str
    hosts: tuple[tuple[str, int], ...]
    path: tuple[str, ...]
    query: str

    @property
    def tls(self) -> bool:
        """Whether the scheme asks for TLS (``rediss+...``)."""
        return self.scheme.startswith("rediss")

    def node_url(self, host: str, port: int, db: str = "0") -> str:
        """A one-host ``redis://`` (or ``rediss://``) URL with this URL's login and options."""
        auth = f"{self.userinfo}@" if self.userinfo else ""
        query = f"?{self.query}" if self.query else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}{host}:{port}/{db}{query}"


def parse_hosts(url: str, shown: str) -> MultiHostURL:
    """Splits a multi-host URL; ``shown`` is the URL as messages may show it (masked).

    Raises:
        InvalidInput: no host, or a host without a port from 1 to 65535.
    """
    scheme, _, rest = url.partition("://")
    rest = rest.partition("#")[0]
    rest, _, query = rest.partition("?")
    authority, _, path = rest.partition("/")
    userinfo, at, hosts_text = authority.rpartition("@")
    if not at:
        userinfo, hosts_text = "", authority
    hosts = []
    for text in hosts_text.split(","):
        host, colon, port = text.strip().rpartition(":")
        if not colon:
            host, port = text.strip(), "6379" if "sentinel" not in scheme else "26379"
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidInput(
                f"invalid Redis URL {shown!r}: each host is HOST:PORT (port 1-65535), "
                f"e.g. {scheme.lower()}://127.0.0.1:7000,127.0.0.1:7001"
            )
        hosts.append((host, int(port)))
    parts = tuple(p for p in path.split("/") if p)
    return MultiHostURL(scheme.lower(), userinfo, tuple(hosts), parts, query)


def cluster_client(url: str, shown: str, options: dict[str, Any]) -> redis.Redis:
    """A :class:`RedisCluster` for a ``redis+cluster://`` URL, typed as the store's client.

    ``options`` are redis-py's; ``retry`` is the cluster client's own (it also
    follows MOVED and ASK, and waits out TRYAGAIN, a bounded number of times).
    A RedisCluster answers every command the store sends, hence the cast.
    """
    parsed = parse_hosts(url, shown)
    if parsed.path not in ((), ("0",)):
        raise InvalidInput(
            f"invalid Redis URL {shown!r}: a cluster has database 0 only; drop the "
            f"'/{'/'.join(parsed.path)}'"
        )
    first_host, first_port = parsed.hosts[0]
    try:
        settings: dict[str, Any] = dict(parse_url(parsed.node_url(first_host, first_port)))  # type: ignore[no-untyped-call]
    except ValueError:  # its text may quote a piece of the password: not shown
        raise InvalidInput(
            f"invalid Redis URL {shown!r}: use redis+cluster://[USER:PASSWORD@]HOST:PORT"
            "[,HOST:PORT...] with its options as documented (docs/cli.md)"
        ) from None
    for name in ("host", "port", "db"):
        settings.pop(name, None)
    if parsed.tls:
        settings.pop("connection_class", None)
        settings["ssl"] = True
    nodes = [ClusterNode(host, port) for host, port in parsed.hosts]  # type: ignore[no-untyped-call]
    client = RedisCluster(startup_nodes=nodes, **{**options, **settings})
    return cast(redis.Redis, client)


def sentinel_client(url: str, shown: str, options: dict[str, Any]) -> redis.Redis:
    """The primary of a ``redis+sentinel://HOST:PORT[,...]/SERVICE[/DB]`` URL.

    The client asks the sentinels for the primary when it connects, and again
    after a failover breaks its connections.
    """
    parsed = parse_hosts(url, shown)
    if len(parsed.path) not in (1, 2) or (not parsed.path[-1].isdigit() and len(parsed.path) == 2):
        raise InvalidInput(
            f"invalid Redis URL {shown!r}: name the service, "
            "redis+sentinel://HOST:26379[,HOST:26379...]/SERVICE[/DB], e.g. .../mymaster/0"
        )
    service, db = parsed.path[0], parsed.path[1] if len(parsed.path) == 2 else "0"
    params = dict(parse_qsl(parsed.query, keep_blank_values=True))
    login = {
        name.removeprefix("sentinel_"): params.pop(name)
        for name in _SENTINEL_OPTIONS
        if name in params
    }
    query = "&".join(f"{quote(n, safe='')}={quote(v, safe='')}" for n, v in params.items())
    one = MultiHostURL(parsed.scheme, parsed.userinfo, parsed.hosts, parsed.path, query)
    try:
        settings: dict[str, Any] = dict(parse_url(one.node_url("sentinel", 1, db)))  # type: ignore[no-untyped-call]
    except ValueError:
        raise InvalidInput(
            f"invalid Redis URL {shown!r}: use redis+sentinel://[USER:PASSWORD@]HOST:PORT"
            "[,HOST:PORT...]/SERVICE[/DB] with its options as documented (docs/cli.md)"
        ) from None
    for name in ("host", "port"):
        settings.pop(name, None)
    timeouts: dict[str, Any] = {
        name: options[name]
        for name in ("socket_connect_timeout", "socket_timeout")
        if name in options
    }
    sentinels = Sentinel(
        list(parsed.hosts),
        sentinel_kwargs={**timeouts, **login},
        **{**options, **settings},
    )
    client: redis.Redis = sentinels.master_for(service, connection_pool_class=FollowingPool)
    return client


class FollowingPool(SentinelConnectionPool):
    """A sentinel pool that asks the sentinels which server is the primary at most every
    :data:`PRIMARY_CHECK` seconds as connections are taken, and leaves a former one at once.

    redis-py asks only when it connects, so a client would go on writing to a former
    primary until the sentinel demotes it (10 to 16 s after ``SENTINEL FAILOVER`` in the
    tests), and those writes are lost when that server resyncs. This narrows the window
    to the check's interval; asynchronous replication still keeps one
    (docs/durability.md).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._checked = 0.0
        self._asking = threading.Lock()  # one thread asks; the others go on meanwhile

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        """A connection to the primary the sentinels name (asked again when it is time)."""
        if time.monotonic() - self._checked >= PRIMARY_CHECK and self._asking.acquire(
            blocking=False
        ):
            try:
                self._checked = time.monotonic()
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    # on a new primary, idle connections are dropped
                    self.get_master_address()  # type: ignore[no-untyped-call]
            finally:
                self._asking.release()
        connection = super().get_connection(*args, **kwargs)
        primary = self.master_address
        where = (connection.host, connection.port)
        if primary is not None and connection.host and where != primary:
            # its next command connects to the primary named now
            connection.disconnect()  # type: ignore[no-untyped-call]
        return connection


def is_cluster(client: Any) -> bool:
    """Whether ``client`` talks to a Redis Cluster."""
    return isinstance(client, RedisCluster)


def is_sentinel(client: Any) -> bool:
    """Whether ``client`` finds its primary through sentinels."""
    return isinstance(getattr(client, "connection_pool", None), SentinelConnectionPool)


def describe_cluster(client: Any) -> str:
    """``redis+cluster://`` with the cluster's primaries (no password)."""
    nodes = sorted(node.name for node in client.get_primaries())
    return f"redis+cluster://{','.join(nodes)}"


def describe_sentinel(client: Any) -> str:
    """``redis+sentinel://`` with the sentinels, the service and the database (no password)."""
    pool = client.connection_pool
    hosts = ",".join(
        f"{s.connection_pool.connection_kwargs.get('host')}:"
        f"{s.connection_pool.connection_kwargs.get('port')}"
        for s in pool.sentinel_manager.sentinels
    )
    db = pool.connection_kwargs.get("db", 0)
    return f"redis+sentinel://{hosts}/{pool.service_name}/{db}"
