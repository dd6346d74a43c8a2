"""Tokens across a Redis crash: SIGKILL the server mid-stream, restart it, claim again.

With ``appendonly yes`` and ``appendfsync always`` Redis writes and fsyncs every
script's effects before it replies, so no token a client has seen can be handed
out again after a restart. The weaker settings are documented here by tests
that assert only what they guarantee; see docs/durability.md.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_lease import LeaseStore
from redis_lease.errors import LeaseLost, NotFound, RedisUnavailable
from redis_lease.protocol.leases import COUNT_STATES, Item
from tests.faults import recorder
from tests.faults.checker import check_grants
from tests.faults.recorder import OK, Op
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

RUN = "durable:2026-01-01"
SHARDS = 2
ITEMS = 300
BATCH = 25
#: short enough that the claimer keeps taking over its own expired leases
TTL_MS = 20
#: claims seen before the server is killed
BEFORE_KILL = 1500

ServerFactory = Callable[..., RedisServer]


def connect(server: RedisServer, prefix: str) -> LeaseStore:
    """A store on ``server`` whose client fails at once when the server is gone (no retries)."""
    return LeaseStore.from_url(server.url, prefix=prefix, retry=Retry(NoBackoff(), 0))


def server_ms(store: LeaseStore) -> int:
    """The server clock in milliseconds, as the scripts read it."""
    seconds, micros = store.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def item_ids() -> list[str]:
    return [f"acct_{n}:2026-01-01" for n in range(ITEMS)]


def recorded(directory: Path, work: Callable[[], None]) -> list[Op]:
    """The history of the script calls ``work`` makes (recorded into ``directory``)."""
    directory.mkdir()
    uninstall = recorder.install(directory, "test")
    try:
        work()
    finally:
        uninstall()
    return recorder.read_ops(list(recorder.read_lines(directory)))


def grants(ops: list[Op]) -> list[dict[str, Any]]:
    """Every lease the history shows granted."""
    return [g for op in ops if op.type == OK for g in op.get("grants") or []]


def claim_until_killed(server: RedisServer, store: LeaseStore) -> None:
    """Claims in a background thread and SIGKILLs the server while it does."""
    claimed = 0
    enough = threading.Event()
    ended: list[BaseException] = []

    def claimer() -> None:
        nonlocal claimed
        try:
            while True:
                claimed += len(store.claim_next(RUN, "before", limit=BATCH, ttl=TTL_MS / 1000))
                if claimed >= BEFORE_KILL:
                    enough.set()
        except BaseException as error:  # recorded and asserted on below
            ended.append(error)
            enough.set()

    thread = threading.Thread(target=claimer, daemon=True)
    thread.start()
    assert enough.wait(60), "the claimer made no progress"
    server.kill()
    thread.join(30)
    assert not thread.is_alive()
    # the kill came while the claimer was still claiming
    assert len(ended) == 1 and isinstance(ended[0], RedisUnavailable), ended
    store.client.close()


def claim_all_again(store: LeaseStore, ids: list[str]) -> None:
    """After the restart: claims every item once on a long lease (waiting out live leases)."""
    wanted = set(ids)
    deadline = time.monotonic() + 30
    while wanted:
        assert time.monotonic() < deadline, f"{len(wanted)} items never became claimable"
        leases = store.claim_next(RUN, "after", limit=100, ttl=60)
        wanted.difference_update(lease.item_id for lease in leases)
        if not leases:
            time.sleep(0.005)  # some pre-crash lease has not expired yet; poll


def assert_consistent(store: LeaseStore) -> Counter[str]:
    """Counters and indexes agree with the item records; returns the states counted."""
    states: Counter[str] = Counter()
    for shard in range(SHARDS):
        _meta, _counts, _items, due, leases, held, dead = store.keys.shard(RUN, shard)
        records = list(store.items(RUN, shard))
        states.update(rec.state for rec in records)
        by_state = {s: {r.item_id for r in records if r.state == s} for s in COUNT_STATES}
        members: dict[str, Any] = {
            "pending": store.client.zrange(due, 0, -1),
            "leased": store.client.zrange(leases, 0, -1),
            "dead": store.client.zrange(dead, 0, -1),
        }
        for state, raw in members.items():
            assert {str(m, "utf-8") for m in raw} == by_state[state], (shard, state)
        assert store.client.zcard(held) == len(by_state["leased"])
        for rec in records:
            if rec.state == "leased":
                assert store.client.zscore(leases, rec.item_id) == rec.expires_at_ms
    assert store.status(RUN).counts == {s: states.get(s, 0) for s in COUNT_STATES}
    return states


def test_aof_always_never_hands_out_a_token_twice(
    private_redis: ServerFactory, prefix: str, tmp_path: Path
) -> None:
    server = private_redis(appendonly="yes", appendfsync="always")
    store = connect(server, prefix)
    ids = item_ids()
    store.add(RUN, [Item(i) for i in ids], shards=SHARDS, max_attempts=1000)

    before = recorded(tmp_path / "before", lambda: claim_until_killed(server, store))
    seen = check_grants(before).max_token
    assert len(seen) > ITEMS // 2  # the crash came after most items had leases
    # the claim in flight at the kill has no reply: its outcome is unknown
    assert [op.type for op in before][-1] == "info"

    server.start()
    store = connect(server, prefix)
    after = recorded(tmp_path / "after", lambda: claim_all_again(store, ids))

    for grant in grants(after):
        assert grant["token"] > seen.get(grant["item"], 0), (
            f"{grant['item']}: token {grant['token']} after the restart, "
            f"but {seen[grant['item']]} was handed out before it"
        )
    # and over the whole history: every token once, in claim order (a gap is allowed:
    # the claim in flight at the kill may have been stored without its reply arriving)
    check_grants(before + after)
    for grant in grants(after):
        assert store.item(RUN, grant["item"]).token == grant["token"]
    assert assert_consistent(store) == {"leased": ITEMS}
    store.client.close()


def test_aof_everysec_restarts_consistent(
    private_redis: ServerFactory,
    prefix: str,
    record_property: Callable[[str, object], None],
    tmp_path: Path,
) -> None:
    """A demonstration, not a guarantee of loss or of no loss.

    With ``everysec`` a power loss can drop about the last second of writes, and
    under a slow disk even a process kill can (Redis may postpone its write()
    while a background fsync lags). What still holds after any restart: the data
    is a consistent prefix of the scripts' effects (each script is one MULTI/EXEC
    block in the AOF, a torn tail is dropped), so counters and indexes agree with
    the records. Whether a token was handed out twice is recorded, not asserted.
    """
    server = private_redis(appendonly="yes", appendfsync="everysec")
    store = connect(server, prefix)
    ids = item_ids()
    store.add(RUN, [Item(i) for i in ids], shards=SHARDS, max_attempts=1000)

    before = recorded(tmp_path / "before", lambda: claim_until_killed(server, store))
    seen = check_grants(before).max_token

    server.start()
    store = connect(server, prefix)
    states = assert_consistent(store)
    stored = {rec.item_id for shard in range(SHARDS) for rec in store.items(RUN, shard)}
    present = [i for i in ids if i in stored]
    reissued = 0
    if present:
        after = recorded(tmp_path / "after", lambda: claim_all_again(store, present))
        reissued = sum(g["token"] <= seen.get(g["item"], 0) for g in grants(after))
        assert_consistent(store)
    record_property("items_after_restart", sum(states.values()))
    record_property("tokens_reissued", reissued)
    store.client.close()


def test_without_persistence_tokens_restart(private_redis: ServerFactory, prefix: str) -> None:
    """Why persistence is required: a restart that loses data resets the tokens.

    A stale holder's full lease is still refused (its random lease id is not the
    new one), but a commit by token alone (``lease_ref`` without a lease id, as
    from a command line) is accepted once the new tokens catch up with it.
    """
    server = private_redis(appendonly="no", save="")
    store = connect(server, prefix)
    store.add(RUN, [Item("acct_1")], shards=1)
    stale = None
    for _ in range(3):  # tokens 1, 2, 3; each short lease waited out on the server clock
        stale = store.claim(RUN, "acct_1", "before", ttl=0.005)
        while server_ms(store) < stale.expires_at_ms:
            time.sleep(0.001)
    assert stale is not None and stale.token == 3
    stale = store.renew(store.claim(RUN, "acct_1", "before", ttl=60), ttl=60)
    assert stale.token == 4

    server.kill()
    store.client.close()
    server.start()
    store = connect(server, prefix)
    with pytest.raises(NotFound):
        store.item(RUN, "acct_1")  # everything is gone

    store.add(RUN, [Item("acct_1")], shards=1)  # the planner adds the item again
    for _ in range(3):
        lease = store.claim(RUN, "acct_1", "after", ttl=0.005)
        while server_ms(store) < lease.expires_at_ms:
            time.sleep(0.001)
    lease = store.claim(RUN, "acct_1", "after", ttl=60)
    assert lease.token == stale.token == 4  # the same token, handed out twice

    with pytest.raises(LeaseLost):
        store.commit(stale, result="stale")
    outcome = store.commit(store.lease_ref(RUN, "acct_1", stale.token), result="stale")
    assert not outcome.repeated and outcome.result == "stale"  # the stale holder won
    # the current holder is told its commit already happened, with the stale result
    current = store.commit(lease, result="current")
    assert current.repeated and current.result == "stale"
    store.client.close()
