"""Small shared test helpers: the server clock, key snapshots, text decoding."""

from __future__ import annotations

import time
from typing import Any

import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redis_lease import LeaseStore
from redis_lease.operate.metrics.collector import LeaseCollector
from redis_lease.protocol.leases import read_items


def text(value: Any) -> Any:
    """Decodes bytes (also inside lists) so replies compare equal on every backend."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [text(v) for v in value]
    return value


def server_ms(client: redis.Redis) -> int:
    """The server clock in milliseconds (the clock that decides lease expiry)."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_past(client: redis.Redis, ms: int, timeout: float = 5.0) -> int:
    """Polls the server clock until it is past ``ms``; returns the server time then."""
    deadline = time.monotonic() + timeout
    while True:
        now = server_ms(client)
        if now > ms:
            return now
        if time.monotonic() > deadline:
            raise AssertionError(f"server clock did not pass {ms} within {timeout}s (at {now})")
        time.sleep(0.002)


def dump_key(client: redis.Redis, key: str) -> Any:
    """A key's type and content as plain, comparable data (None when it is missing)."""
    kind = text(client.type(key))
    if kind == "none":
        return None
    if kind == "hash":
        return ("hash", {text(f): text(v) for f, v in client.hgetall(key).items()})
    if kind == "zset":
        pairs: Any = client.zrange(key, 0, -1, withscores=True)
        return ("zset", {text(m): s for m, s in pairs})
    if kind == "set":
        return ("set", {text(m) for m in client.smembers(key)})
    if kind == "string":
        return ("string", text(client.get(key)))
    if kind == "list":
        return ("list", text(client.lrange(key, 0, -1)))
    return (kind, None)


def stable_dump(client: redis.Redis, key: Any) -> Any:
    """A key's content as raw bytes, equal whenever the content is: DUMP, except that a hash
    or a set is read as sorted fields or members (a DUMP of a hash table follows its bucket
    order, which a read may change while the table is being rehashed)."""
    kind = client.type(key)
    if kind == b"hash":
        return (kind, sorted(client.hgetall(key).items()))  # type: ignore[union-attr]
    if kind == b"set":
        return (kind, sorted(client.smembers(key)))  # type: ignore[arg-type]
    return client.dump(key)


def keys_under(client: redis.Redis, prefix: str) -> list[str]:
    """Every key name under ``prefix:``, sorted."""
    return sorted(text(k) for k in client.scan_iter(match=f"{prefix}:*", count=1000))


def snapshot(client: redis.Redis, prefix: str) -> dict[str, Any]:
    """Every key under ``prefix:`` with its content, to show that nothing changed."""
    return {key: dump_key(client, key) for key in keys_under(client, prefix)}


def records(client: redis.Redis, items_key: str) -> dict[str, dict[str, Any]]:
    """The decoded item records of one shard's items hash."""
    return read_items(client.hgetall(items_key))


def scrape(store: LeaseStore) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every Prometheus sample of the store's metrics, by name and labels."""
    registry = CollectorRegistry()
    registry.register(LeaseCollector(store))
    text_ = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text_)
        for sample in family.samples
    }
