"""A full Redis (``maxmemory`` reached under ``noeviction``): what must write says so in one
line with its own exit code (13); the read-only views still answer."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from typer.testing import CliRunner

from redis_lease import Item, LeaseStore
from redis_lease.errors import RedisFull
from tests.redis_server import RedisServer

FULL_LINE = (
    "is full (used memory over its maxmemory, and its policy evicts nothing): it refused "
    "the call; free memory, raise maxmemory, or finish or delete old runs"
)


def fill(client: redis.Redis) -> int:
    """Writes filler keys until the server refuses one, then lowers ``maxmemory`` well under
    what is used (so that no write fits, however the usage moves); how many went in."""
    written = 0
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        while written < 100_000:
            client.set(f"filler:{written}", "x" * 10_000)
            written += 1
    client.config_set("maxmemory", "1mb")
    return written


def test_a_full_redis_refuses_writes_in_one_line_and_the_views_still_answer(
    private_redis: Callable[..., RedisServer], prefix: str
) -> None:
    from redis_lease.cli import app

    server = private_redis(maxmemory="4mb", **{"maxmemory-policy": "noeviction"})
    store = LeaseStore.from_url(server.url, prefix=prefix)
    store.add("r", [Item("a"), Item("b"), Item("c")], shards=2)
    admin = redis.Redis.from_url(server.url)
    assert fill(admin) > 0

    with pytest.raises(RedisFull) as refused:
        store.add("r", [Item("d")])
    assert refused.value.exit_code == 13 and FULL_LINE in refused.value.message
    assert store.status("r").total == 3, "nothing written"

    runner = CliRunner()
    base = ["--url", server.url, "--prefix", prefix]
    added = runner.invoke(app, [*base, "add", "r", "e"])
    assert added.exit_code == 13, added.output
    assert added.stderr.count("\n") == 1 and FULL_LINE in added.stderr
    assert "Traceback" not in added.output
    for view in (["runs"], ["status"], ["status", "r"]):
        shown = runner.invoke(app, [*base, *view], env={"COLUMNS": "200"})
        assert shown.exit_code == 0, (view, shown.output)
        assert "r" in shown.stdout.split()
    detail = runner.invoke(app, [*base, "status", "r"]).stdout
    assert "pending\t3" in detail.splitlines()

    admin.flushall()  # memory freed: writes go on
    admin.config_set("maxmemory", "4mb")
    store.add("r", [Item("a"), Item("b"), Item("c")], shards=2)
    store.add("r", [Item("d")])
    assert store.status("r").total == 4
    admin.close()
    store.client.close()
