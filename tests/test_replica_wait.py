"""The option to wait for replicas (``wait_replicas``, ``wait_timeout_ms``): where it is read
from (the store's arguments, its URL, ``redis-lease worker``), the clients that never see it,
and what a store does when too few replicas acknowledge: a claim given back, an intent
marked not sent, a worker's handler given its item back. Each test that waits runs a
private server with no replica, so that every WAIT falls short (the failover itself:
tests/test_failover_tokens.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import redis
from typer.testing import CliRunner

from redis_lease import InvalidInput, Item, LeaseStore, NotReplicated
from redis_lease.cli import app
from redis_lease.fleet.effects.ledger import apply_effect
from redis_lease.fleet.transport.shard_jobs import job_store, use_replica_wait
from redis_lease.protocol.connection.clients import client_from_url
from redis_lease.protocol.connection.replica_wait import ReplicaWait, replica_wait, without_wait
from tests.redis_server import RedisServer

RUN = "r"
WAIT_MS = 50


@pytest.fixture
def lone(private_redis: Callable[..., RedisServer]) -> RedisServer:
    """A primary without replicas: every WAIT for one falls short."""
    return private_redis()


def waiting_store(server: RedisServer, prefix: str) -> LeaseStore:
    """A store on ``server`` that waits for one replica, WAIT_MS at most."""
    url = f"{server.url}?wait_replicas=1&wait_timeout_ms={WAIT_MS}"
    return LeaseStore.from_url(url, prefix=prefix)


def test_the_option_is_read_from_the_arguments_then_the_url() -> None:
    url = "redis://h:6379/0?wait_replicas=2&wait_timeout_ms=250"
    assert replica_wait(url) == ReplicaWait(2, 250)
    assert replica_wait(url, 1) == ReplicaWait(1, 250)
    assert replica_wait(url, timeout_ms=900) == ReplicaWait(2, 900)
    assert replica_wait("redis://h:6379/0?wait_replicas=1") == ReplicaWait(1, 1000)
    assert replica_wait("redis://h:6379/0") is None
    assert replica_wait(url, 0) is None  # 0: the store does not wait


@pytest.mark.parametrize(
    ("url", "replicas", "timeout", "said"),
    [
        ("redis://h/0?wait_replicas=x", None, None, "invalid wait_replicas in 'redis://h/0"),
        ("redis://h/0?wait_replicas=-1", None, None, "from 0 to 100"),
        ("redis://h/0", 101, None, "invalid wait_replicas 101: use a whole number"),
        ("redis://h/0?wait_replicas=1&wait_timeout_ms=0", None, None, "from 1 to 10000"),
        ("redis://h/0", 1, 10001, "invalid wait_timeout_ms 10001"),
        ("redis://h/0?wait_timeout_ms=5", None, None, "no wait_replicas: add wait_replicas=N"),
        ("redis://:pw@h/0?wait_replicas=x", None, None, "redis://:***@h/0"),
    ],
)
def test_a_bad_value_is_one_line_naming_it_and_the_fix(
    url: str, replicas: int | None, timeout: int | None, said: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        replica_wait(url, replicas, timeout)
    assert said in str(refused.value)
    assert "\n" not in str(refused.value)
    assert "pw" not in str(refused.value)


@pytest.mark.parametrize(
    ("url", "left"),
    [
        ("redis://h:1/0?wait_replicas=1", "redis://h:1/0"),
        ("redis://h:1/0?wait_replicas=1&wait_timeout_ms=5", "redis://h:1/0"),
        (
            "redis://h:1/0?socket_timeout=2&wait_replicas=1#x",
            "redis://h:1/0?socket_timeout=2#x",
        ),
        (
            "redis+sentinel://s:26379/mymaster/0?wait_replicas=1&sentinel_password=p",
            "redis+sentinel://s:26379/mymaster/0?sentinel_password=p",
        ),
        ("redis+cluster://a:7000,b:7001?wait_replicas=1", "redis+cluster://a:7000,b:7001"),
        ("redis://h:1/0?socket_timeout=2", "redis://h:1/0?socket_timeout=2"),
    ],
)
def test_clients_never_see_the_option(url: str, left: str) -> None:
    assert without_wait(url) == left


def test_a_client_from_a_url_with_the_option_connects(lone: RedisServer) -> None:
    """redis-py would hand an unknown URL parameter to its connections, which refuse it."""
    client = client_from_url(f"{lone.url}?wait_replicas=1&wait_timeout_ms=5")
    assert client.ping()
    client.close()


def test_the_embedded_backend_refuses_the_option(prefix: str) -> None:
    with pytest.raises(InvalidInput, match=r"fakeredis://.* has no replicas: drop wait_replicas"):
        LeaseStore.from_url("fakeredis://waits?wait_replicas=1", prefix=prefix)


def test_a_claim_no_replica_acknowledged_is_given_back(lone: RedisServer, prefix: str) -> None:
    """Breaks if the claim is handed out, if it is not given back (the item stays leased
    until its expiry, its attempt counted), or if the wait is not bounded."""
    store = waiting_store(lone, prefix)
    store.add(RUN, [Item("a"), Item("b"), Item("c")], shards=1)
    started = time.monotonic()
    with pytest.raises(NotReplicated) as refused:
        store.claim(RUN, "a", worker="w")
    assert time.monotonic() - started < 30  # bounded: not the socket timeout, not forever
    assert (refused.value.wanted, refused.value.acked, refused.value.item_id) == (1, 0, "a")
    assert "0 of 1 replicas acknowledged the claim call within 50 ms" in str(refused.value)
    assert "1 lease(s) given back: 1 released" in str(refused.value)
    with pytest.raises(NotReplicated, match="3 lease"):
        store.claim_next(RUN, "w", limit=10)
    for item in ("a", "b", "c"):
        record = store.item(RUN, item)
        assert (record.state, record.attempts, record.token) == (
            "pending",
            0,
            2 if item == "a" else 1,
        )
    assert store.with_prefix(prefix).replica_wait == ReplicaWait(1, WAIT_MS)
    store.close()


def test_an_intent_no_replica_acknowledged_is_marked_not_sent(
    lone: RedisServer, prefix: str
) -> None:
    """The effect is not sent, its record says so (failed, not sent), and the next attempt
    sends it without a reconciliation. Breaks if the provider is called, or if the intent
    is left open (a provider without lookup would then need a person to reconcile)."""
    plain = LeaseStore.from_url(lone.url, prefix=prefix)
    plain.add(RUN, [Item("a")], shards=1)
    lease = plain.claim(RUN, "a", worker="w")
    store = waiting_store(lone, prefix)
    sent: list[str] = []
    with pytest.raises(NotReplicated, match="the intent is marked failed, not sent"):
        apply_effect(store, lease, "payout", sent.append)
    assert sent == []
    record = plain.effect(RUN, "a", f"{RUN}|a|payout")
    assert record is not None and record["state"] == "failed"
    assert "not sent" in json.dumps(record)
    apply_effect(plain, lease, "payout", lambda key: sent.append(key) or {"ref": 1})
    assert sent == [f"{RUN}|a|payout"]
    plain.close()
    store.close()


def test_an_open_intent_is_left_as_it_is(lone: RedisServer, prefix: str) -> None:
    """An intent an earlier attempt recorded may have been sent: a refused wait must not
    mark it not sent. Breaks if it does."""
    plain = LeaseStore.from_url(lone.url, prefix=prefix)
    plain.add(RUN, [Item("a")], shards=1)
    lease = plain.claim(RUN, "a", worker="w")
    plain.begin_effect(lease, "k", "payout")
    store = waiting_store(lone, prefix)
    with pytest.raises(NotReplicated) as refused:
        store.begin_effect(lease, "k", "payout")
    assert "marked" not in str(refused.value)
    record = plain.effect(RUN, "a", "k")
    assert record is not None and record["state"] == "intended"
    plain.close()
    store.close()


def test_the_command_line_says_what_was_not_replicated(lone: RedisServer, prefix: str) -> None:
    base = ["--url", f"{lone.url}?wait_replicas=1&wait_timeout_ms={WAIT_MS}", "--prefix", prefix]
    runner = CliRunner()
    assert runner.invoke(app, [*base, "add", RUN, "a"]).exit_code == 0
    claimed = runner.invoke(app, [*base, "claim", RUN, "a", "--worker", "w"])
    assert claimed.exit_code == NotReplicated.exit_code == 6, claimed.output
    assert "0 of 1 replicas acknowledged the claim call" in claimed.output
    assert "Traceback" not in claimed.output


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--wait-replicas", "101"], "invalid wait_replicas 101"),
        (["--wait-replicas", "1", "--wait-timeout-ms", "0"], "invalid wait_timeout_ms 0"),
        (["--wait-timeout-ms", "5"], "no wait_replicas"),
    ],
)
def test_a_worker_refuses_a_bad_wait_before_connecting(options: list[str], said: str) -> None:
    result = CliRunner().invoke(app, ["--url", "redis://127.0.0.1:1/0", "worker", *options])
    assert result.exit_code == InvalidInput.exit_code, result.output
    assert said in result.output


def test_a_workers_jobs_wait_for_its_replicas(lone: RedisServer, prefix: str) -> None:
    """The store of an RQ job is made on RQ's connection, which carries no URL: the worker
    hands its wait on. Breaks if a job's claims would not wait."""
    connection = redis.Redis.from_url(lone.url)
    try:
        use_replica_wait(ReplicaWait(1, WAIT_MS))
        store = job_store(connection, prefix)
        assert store.replica_wait == ReplicaWait(1, WAIT_MS)
        store.add(RUN, [Item("a")], shards=1)
        with pytest.raises(NotReplicated):
            store.claim(RUN, "a", worker="w")
        store.close()
    finally:
        use_replica_wait(None)
    unwaiting = job_store(connection, prefix)
    assert unwaiting.replica_wait is None
    unwaiting.close()
    connection.close()
