"""What a store checks of a server before it uses it, once per URL: a cluster node behind
a plain URL is refused, a server that may evict keys is a danger (docs/durability.md)."""

from __future__ import annotations

import warnings
from typing import Any

import redis
from redis.cluster import RedisCluster

from ...errors import InvalidInput
from .clients import as_text
from .cluster import is_cluster
from .translate import translating_errors
from .urls import safe_url, scheme_of
from .urls import where as _where

_checked_policy: set[str] = set()
_checked_mode: set[str] = set()


class EvictionPolicyWarning(UserWarning):
    """Redis may evict keys (``maxmemory-policy`` is not ``noeviction``): leases could vanish."""


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
    if url in _checked_mode or scheme_of(url) not in ("redis", "rediss", "unix"):
        return
    with translating_errors(url):
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


def warn_unless_noeviction(client: redis.Redis, url: str) -> None:
    """Warns once per URL (an :class:`EvictionPolicyWarning`) when the server may evict keys.

    The CLI prints it as a ``danger:`` line and shard jobs log it as an error:
    an evicting server can lose items, which a run then counts as lost.
    """
    if url in _checked_policy or url.startswith("fakeredis"):
        return
    _checked_policy.add(url)
    with translating_errors(url):
        danger = eviction_danger(client)
    if danger:
        warnings.warn(f"Redis at {safe_url(url)}: {danger}", EvictionPolicyWarning, stacklevel=3)


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
