"""A failover to a replica that lacks the last claims, with and without waiting for replicas.

Replication is asynchronous: a primary answers a claim before its replica has it. Each test
here runs its own primary and replica (private ``redis-server`` processes). The replica
lags (SIGSTOP, and its link dropped, so that it misses what follows); claims go to the
primary; the primary is SIGKILLed and the replica promoted (``REPLICAOF NO ONE``); claims go
to it: a Sentinel's failover, done by hand so that its moments are exact. Every script call
is recorded (:mod:`tests.faults.recorder`) and the grants are judged by the history
checker's rules (``duplicate-grant``, ``token-order``).

- Without waiting (the default): the promoted replica grants the same token number to a
  second holder. Inside Redis the first holder is still refused (its lease id is not the
  record's), but anything that fences on the token number alone is fooled.
- With ``wait_replicas=1``: a claim is handed out only once the replica has it, so the
  lagging replica's claim is refused (``NotReplicated``) and given back; after the failover
  the new primary refuses claims until a replica follows it again, then grants; no token
  number is held by two holders, and the checker passes.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from redis_lease import Item, LeaseLost, LeaseStore, NotReplicated
from redis_lease.demo.provider import ProviderState
from redis_lease.protocol.leases import Lease
from tests.faults.checker import Breach, Violation, check_grants
from tests.faults.recorder import Op, install, read_lines, read_ops
from tests.helpers import server_ms
from tests.redis_cluster import ClusterServers, _admin
from tests.redis_server import RedisServer
from tests.test_sentinel import SentinelCluster, cut_replica, judge_on

pytestmark = pytest.mark.slow

RUN = "nightly:2026-12-02"
#: The replica's wait in the tests (ms): short, the replica is stopped or gone.
WAIT_MS = 300
#: No delay before a diskless full sync (5 s by default): a replica links at once.
FAST_SYNC = {"repl-diskless-sync-delay": "0"}


def admin(server: RedisServer) -> redis.Redis:
    """A plain client of one server (closed by the caller)."""
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)


def poll(what: str, check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Polls ``check`` until it holds; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def follow(replica: RedisServer, primary: RedisServer) -> None:
    """Makes ``replica`` replicate ``primary`` and waits until it has the whole stream."""
    with admin(replica) as client:
        client.execute_command("REPLICAOF", "127.0.0.1", primary.port)
    caught_up(replica, primary)


def caught_up(replica: RedisServer, primary: RedisServer) -> None:
    """Waits until the replica acknowledges what the primary writes now: a write of a probe
    key, then WAIT on the same connection (the primary's only replica is ``replica``).

    The replica's link being up is not enough: after a full sync Redis 7 starts its command
    stream only with the replica's first acknowledgement, up to a second later.
    """
    with admin(replica) as follower:
        poll(
            "the replica's link",
            lambda: follower.info("replication").get("master_link_status") == "up",
        )
    with admin(primary) as source:

        def acknowledged() -> bool:
            source.set("probe", replica.port)
            return int(source.execute_command("WAIT", 1, 100)) >= 1

        poll("the replica to acknowledge the primary's writes", acknowledged)


@contextmanager
def stopped(server: RedisServer) -> Iterator[None]:
    """The server's process stopped (SIGSTOP) for the block: a replica that lags. What the
    primary sends meanwhile waits in the socket, and the replica applies it once it goes
    on (:func:`cut_off` drops the link too)."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


@contextmanager
def cut_off(replica: RedisServer, primary: RedisServer) -> Iterator[None]:
    """The replica stopped and its link dropped, as a partition or a stalled machine does:
    what the primary writes in the block never reaches it."""
    with stopped(replica), admin(primary) as client:
        client.client_kill_filter(_type="replica")
        poll(
            "the primary to drop its replica",
            lambda: not client.info("replication")["connected_slaves"],
        )
        yield


def promote(replica: RedisServer) -> None:
    """What a Sentinel does to the replica it promotes."""
    with admin(replica) as client:
        client.execute_command("REPLICAOF", "NO", "ONE")


class Pair:
    """A primary and its replica, then whatever servers a test adds."""

    def __init__(self, start: Callable[..., RedisServer]) -> None:
        self.start = start
        self.primary = start(**FAST_SYNC)
        self.replica = start(**FAST_SYNC)
        follow(self.replica, self.primary)


@pytest.fixture
def pair(private_redis: Callable[..., RedisServer]) -> Pair:
    """A primary and a replica that has caught up."""
    return Pair(private_redis)


@pytest.fixture
def history(tmp_path: Path) -> Iterator[Path]:
    """Every script call of the test, recorded into a folder."""
    folder = tmp_path / "history"
    folder.mkdir()
    uninstall = install(folder, "test")
    yield folder
    uninstall()


def store_on(server: RedisServer, prefix: str, **wait: Any) -> LeaseStore:
    """A store on one server; ``wait`` as the store's URL would carry it."""
    query = "&".join(f"{name}={value}" for name, value in wait.items())
    return LeaseStore.from_url(server.url + (f"?{query}" if query else ""), prefix=prefix)


def lagging_claims(pair: Pair, prefix: str, **wait: Any) -> tuple[list[Lease], LeaseStore]:
    """Two items planned and replicated; then, the replica stopped, holder A claims one by
    name and the other as the next due item on the primary, which has lost its link to the
    replica (:func:`cut_off`); the primary is SIGKILLed and
    the replica promoted. Returns the leases A was handed and a store on the new primary."""
    old = store_on(pair.primary, prefix, **wait)
    old.add(RUN, [Item("a"), Item("b")], shards=1)
    caught_up(pair.replica, pair.primary)
    held: list[Lease] = []
    with cut_off(pair.replica, pair.primary):
        for claim in (
            lambda: [old.claim(RUN, "a", worker="A", ttl=60)],
            lambda: old.claim_next(RUN, worker="A", limit=5, ttl=60),
        ):
            with suppress(NotReplicated):
                held += claim()
        pair.primary.kill()
    promote(pair.replica)
    old.close()
    return held, store_on(pair.replica, prefix, **wait)


def judged(folder: Path) -> None:
    """The recorded grants pass the checker's rules (raises Violation otherwise)."""
    check_grants(read_ops(read_lines(folder)))


def test_without_waiting_a_failover_grants_one_token_number_to_two_holders(
    pair: Pair, prefix: str, history: Path
) -> None:
    """Today's behaviour, the hazard the option removes: holder A's claims are acknowledged
    by the primary alone; the promoted replica never had them and grants the same tokens
    to holder B. Inside Redis, A's writes are still refused (its lease id is not the
    record's); a store that fences on the token number cannot tell A from B. Breaks if
    the token numbers differ (then the hazard is gone: update docs/durability.md) or if A
    could commit."""
    first, new = lagging_claims(pair, prefix)
    assert sorted((lease.item_id, lease.token) for lease in first) == [("a", 1), ("b", 1)]
    second = [new.claim(RUN, "a", worker="B", ttl=60), *new.claim_next(RUN, "B", limit=5)]
    assert sorted((lease.item_id, lease.token) for lease in second) == [("a", 1), ("b", 1)]
    for lease in first:  # what holds: the fence inside Redis tells them apart by lease id
        with pytest.raises(LeaseLost):
            new.commit(lease, result={"by": "A"})
    for lease in second:
        new.commit(lease, result={"by": "B"})
    # what does not: a store fencing on the token number accepts A, then refuses B
    seen: dict[str, int] = {}
    accepted = []
    for lease in [*first, *second]:
        if lease.token > seen.get(lease.item_id, 0):
            seen[lease.item_id] = lease.token
            accepted.append(lease.worker)
    assert accepted == ["A", "A"]
    with pytest.raises(Violation) as found:
        judged(history)
    assert found.value.kinds == {"duplicate-grant"}
    assert len(found.value.violations) == 2
    new.close()


def test_waiting_for_a_replica_hands_no_token_out_twice_across_the_failover(
    pair: Pair, prefix: str, history: Path, private_redis: Callable[..., RedisServer]
) -> None:
    """The same failover with ``?wait_replicas=1``: A's claims wait for the stopped
    replica, time out, are given back and raise NotReplicated, so A holds nothing. The new
    primary has no replica: its claims are refused too, until a new replica follows it;
    then B is granted each item, and the checker's grant rules pass on the whole history.
    Breaks if A is handed a lease the replica lacked, if a refused claim leaves its item
    leased, or if any token is granted twice."""
    first, new = lagging_claims(pair, prefix, wait_replicas=1, wait_timeout_ms=WAIT_MS)
    assert first == []  # nothing the replica lacked was handed out
    with pytest.raises(NotReplicated, match="0 of 1 replicas acknowledged") as refused:
        new.claim(RUN, "a", worker="B", ttl=60)  # the new primary has no replica yet
    assert (refused.value.wanted, refused.value.acked, refused.value.exit_code) == (1, 0, 6)
    given_back = new.item(RUN, "a")  # the refused claim gave its lease back
    assert (given_back.state, given_back.token, given_back.attempts) == ("pending", 1, 0)
    rejoined = private_redis(**FAST_SYNC)  # a replica follows the new primary
    follow(rejoined, pair.replica)
    second = [new.claim(RUN, "a", worker="B", ttl=60), *new.claim_next(RUN, "B", limit=5)]
    assert sorted((lease.item_id, lease.token) for lease in second) == [("a", 2), ("b", 1)]
    for lease in second:
        new.commit(lease, result={"by": "B"})
    judged(history)  # no duplicate-grant, no token-order
    new.close()


def test_a_claim_is_handed_out_once_the_replica_has_it(
    pair: Pair, prefix: str, history: Path
) -> None:
    """With a replica that keeps up, claims, intents and commits go through, the replica
    holds each lease as soon as the claim returns, and only claims and intents wait
    (``cmdstat_wait`` counts the WAITs the primary ran, once the scripts are loaded: a call
    sent again after NOSCRIPT waits again). Breaks if a claim returns before the replica
    has it, or if a commit, renewal or outcome record waits too."""
    store = store_on(pair.primary, prefix, wait_replicas=1, wait_timeout_ms=5000)
    assert store.replica_wait is not None and store.replica_wait.replicas == 1
    store.add(RUN, [Item(f"i{n}") for n in range(7)], shards=1)
    follower = LeaseStore.from_url(pair.replica.url, prefix=prefix)

    def work(lease: Lease) -> None:
        store.begin_effect(lease, f"key-{lease.item_id}", "payout")
        store.record_effect(lease, f"key-{lease.item_id}", "payout", "applied", {"ref": 1})
        store.renew(lease)
        store.commit(lease, result={"ok": True})

    work(store.claim_next(RUN, "A")[0])  # loads the scripts
    with admin(pair.primary) as client:
        client.config_resetstat()
        leases = store.claim_next(RUN, "A", limit=6)
        assert len(leases) == 6
        for lease in leases:  # on the replica already: WAIT returned only once it had them
            assert follower.item(RUN, lease.item_id).lease_id == lease.lease_id
        work(leases[0])
        waits = client.info("commandstats")["cmdstat_wait"]["calls"]
    assert waits == 2  # the claim's and the intent's
    judged(history)
    follower.close()
    store.close()


def test_an_intent_the_replica_lacks_is_refused_and_its_effect_not_sent(
    pair: Pair, prefix: str
) -> None:
    """An effect's intent waits like a claim: with the replica stopped, ``begin_effect``
    raises NotReplicated (the effects layer then sends nothing) and marks its intent
    failed, not sent; once the replica is back, the next attempt records its intent anew.
    Breaks if the intent returns without the replica."""
    store = store_on(pair.primary, prefix, wait_replicas=1, wait_timeout_ms=WAIT_MS)
    store.add(RUN, [Item("a")], shards=1)
    lease = store.claim(RUN, "a", worker="A")
    with stopped(pair.replica), pytest.raises(NotReplicated) as refused:
        store.begin_effect(lease, "key-1", "payout")
    assert (refused.value.item_id, refused.value.token) == ("a", lease.token)
    previous, record, _ = store.begin_effect(lease, "key-1", "payout")
    assert (previous, record["state"]) == ("failed", "intended")
    store.close()


def test_without_the_option_nothing_waits(pair: Pair, prefix: str) -> None:
    """The default store sends no WAIT (no extra round trip): a claim on a primary whose
    replica is stopped returns at once. Breaks if the default path waits."""
    store = store_on(pair.primary, prefix)
    assert store.replica_wait is None
    store.add(RUN, [Item("a")], shards=1)
    with admin(pair.primary) as client, stopped(pair.replica):
        client.config_resetstat()
        lease = store.claim(RUN, "a", worker="A")
        store.begin_effect(lease, "key-1", "payout")
        assert "cmdstat_wait" not in client.info("commandstats")
    store.close()


def replica_of(cluster: ClusterServers, primary_port: int) -> int:
    """The port of the node that replicates the primary at ``primary_port``."""
    for port in cluster.ports:
        with _admin(port) as client:
            role = client.execute_command("ROLE")
        if role[0] == "slave" and int(role[2]) == primary_port:
            return port
    raise LookupError(f"no replica of {primary_port}")


def acknowledging(cluster: ClusterServers, primary_port: int) -> bool:
    """Whether the primary's replica acknowledges a write to it now (a probe key of one of
    its slots, then WAIT on the same connection)."""
    slots = [
        (low, high) for low, high, port in cluster._slot_map(primary_port) if port == primary_port
    ]
    key = next(
        f"probe:{n}"
        for n in range(100_000)
        if any(lo <= key_slot(f"probe:{n}".encode()) <= hi for lo, hi in slots)
    )
    with _admin(primary_port) as client:
        client.set(key, 1)
        return int(client.execute_command("WAIT", 1, 100)) >= 1


def test_on_a_cluster_the_wait_counts_the_replicas_of_the_node_that_ran_the_claim(
    tmp_path: Path, prefix: str
) -> None:
    """A cluster of 3 primaries with a replica each; one primary's replica is stopped and
    cut off. A claim on a shard that primary serves is refused; a claim on a shard of
    another primary is granted. WAIT goes to the node that ran the claim, on the same
    connection: sent to the cluster as a whole (redis-py sums it over every node) or on
    another connection (which wrote nothing), it would count the others' replicas and
    hand the claim out. Breaks if it does, or if the stopped replica's shard stays refused
    once it is back."""
    cluster = ClusterServers(tmp_path / "cluster", size=3, replicas=1)
    cluster.start()
    try:
        for port in cluster.primaries():
            poll(
                f"the replica of {port} to acknowledge",
                lambda port=port: acknowledging(cluster, port),
            )
        url = f"{cluster.url}?wait_replicas=1&wait_timeout_ms={WAIT_MS}"
        store = LeaseStore.from_url(url, prefix=prefix)
        shards = 12
        store.add(RUN, [Item(f"i{n}") for n in range(60)], shards=shards)
        owner = {
            shard: cluster.slot_owner(key_slot(store.keys.shard(RUN, shard)[0].encode()))
            for shard in range(shards)
        }
        lagging = owner[0]
        other = next(shard for shard in range(shards) if owner[shard] != lagging)
        replica = next(
            server for server in cluster.nodes if server.port == replica_of(cluster, lagging)
        )
        with stopped(replica), _admin(lagging) as primary:
            primary.client_kill_filter(_type="replica")
            with pytest.raises(NotReplicated, match="0 of 1 replicas acknowledged the claim_next"):
                store.claim_next(RUN, "w", shard=0, limit=2)
            assert len(store.claim_next(RUN, "w", shard=other, limit=2)) == 2
        poll("the replica to acknowledge again", lambda: acknowledging(cluster, lagging))
        assert len(store.claim_next(RUN, "w", shard=0, limit=2)) == 2
        store.close()
    finally:
        cluster.kill()


class WaitingSentinelCluster(SentinelCluster):
    """The Sentinel harness (tests/test_sentinel.py) whose workers wait for a replica."""

    def url_options(self) -> list[str]:
        """The group's ``redis+sentinel://`` URL with ``wait_replicas=1``."""
        return ["--url", f"{self.group.url}?wait_replicas=1&wait_timeout_ms={WAIT_MS}"]


def refused_waits(ops: list[Op]) -> Counter[str]:
    """The calls the workers' stores held back (too few replicas), by script."""
    return Counter(
        str(op.get("f"))
        for op in ops
        if op.type == "info" and "NotReplicated" in str(op.get("error", ""))
    )


@pytest.mark.xfail(
    strict=False,
    reason="seldom (1 of the last 3 CI runs): after the promotion the run's record is gone "
    "from the new primary (NotFound), as in test_sentinel's marked failover case; not "
    "understood yet",
)
def test_with_wait_replicas_a_primary_crash_grants_no_token_twice(
    tmp_path: Path, prefix: str
) -> None:
    """tests/test_sentinel.py's primary crash, with workers that wait for one replica.

    The replica is cut off a quarter into the run (``REPLICAOF NO ONE``); the workers go
    on against the old primary: every claim and intent falls short, is given back, and the
    workers keep trying. The primary is SIGKILLed, the sentinel promotes the replica, which
    refuses claims until the old server comes back as its replica; then the run ends.
    Without a loss window the checker finds no duplicate grant and no token going back:
    what the old primary accepted after the cut can only be commits of leases granted
    before it (redone under higher tokens, their payouts reconciled and applied once).
    Breaks if a token is granted twice, if a payout is applied twice, or if the run does
    not end ``succeeded``."""
    provider = ProviderState(latency=0.1)
    settings: dict[str, Any] = {"items": 96, "shards": 2, "ttl": 1.5, "hold_after": 96 // 4 + 4}
    with WaitingSentinelCluster(
        tmp_path / "c", prefix, workers=2, provider=provider, **settings
    ) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=c.work_held(run_id, 96 // 4))
        old, replica = c.group.primary_port(), c.group.replica.port
        cut = cut_replica(old, replica)
        c.note("cut", f"replica {replica} stops replicating at server ms {cut}")
        c.lift_hold()
        c.drive(run_id, until=lambda: refused_waits(c.ops())["claim_next"] >= 2)
        c.group.kill_primary()
        c.note("kill-primary", str(old))
        new = c.group.wait_for_new_primary(old)
        with _admin(new) as promoted_server:
            promoted = server_ms(promoted_server)
        c.note("promoted", f"{new} at server ms {promoted}")
        assert new == replica
        c.group.primary.start()  # the sentinel makes it the new primary's replica
        assert c.drive(run_id, timeout=90) == "succeeded"
        judge_on(c, new)
        ops = c.ops()
        found: list[Breach] = []
        try:
            summary = c.verify(run_id)
        except Violation as seen:  # only commits the old primary took after the cut
            found = seen.violations
            summary = c.verify(run_id, loss=(cut, promoted))
        kinds = {breach.kind for breach in found}
        assert kinds <= {"double-commit"}, kinds
        assert summary.done == c.config.items
        assert set(c.provider.state.applications.values()) == {1}
        refused = refused_waits(ops)
        assert refused["claim_next"] >= 2
        print(
            f"held back: {dict(refused)}; without a loss window: {sorted(kinds) or 'nothing'}"
            f" ({len(found)} breaches); {summary.grants} grants"
        )
