"""Faults on a Redis Cluster: a short chaos run and live resharding, checked by the checker.

The lease state lives on a private 3-primary cluster (tests.redis_cluster), RQ's
queues on a private plain server (``--queue-url``). The chaos mixes worker faults,
``SCRIPT FLUSH`` on every primary and moving the hash slot of a shard to another
primary while the run works; the resharding test moves two shards' slots in small
steps under a working run; the last tests drive one call into a half-moved slot.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import TryAgainError

from redis_lease import LeaseStore
from redis_lease.demo.provider import ProviderState
from redis_lease.errors import ClusterBusy
from redis_lease.protocol.leases import Item
from tests.faults.chaos import Chaos, chaos_cluster, cluster_refused
from tests.faults.cluster import Cluster, faketime_library
from tests.redis_cluster import HOST, ClusterServers

pytestmark = pytest.mark.slow

CHAOS_SEEDS = range(1, 15)
CHAOS_ITEMS = 64


def test_a_short_chaos_run_on_a_cluster_finds_no_violation(tmp_path: Path, prefix: str) -> None:
    skew = faketime_library() is not None  # two workers hours off when libfaketime is there
    with chaos_cluster(
        tmp_path, prefix, CHAOS_ITEMS, workers=4, skew=skew, redis_cluster=True
    ) as cluster:
        chaos = Chaos(cluster)
        outcomes = [chaos.iteration(seed) for seed in CHAOS_SEEDS]
        moves = list(cluster.slot_move_seconds)
    failures = [
        f"seed {o.seed} (python -m tests.faults.chaos --redis-cluster -n 1 --seed {o.seed}): "
        f"{o.violation}"
        for o in outcomes
        if o.violation
    ]
    assert not failures, "\n\n".join(failures)
    assert all(o.state == "succeeded" for o in outcomes), [(o.seed, o.state) for o in outcomes]
    injected = Counter(kind for o in outcomes for kind in o.faults)
    assert len(injected) >= 4, injected
    assert injected["move-slot"] >= 3, injected
    assert len(moves) == injected["move-slot"]  # every move finished
    assert all(o.operations >= CHAOS_ITEMS for o in outcomes)
    assert sum(o.takeovers for o in outcomes) > 0
    assert sum(o.refused for o in outcomes) > 0
    refused = sum(o.cluster_refused for o in outcomes)
    print(
        f"cluster refusals: {refused} of {sum(o.operations for o in outcomes)} calls; "
        f"slot moves took {', '.join(f'{s:.2f}s' for s in moves)}"
    )


# -- live resharding under a working run ------------------------------------------------


def shard_slot_keys(ports: list[int], slot: int) -> dict[int, int]:
    """Keys of ``slot`` on each node (``CLUSTER COUNTKEYSINSLOT``)."""
    counts = {}
    for port in ports:
        with redis.Redis(host=HOST, port=port) as node:
            counts[port] = int(node.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot))
    return counts


class Resharding:
    """Moves the slots of ``shards`` shards of a working run, one after the other, in
    steps: begin, MIGRATE one key, another, then the rest and the new owner. Each step
    waits until items were committed since the last one and a moment went by, so the
    run works between them. Driven from :meth:`Cluster.drive`'s step."""

    STEPS = ("begin", "keys", "keys", "finish")
    #: Handler passes let through the hold after each step: the run cannot finish before
    #: the moves do, however slow the machine (the test holds all but 8 passes at first).
    PASSES_PER_STEP = 6

    def __init__(self, cluster: Cluster, run_id: str, shards: int) -> None:
        self.cluster, self.run_id, self.shards = cluster, run_id, shards
        self.moved: dict[int, tuple[int, int]] = {}  # shard: (slot, new owner)
        self.shard = -1
        self.step_index = 0
        self.last_done, self.last_at = -1, 0.0

    @property
    def finished(self) -> bool:
        """Whether every move is done."""
        return len(self.moved) == self.shards and self.shard not in self.moving

    @property
    def moving(self) -> set[int]:
        """Shards whose slot is moving now."""
        return {s for s in self.moved if self.moved[s][0] in self.cluster.slot_moves}

    def __call__(self) -> None:
        if self.finished:
            return
        done = self.cluster.store.status(self.run_id).counts["done"]
        if done <= self.last_done or time.monotonic() - self.last_at < 0.3:
            return  # let the run work first
        step = self.STEPS[self.step_index]
        if step == "begin":
            # a shard being worked now (then the one with most items left): the move meets it
            left = [
                (c.get("leased", 0) > 0, c.get("pending", 0), n)
                for n, c in enumerate(self.cluster.store.shard_counts(self.run_id))
                if n not in self.moved
            ]
            self.shard = max(left)[2]
            slot = self.cluster.shard_slot(self.run_id, self.shard)
            self.moved[self.shard] = (slot, self.cluster.begin_slot_move(slot).target)
        elif step == "keys":
            self.cluster.move_slot_keys(self.moved[self.shard][0], 1)
        else:
            self.cluster.finish_slot_move(self.moved[self.shard][0])
        self.step_index = (self.step_index + 1) % len(self.STEPS)
        self.last_done, self.last_at = done, time.monotonic()
        if self.finished:
            self.cluster.lift_hold()
        else:
            self.cluster.hold_more(self.PASSES_PER_STEP)  # work between the steps, not the end


def test_a_slot_migrated_while_a_run_works_loses_nothing(tmp_path: Path, prefix: str) -> None:
    items = 64
    with Cluster(
        tmp_path,
        prefix,
        workers=2,
        redis_cluster=True,
        provider=ProviderState(latency=0.08),  # about 2.5 s of handler time per worker
        items=items,
        shards=4,
        ttl=1.0,
        batch_size=2,
        max_attempts=50,
        hold_after=8,  # 8 + 8 steps x 6 passes: items left when the last move ends
    ) as cluster:
        cluster.wait_ready()
        run_id = cluster.start_run()
        resharding = Resharding(cluster, run_id, shards=2)
        began = time.monotonic()
        try:
            state = cluster.drive(run_id, timeout=90, step=resharding)
        finally:
            cluster.finish_slot_moves()  # a failure leaves no slot half moved
        seconds = time.monotonic() - began
        assert state == "succeeded", cluster.describe()
        assert resharding.finished, (resharding.moved, cluster.faults)
        summary = cluster.verify(run_id)
        assert cluster.store.status(run_id).counts["done"] == items
        assert summary.done == items
        applied = cluster.provider.state.applications
        assert len(applied) == items and set(applied.values()) == {1}, applied
        nodes = cluster.redis_cluster
        assert nodes is not None
        for shard, (slot, owner) in resharding.moved.items():
            assert nodes.slot_owner(slot) == owner
            counts = shard_slot_keys(nodes.ports, slot)
            assert counts[owner] > 0 and sum(counts.values()) == counts[owner], (shard, counts)
            with redis.Redis(host=HOST, port=owner) as node:  # no redirection: it is here
                assert node.exists(cluster.store.keys.shard(run_id, shard)[2]) == 1
        # What the moved shards' calls met while their slot moved: a shard's scripts name
        # keys that do not exist yet (its dead items, ...), so from the first step on its
        # calls are refused (TRYAGAIN) until the move ends.
        ops = cluster.ops()
        during = [
            op
            for move in cluster.finished_moves
            for op in ops
            if cluster.shard_slot(run_id, int(op.get("shard", -1))) == move.slot
            and move.began_ms <= op.invoked_wall_ms <= move.ended_ms
        ]
        refused = [op for op in ops if cluster_refused(op)]
        logs = "".join(w.log.read_text(errors="replace") for w in cluster.workers)
        print(
            f"run {seconds:.1f}s; slot moves {[round(s, 2) for s in cluster.slot_move_seconds]}s; "
            f"{len(during)} calls of the moving shards during their moves; cluster refusals "
            f"{len(refused)} of {len(ops)} calls ({dict(Counter(op.get('f') for op in refused))}); "
            f"'TTL exhausted' in worker logs: {logs.count('TTL exhausted')}, "
            f"'ClusterError': {logs.count('ClusterError')}"
        )
        assert during and refused, "no call met a slot while it moved"


# -- one call into a half-moved slot ----------------------------------------------------


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterServers]:
    """A private 3-primary cluster for this module's slot moves (the session's stays put)."""
    nodes = ClusterServers(tmp_path_factory.mktemp("moving-cluster"))
    nodes.start()
    yield nodes
    nodes.kill()


def content(client: Any, key: str) -> tuple[str, Any]:
    """A key's type and whole content, read through the cluster client."""
    kind = client.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else str(kind)
    readers: dict[str, Callable[[], Any]] = {
        "none": lambda: None,
        "string": lambda: client.get(key),
        "hash": lambda: client.hgetall(key),
        "zset": lambda: client.zrange(key, 0, -1, withscores=True),
        "set": lambda: sorted(client.smembers(key)),
        "list": lambda: client.lrange(key, 0, -1),
        "stream": lambda: client.xrange(key),
    }
    return kind, readers[kind]()


class HalfMoved:
    """A run of one shard whose slot is mid-migration with two of its keys moved."""

    def __init__(self, nodes: ClusterServers, prefix: str) -> None:
        self.nodes = nodes
        self.store = LeaseStore.from_url(nodes.url, prefix=prefix, socket_timeout=2.0)
        # Few tries of a refused call (16 by default, the last ones 50 ms apart).
        self.store.client.RedisClusterRequestTTL = 2  # type: ignore[attr-defined]
        self.run_id = "r1"
        self.store.create_run(self.run_id, shards=1)
        self.store.add(self.run_id, [Item(f"item-{n}", {"n": n}) for n in range(6)])
        held = self.store.claim_next(self.run_id, "before", shard=0, limit=2, ttl=30)
        self.store.commit(held[0], {"ok": True})
        keys = self.store.keys
        self.keys = keys.logged(self.run_id, 0) + keys.effects(self.run_id, 0)
        self.slot = key_slot(self.keys[0].encode())
        self.source = nodes.slot_owner(self.slot)
        self.target = next(p for p in nodes.ports if p != self.source)
        self.before = self.snapshot()
        nodes.begin_migration(self.slot, self.target)
        # Two of the shard's keys go now; the others wait on the source.
        self.moved = [keys.shard(self.run_id, 0)[2], keys.shard(self.run_id, 0)[3]]
        with redis.Redis(host=HOST, port=self.source) as source:
            source.execute_command("MIGRATE", HOST, self.target, "", 0, 5000, "KEYS", *self.moved)

    def snapshot(self) -> dict[str, tuple[str, Any]]:
        """Every shard key's content."""
        return {key: content(self.store.client, key) for key in self.keys}

    def finish(self) -> None:
        """Moves the rest and gives the slot to the target on every node."""
        self.nodes.move_keys(self.slot, batch=2)
        self.nodes.finish_migration(self.slot, self.target)

    def close(self) -> None:
        """Finishes the move if a failure left it half done; closes the store."""
        if self.nodes.slot_owner(self.slot) != self.target:
            self.finish()
        self.store.close()


@pytest.fixture
def half_moved(own_cluster: ClusterServers, prefix: str) -> Iterator[HalfMoved]:
    """A one-shard run whose slot is half moved."""
    state = HalfMoved(own_cluster, prefix)
    yield state
    state.close()


def test_a_call_into_a_half_moved_slot_is_refused_with_nothing_written(
    half_moved: HalfMoved,
) -> None:
    state = half_moved
    assert sum(content(state.store.client, k)[0] != "none" for k in state.keys) > len(state.moved)
    # The server's own answer to a call whose keys are split between the two nodes.
    with (
        redis.Redis(host=HOST, port=state.source) as source,
        pytest.raises(TryAgainError, match="Multiple keys request during rehashing"),
    ):
        source.execute_command("EXISTS", *state.keys)
    started = time.monotonic()
    with pytest.raises(ClusterBusy, match="is moving or missing hash slots") as refused:
        state.store.claim_next(state.run_id, "refused", shard=0, limit=2, ttl=30)
    print(f"refused after {time.monotonic() - started:.2f}s as {type(refused.value).__name__}")
    assert state.snapshot() == state.before  # nothing written
    state.finish()
    assert state.nodes.slot_owner(state.slot) == state.target
    assert state.snapshot() == state.before  # the move kept every key whole
    granted = state.store.claim_next(state.run_id, "after", shard=0, limit=2, ttl=30)
    assert len(granted) == 2 and {g.token for g in granted} == {1}
    assert all(state.store.item(state.run_id, g.item_id).state == "leased" for g in granted)
