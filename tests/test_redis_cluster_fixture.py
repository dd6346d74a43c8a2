"""The private Redis Cluster and Sentinel processes of tests/redis_cluster.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import AskError, MovedError

from tests.redis_cluster import SLOTS, ClusterServers, SentinelGroup

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterServers]:
    """A started three-primary cluster, stopped after the test."""
    servers = ClusterServers(tmp_path / "cluster")
    servers.start()
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    """A started primary, replica and sentinel, stopped after the test."""
    group = SentinelGroup(tmp_path / "sentinel")
    group.start()
    try:
        yield group
    finally:
        group.stop()


def node(port: int) -> redis.Redis:
    """A plain (non-cluster) client of one node."""
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True, protocol=2)


def slot_ranges(port: int) -> list[tuple[int, int, int]]:
    """(start, end, owner port) of every range in one node's CLUSTER SLOTS."""
    with node(port) as client:
        reply = client.execute_command("CLUSTER", "SLOTS")
    return sorted((int(r[0]), int(r[1]), int(r[2][1])) for r in reply)


def tag_on(cluster: ClusterServers, port: int) -> str:
    """A hash tag whose slot ``port`` serves."""
    for index in range(10_000):
        tag = f"tag{index}"
        slot = key_slot(f"{{{tag}}}".encode())
        if cluster.slot_owner(slot) == port:
            return tag
    raise LookupError(f"no hash tag found on {port}")


def test_cluster_primaries_own_all_slots_and_serve_keys(cluster: ClusterServers) -> None:
    primaries = cluster.primaries()
    assert sorted(primaries) == sorted(cluster.ports)
    assert len(primaries) == 3
    assert cluster.url == "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in cluster.ports)
    assert cluster.node_urls == [f"redis://127.0.0.1:{p}/0" for p in cluster.ports]

    # Every node's view: the ranges tile 0..16383 and each primary owns some.
    for port in cluster.ports:
        ranges = slot_ranges(port)
        assert sum(end - start + 1 for start, end, _ in ranges) == SLOTS
        assert [r[0] for r in ranges] == [0] + [r[1] + 1 for r in ranges[:-1]]
        assert {owner for _, _, owner in ranges} == set(primaries)
        assert cluster.slot_owner(ranges[-1][1]) == ranges[-1][2]

    keys = {port: f"{{{tag_on(cluster, port)}}}:key" for port in primaries}
    client = cluster.client(decode_responses=True)
    try:
        for port, key in keys.items():
            assert client.set(key, f"value-{port}")
        for port, key in keys.items():
            assert client.get(key) == f"value-{port}"
    finally:
        client.close()
    # Each key is stored on the node that owns its slot, and only there.
    for port, key in keys.items():
        with node(port) as owner:
            assert owner.get(key) == f"value-{port}"
            assert owner.dbsize() == 1


def test_migrate_slot_moves_keys_to_another_primary(cluster: ClusterServers) -> None:
    source = cluster.primaries()[0]
    target = cluster.primaries()[1]
    tag = tag_on(cluster, source)
    slot = key_slot(f"{{{tag}}}".encode())
    keys = [f"{{{tag}}}:{i}" for i in range(250)]
    client = cluster.client(decode_responses=True)
    try:
        for key in keys:
            client.set(key, key.upper())
    finally:
        client.close()

    assert cluster.migrate_slot(slot, target) == len(keys)

    assert cluster.slot_owner(slot) == target
    for port in cluster.ports:
        owners = [o for s, e, o in slot_ranges(port) if s <= slot <= e]
        assert owners == [target]
    fresh = cluster.client(decode_responses=True)
    try:
        assert [fresh.get(key) for key in keys] == [key.upper() for key in keys]
    finally:
        fresh.close()
    with node(source) as old_owner:
        with pytest.raises(MovedError) as moved:
            old_owner.get(keys[0])
        assert moved.value.slot_id == slot
        assert moved.value.port == target
        assert old_owner.dbsize() == 0


def test_slot_mid_migration_is_served_by_source_then_asks(cluster: ClusterServers) -> None:
    source, target = cluster.primaries()[:2]
    tag = tag_on(cluster, source)
    slot = key_slot(f"{{{tag}}}".encode())
    key = f"{{{tag}}}:pending"
    with node(source) as origin, node(target) as destination:
        origin.set(key, "here")

        cluster.begin_migration(slot, target)
        # Not moved yet: the source still serves it; the target, without ASKING, redirects.
        assert origin.get(key) == "here"
        with pytest.raises(MovedError) as moved:
            destination.get(key)
        assert moved.value.port == source

        assert cluster.move_keys(slot) == 1
        # Moved but the slot not reassigned: the source sends the client to the target.
        with pytest.raises(AskError) as ask:
            origin.get(key)
        assert not isinstance(ask.value, MovedError)
        assert (ask.value.slot_id, ask.value.port) == (slot, target)
        assert cluster.slot_owner(slot) == source
        # A client that follows the ASK (ASKING, then the command) finds the key.
        pipe = destination.pipeline(transaction=False)
        pipe.execute_command("ASKING")
        pipe.get(key)
        assert pipe.execute() == [True, "here"]

        cluster.finish_migration(slot, target)
        assert destination.get(key) == "here"
        with pytest.raises(MovedError) as after:
            origin.get(key)
        assert after.value.port == target


def test_sentinel_failover_promotes_the_replica(sentinel_group: SentinelGroup) -> None:
    group = sentinel_group
    assert group.url == f"redis+sentinel://127.0.0.1:{group.sentinel.port}/mymaster/0"
    assert group.primary_port() == group.primary.port
    with node(group.primary.port) as primary:
        primary.set("before-failover", "kept")
        # The replica has the write before the failover starts.
        assert primary.wait(1, 5000) == 1

    new_port = group.failover()

    assert new_port == group.replica.port
    assert group.primary_port() == group.replica.port
    with node(new_port) as promoted:
        assert promoted.execute_command("ROLE")[0] == "master"
        assert promoted.get("before-failover") == "kept"


def test_sentinel_promotes_the_replica_when_the_primary_dies(
    sentinel_group: SentinelGroup,
) -> None:
    group = sentinel_group
    old_port = group.kill_primary()
    assert old_port == group.primary.port
    assert group.primary.process is not None and group.primary.process.poll() is not None

    new_port = group.wait_for_new_primary(old_port, timeout=15)

    assert new_port == group.replica.port
    with node(new_port) as promoted:
        assert promoted.execute_command("ROLE")[0] == "master"
