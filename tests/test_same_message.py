"""A bad value is refused with the same message whichever door it comes through: a library
call, or the command line (one ``error: ...`` line, exit 2, nothing written). The command
line has no checks of its own: it runs the library's, before it connects."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

from redis_lease import InvalidInput, Item, Lease, LeaseStore, NotFound
from redis_lease.cli import app
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.runs.run_control import (
    finalize_if_open,
    is_open,
    new_deadline,
    requeue_items,
)
from redis_lease.fleet.worker.rq_worker import WorkerSettings
from redis_lease.operate.views import RunFilter
from tests.redis_server import free_port

RUN = "same:2026-12-02"
runner = CliRunner()


def lease(**changes: Any) -> Lease:
    """A lease by token of item 'a', with ``changes``."""
    values: dict[str, Any] = {"run_id": RUN, "item_id": "a", "shard": 0, "token": 1, "lease_id": ""}
    return Lease(**{**values, **changes})


#: (the bad value, what the library call does with it, the same through the command line).
CASES: list[tuple[str, Callable[[LeaseStore], object], list[str]]] = [
    ("run id", lambda s: s.add("a b", [Item("a")]), ["add", "a b", "a"]),
    ("item id", lambda s: s.add(RUN, [Item("a{b}")]), ["add", RUN, "a{b}"]),
    ("empty item id", lambda s: s.add(RUN, [Item("")]), ["add", RUN, ""]),
    ("shards", lambda s: s.add(RUN, [Item("a")], shards=0), ["add", RUN, "a", "--shards", "0"]),
    (
        "max attempts",
        lambda s: s.add(RUN, [Item("a")], max_attempts=0),
        ["add", RUN, "a", "--max-attempts", "0"],
    ),
    ("worker", lambda s: s.claim(RUN, "a", "bad worker"), ["claim", RUN, "a", "-w", "bad worker"]),
    (
        "ttl",
        lambda s: s.claim(RUN, "a", "w", ttl=-1),
        ["claim", RUN, "a", "-w", "w", "--ttl", "-1"],
    ),
    ("any ttl", lambda s: s.claim_any(RUN, "w", ttl=0), ["claim", RUN, "-w", "w", "--ttl", "0"]),
    ("claimed run", lambda s: s.claim_any("a}b", "w"), ["claim", "a}b", "-w", "w"]),
    (
        "renew ttl",
        lambda s: s.renew(lease(), ttl=-5),
        ["renew", RUN, "a", "--token", "1", "--ttl", "-5"],
    ),
    (
        "lease id",
        lambda s: s.release(lease(lease_id="a b")),
        ["release", RUN, "a", "--token", "1", "--lease-id", "a b"],
    ),
    (
        "trace id",
        lambda s: s.commit(lease(trace_id="a\tb")),
        ["commit", RUN, "a", "--token", "1", "--trace-id", "a\tb"],
    ),
    (
        "token",
        lambda s: s.release(lease(token=2**60)),
        ["release", RUN, "a", "--token", str(2**60)],
    ),
    (
        "error text",
        lambda s: s.fail(lease(), " "),
        ["fail", RUN, "a", "--token", "1", "--error", " "],
    ),
    ("reap limit", lambda s: s.reap(RUN, limit=0), ["reap", RUN, "--limit", "0"]),
    (
        "requeue limit",
        lambda s: s.requeue(RUN, limit=10**9),
        ["requeue", RUN, "--limit", str(10**9)],
    ),
    ("requeued item", lambda s: s.requeue(RUN, ["a b"]), ["requeue", RUN, "a b"]),
    (
        "deadline",
        lambda s: new_deadline("tomorrow", datetime.now(UTC)),
        ["resume", RUN, "--deadline", "tomorrow"],
    ),
    (
        "naive deadline",
        lambda s: new_deadline("2099-01-01T00:00", datetime.now(UTC)),
        ["resume", RUN, "--deadline", "2099-01-01T00:00"],
    ),
    (
        "past deadline",
        lambda s: new_deadline("2001-01-01T00:00+00:00", datetime.now(UTC)),
        ["resume", RUN, "--deadline", "2001-01-01T00:00+00:00"],
    ),
    (
        "far deadline",
        lambda s: new_deadline("99999999d", datetime.now(UTC)),
        ["resume", RUN, "--deadline", "99999999d"],
    ),
    ("listed job", lambda s: RunFilter(job="a b"), ["runs", "--job", "a b"]),
    ("listed state", lambda s: RunFilter(state="open"), ["runs", "--state", "open"]),
    ("listed runs", lambda s: RunFilter(limit=0), ["runs", "--limit", "0"]),
    ("queue", lambda s: WorkerSettings(queues=("a b",)), ["worker", "--queue", "a b", "--burst"]),
    (
        "concurrency",
        lambda s: WorkerSettings(concurrency=0),
        ["worker", "--concurrency", "0", "--burst"],
    ),
]


@pytest.fixture
def store(real_store: LeaseStore) -> Iterator[LeaseStore]:
    """The real Redis, with nothing under the test's prefix."""
    yield real_store
    assert list(real_store.client.scan_iter(match=f"{real_store.prefix}:*")) == []


@pytest.mark.parametrize(("what", "call", "args"), CASES, ids=[c[0] for c in CASES])
def test_the_library_and_the_command_line_say_the_same(
    store: LeaseStore,
    redis_url: str,
    what: str,
    call: Callable[[LeaseStore], object],
    args: list[str],
) -> None:
    with pytest.raises(InvalidInput) as refused:
        call(store)
    result = runner.invoke(
        app, ["--url", redis_url, "--prefix", store.prefix, *args], env={"REDIS_LEASE_DEBUG": None}
    )
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr == f"error: {refused.value}\n"


#: What the command line refuses before it connects (a new deadline needs the server's clock).
BEFORE_CONNECTING = [case for case in CASES if case[2][0] != "resume"]


@pytest.mark.parametrize(
    ("what", "call", "args"), BEFORE_CONNECTING, ids=[c[0] for c in BEFORE_CONNECTING]
)
def test_the_command_line_checks_before_it_connects(
    prefix: str, what: str, call: Callable[[LeaseStore], object], args: list[str]
) -> None:
    """The store's checks run before the command connects: bad input is exit 2 even with
    no Redis to reach."""
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    result = runner.invoke(app, ["--url", nowhere, "--prefix", prefix, *args])
    assert result.exit_code == 2, result.output


def test_a_deadline_is_a_duration_from_now_or_a_time_with_its_zone() -> None:
    now = datetime(2026, 12, 2, 22, 0, tzinfo=UTC)
    assert new_deadline("2h", now) == now + timedelta(hours=2)
    assert new_deadline("1.5d", now) == now + timedelta(hours=36)
    assert new_deadline(timedelta(hours=3), now) == now + timedelta(hours=3)
    later = "2026-12-03T06:00:00+01:00"
    assert new_deadline(later, now) == datetime.fromisoformat(later)
    with pytest.raises(InvalidInput, match="is in the past"):
        new_deadline("2026-12-02T21:59:59+00:00", now)


def test_finalize_if_open_leaves_a_final_run_alone(store: LeaseStore) -> None:
    store.add(RUN, [Item("a")])
    runs = Runs(store)
    assert is_open(runs.info(RUN))
    state, decision = finalize_if_open(runs, RUN, "finalized by a test")
    assert state == "failed" and decision is not None and not is_open(runs.info(RUN))
    again = finalize_if_open(runs, RUN, "finalized by a test")
    assert again == ("failed", None)
    for key in store.client.scan_iter(match=f"{store.prefix}:*"):
        store.client.delete(key)


def test_an_unknown_item_to_requeue_is_named_alike_and_nothing_is_requeued(
    store: LeaseStore, redis_url: str
) -> None:
    store.add(RUN, [Item("a"), Item("b")])
    lease_a = store.claim(RUN, "a", "w")
    store.fail(lease_a, "broken", permanent=True)
    with pytest.raises(NotFound) as refused:
        requeue_items(store, RUN, ["a", "nosuch"])
    result = runner.invoke(
        app, ["--url", redis_url, "--prefix", store.prefix, "requeue", RUN, "a", "nosuch"]
    )
    assert result.exit_code == 5, result.output
    assert result.stderr == f"error: {refused.value}\n"
    assert "nothing requeued" in str(refused.value)
    assert store.item(RUN, "a").state == "dead"
    assert requeue_items(store, RUN, ["a"]) == 1
    for key in store.client.scan_iter(match=f"{store.prefix}:*"):
        store.client.delete(key)
