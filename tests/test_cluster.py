"""Redis Cluster: every script in one hash slot, a fleet run spread over every primary, the
CLI, the tick and the dashboard on a cluster URL (RQ on a plain Redis: --queue-url).

The cluster is the session's private 3-primary one (``redis_cluster`` in conftest.py).
The core suite runs on it too (the ``store`` fixture's ``cluster`` backend); the chaos
run and live resharding are in tests/test_cluster_faults.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from redis_lease import InvalidInput, Item, LeaseStore, PermissionDenied, ProviderGate
from redis_lease.fleet.loss import data_set_mark, lost_records
from redis_lease.fleet.loss.lost_records import LostRun
from redis_lease.fleet.runs import job_tallies, run_ages
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.transport import takeover
from redis_lease.fleet.transport.shard_job_failures import (
    end_failure_streak,
    record_job_failure,
    start_backoff,
)
from redis_lease.fleet.transport.shard_jobs import purge_queue, queue
from redis_lease.fleet.transport.takeover import ShardJob
from redis_lease.fleet.worker.watch import beat_worker
from redis_lease.operate.dashboard.app import create_app
from redis_lease.protocol.connection.clients import client_from_url
from redis_lease.protocol.connection.server_checks import eviction_danger
from redis_lease.protocol.leases import CommitRequest
from redis_lease.protocol.scripts import KEY_COUNTS, observe
from redis_lease.protocol.store.declared_jobs import declare_jobs, declared_jobs, withdraw_jobs
from redis_lease.protocol.store.leader import (
    TAKEN,
    Leadership,
    hold_leadership,
    job_tick_lock,
    release_leadership,
)
from redis_lease.protocol.store.store_client import lock
from tests import fleet_jobs
from tests.fleet_helpers import FLEET_PATH, REPO, Processes, all_records, drive, fleet_env
from tests.redis_cluster import ClusterServers
from tests.test_acl import documented_acl_lines
from tests.test_fleet import assert_all_done_once, configure, effects, start_run  # noqa: F401

REPO_PYTHON = [sys.executable, "-m", "redis_lease"]


class SlotRecorder:
    """Sees every script call of this process: its name and the slots of its keys."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, set[int]]] = []

    def sent(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> None:
        """Records the call's slots."""
        self.calls.append((name, {key_slot(key.encode()) for key in keys}))

    def answered(self, ticket: Any, reply: Any) -> None:
        """Nothing to record."""

    def unanswered(self, ticket: Any, error: BaseException) -> None:
        """Nothing to record."""


@pytest.fixture
def recorder() -> Iterator[SlotRecorder]:
    """Every script call of the test, with its keys' slots."""
    seen = SlotRecorder()
    remove = observe(seen)
    yield seen
    remove()


def test_every_script_touches_one_hash_slot(
    cluster_store: LeaseStore, recorder: SlotRecorder
) -> None:
    store = cluster_store
    store.add("r", [Item(f"i{n}") for n in range(12)], shards=3)
    first = store.claim("r", "i0", "w1", ttl=30)
    store.renew(first)
    store.commit(first, {"ok": 1})
    batch = store.claim_next("r", "w1", limit=6, ttl=30)
    store.record_effect(batch[0], "pay-1", "payment", "intended")
    store.commit_many([CommitRequest(batch[0], {"ok": 2})])
    store.fail(batch[1], "permanent: no such account", permanent=True)
    store.release(batch[2])
    store.requeue("r", [batch[1].item_id])
    store.claim_next("r", "w2", limit=3, ttl=0.001)
    store.reap("r")
    store.cut_leases("r", 0, "w1")
    beat_worker(store, "worker-1", "")
    # The shard job registry: register, beat, sweep, take (a live job: not taken), unregister.
    job = ShardJob("rl-slot", "r", 0, "worker-1", "host:1:slot", "host", 1, "jobs:job", "q", 60.0)
    takeover.register(store, job, "{}")
    store.scripts.call("shard_job_beat", store.keys.shard_job_registry[1::2], [job.rq_id, 2000])
    assert takeover.sweep(store) == []
    assert takeover.take_over(store, job) is None
    assert takeover.unregister(store, job.rq_id)
    store.status("r")
    store.scripts.call("shard_status", store.keys.status("r", 1), [])  # the protocol's own read
    store.set_closed("r", True)
    store.set_closed("r", False)
    Runs(store).transition("r", ("running",), "partial", "test")
    with lock(store, store.keys.run_planner("r"), 5000) as taken:
        assert taken
    with ProviderGate(store, "provider", max_concurrency=2).slot(wait=1):
        pass
    # The fleet's records: a run's failed shard jobs and ages, a job's tallies, the data set.
    assert record_job_failure(store, "r", 0, "RuntimeError: boom")
    start_backoff(store, "r", 1, 1000)
    end_failure_streak(store, "r")
    Runs(store).transition("r", ("partial",), "running", "test")
    assert run_ages.record(store, store.status("r"), 1000)
    for job in ("nightly", ""):
        assert job_tallies.count_finished(store, job, "r", "partial", 1000, 1)
        lost = LostRun(f"{job}:gone", job, "2024-01-01", 1, 2, "open", "why", "todo")
        assert lost_records.record(store, lost)
    assert job_tallies.count_missed(store, "nightly", ["2024-01-01"]) == ["2024-01-01"]
    assert data_set_mark.observe(store, "nightly").loss is None
    # The tick leader's lease and a job's tick lock fenced by its token.
    lease = hold_leadership(store, "worker-1", 5000)
    assert lease.held
    with job_tick_lock(store, "nightly", 5000, Leadership("worker-1", lease.token)) as (taken, _):
        assert taken == TAKEN
    assert not release_leadership(store, "worker-1").held
    # The jobs a worker declares, and the fleet's view of them (reads of one slot each).
    declare_jobs(store, "worker-1#1", "worker-1", {"nightly": "app.jobs:nightly"})
    assert not declared_jobs(store).jobs["nightly"].ticked  # no leader holds the lease
    withdraw_jobs(store, "worker-1#1")
    names = {name for name, _ in recorder.calls}
    assert names == set(KEY_COUNTS), f"not exercised: {set(KEY_COUNTS) - names}"
    spanning = [(name, slots) for name, slots in recorder.calls if len(slots) != 1]
    assert not spanning, spanning


def test_a_16_shard_fleet_run_completes_once_with_work_on_every_primary(
    cluster_store: LeaseStore,
    redis_cluster: ClusterServers,
    redis_url: str,
    queue_name: str,
    procs: Processes,
    configure: Callable[[dict[str, str]], None],  # noqa: F811
) -> None:
    store = cluster_store
    items = 320
    env = fleet_env(queue_name, items=items, shards=16, ttl=5, batch=10, delay=0.001)
    for n in range(3):
        procs.worker(redis_cluster.url, queue_name, env, name=f"w{n}", queue_url=redis_url)
    configure(env)
    run_id = start_run(store)
    state = drive(store, FLEET_PATH, run_id, timeout=90)
    assert state == "succeeded", (Runs(store).info(run_id), procs.log("w0"))
    assert_all_done_once(store, run_id, items)
    assert effects(store) == {fleet_jobs.item_id(n): 1 for n in range(items)}
    done_on: Counter[int] = Counter()
    for record in all_records(store, run_id):
        shard = store.shard_for(run_id, record.item_id)
        slot = key_slot(store.keys.shard(run_id, shard)[0].encode())
        done_on[redis_cluster.slot_owner(slot)] += 1
    assert set(done_on) == set(redis_cluster.primaries()), done_on
    assert all(count >= items // 16 for count in done_on.values()), done_on
    # RQ's keys are on the queue's Redis, none on the cluster
    rq_on_cluster = [k for k in store.client.scan_iter(match="rq:*", count=1000)]
    assert rq_on_cluster == []


def _cli(cluster: ClusterServers, prefix: str, *args: str, queue_url: str | None = None) -> Any:
    urls = ["--url", cluster.url, "--prefix", prefix]
    if queue_url:
        urls += ["--queue-url", queue_url]
    return subprocess.run(
        [*REPO_PYTHON, *urls, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_cli_works_a_run_on_a_cluster(
    cluster_store: LeaseStore, redis_cluster: ClusterServers
) -> None:
    prefix = cluster_store.prefix
    added = _cli(redis_cluster, prefix, "add", "r", "a", "b", "c", "d", "--shards", "4")
    assert added.returncode == 0, added.stderr
    claimed = _cli(redis_cluster, prefix, "claim", "r", "a", "-w", "ops", "--json")
    assert claimed.returncode == 0, claimed.stderr
    token = json.loads(claimed.stdout)["token"]
    committed = _cli(redis_cluster, prefix, "commit", "r", "a", "-t", str(token))
    assert committed.returncode == 0, committed.stderr
    status = _cli(redis_cluster, prefix, "status", "r", "--json")
    assert status.returncode == 0, status.stderr
    counts = json.loads(status.stdout)["counts"]
    assert (
        counts
        == cluster_store.status("r").counts
        == {
            "pending": 3,
            "leased": 0,
            "done": 1,
            "dead": 0,
        }
    )
    runs = _cli(redis_cluster, prefix, "runs")
    assert runs.returncode == 0 and "r\t" in runs.stdout, runs


def test_rq_commands_on_a_cluster_without_a_queue_url_say_how(
    cluster_store: LeaseStore, redis_cluster: ClusterServers
) -> None:
    result = _cli(redis_cluster, cluster_store.prefix, "worker", "--burst")
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        "--queue-url redis://HOST:PORT/DB (REDIS_LEASE_QUEUE_URL)"
    )
    assert "Traceback" not in result.stderr
    refused = _cli(redis_cluster, cluster_store.prefix, "status", "r", queue_url=redis_cluster.url)
    assert refused.returncode == 2 and "cannot be a cluster" in refused.stderr


def test_a_plain_url_to_a_cluster_node_is_refused_before_any_write(
    redis_cluster: ClusterServers, prefix: str
) -> None:
    node = redis_cluster.node_urls[0]
    result = subprocess.run(
        [*REPO_PYTHON, "--url", node, "--prefix", prefix, "add", "r", "a", "b", "c"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result
    assert "is a Redis Cluster node: use redis+cluster://" in result.stderr
    client = redis_cluster.client()
    try:
        assert list(client.scan_iter(match=f"{prefix}:*")) == []
    finally:
        client.close()


def test_the_dashboard_shows_a_cluster_run_and_rq_from_the_queue_url(
    cluster_store: LeaseStore,
) -> None:
    store = cluster_store
    store.add("r", [Item(f"i{n}") for n in range(6)], shards=3)
    store.commit(store.claim("r", "i0", "w1"))
    name = f"{store.prefix}-dash"
    job = queue(store.rq, name).enqueue_call(func="builtins.print", args=["queued"])
    try:
        client = create_app(store, secret_key="test").test_client()
        page = client.get("/runs/r")
        assert page.status_code == 200, page.data[:500]
        assert store.status("r").counts["done"] == 1
        assert "i0" in client.get("/runs/r/items/i0").get_data(as_text=True)
        listed = client.get("/rq/0/data/queues.json")  # the /rq views read RQ's Redis
        assert listed.status_code == 200
        assert name in {q["name"] for q in listed.get_json()["queues"]}
        shown = client.get(f"/rq/0/data/job/{job.id}.json").get_json()
        assert shown["id"] == job.id
    finally:
        purge_queue(store.rq, name)


def test_the_documented_acl_users_work_on_a_cluster(
    redis_cluster: ClusterServers, prefix: str
) -> None:
    text = (REPO / "docs" / "security.md").read_text()
    (extra,) = re.findall(r"```cluster-acl\n(.*?)\n```", text, re.DOTALL)
    passwords = {name: f"{name}-Cluster-9" for name in ("worker", "reader", "admin")}
    users = {}
    for name, line in documented_acl_lines().items():
        user = f"rl-{name}-{prefix[-6:]}"  # users of this test's own on the session cluster
        pattern = line.replace("~rl:*", f"~{prefix}:*").replace(f"rl-{name}", user)
        pattern = pattern.replace(f"{name.upper()}_PASSWORD", passwords[name])
        users[name] = user
        for port in redis_cluster.ports:
            node = redis.Redis(port=port)
            try:
                node.execute_command(*pattern.split(), *extra.split())  # type: ignore[no-untyped-call]
            finally:
                node.close()

    def store_of(name: str) -> LeaseStore:
        auth = f"redis+cluster://{users[name]}:{passwords[name]}@"
        return LeaseStore.from_url(redis_cluster.url.replace("redis+cluster://", auth), prefix)

    worker, reader, admin = store_of("worker"), store_of("reader"), store_of("admin")
    try:
        worker.add("r", [Item("a"), Item("b"), Item("c")], shards=3)
        worker.commit(worker.claim("r", "a", "w"))
        worker.fail(worker.claim("r", "b", "w"), "permanent: no", permanent=True)
        assert reader.status("r").counts == {"pending": 1, "leased": 0, "done": 1, "dead": 1}
        assert admin.requeue("r", ["b"]) == 1
        with pytest.raises(PermissionDenied):
            reader.requeue("r", ["b"])
    finally:
        for store in (worker, reader, admin):
            store.close()
        for port in redis_cluster.ports:
            node = redis.Redis(port=port)
            try:
                node.execute_command("ACL", "DELUSER", *users.values())  # type: ignore[no-untyped-call]
            finally:
                node.close()


def test_an_evicting_primary_is_a_danger_and_a_cluster_queue_url_is_refused(
    redis_cluster: ClusterServers,
) -> None:
    client = client_from_url(redis_cluster.url)
    node = redis.Redis(port=redis_cluster.ports[-1])
    try:
        assert eviction_danger(client) is None
        node.config_set("maxmemory-policy", "allkeys-lru")  # one primary of three
        danger = eviction_danger(client)
        assert danger is not None and "allkeys-lru" in danger
    finally:
        node.config_set("maxmemory-policy", "noeviction")
        node.close()
        client.close()
    with pytest.raises(InvalidInput, match="queue URL cannot be a cluster"):
        LeaseStore.from_url(redis_cluster.url, queue_url=redis_cluster.url)
