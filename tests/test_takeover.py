"""A stopped shard job's leases end and its items go back to work (redis_lease.fleet.takeover).

The parts on one store (every backend): ``cut_leases`` ends one owner's leases and no
one else's, the next claim takes them over with new tokens; a sweep takes over a
registered shard job without a heartbeat once, leaves a beating one alone, forgets an
entry nobody can read; the tick takes over a dead registered job it finds. The fleet
tests (real ``redis-lease worker`` processes, leases at the default 60 s) are in
``tests/test_takeover_fleet.py``.
"""

from __future__ import annotations

import json

import pytest

from redis_lease import Item, LeaseStore
from redis_lease.errors import LeaseLost
from redis_lease.fleet.runs import Runs
from redis_lease.fleet.shard_jobs import enqueue_shard, live_jobs, queue
from redis_lease.fleet.takeover import ShardJob, registered, sweep, takeovers
from redis_lease.fleet.worker.watch import beat_worker
from redis_lease.limits import DEAD_AFTER_MS
from redis_lease.operate.dashboard import create_app
from redis_lease.operate.worker_views import worker_rows

RUN = "takeover-run"
OWNER_A, OWNER_B, OWNER_C = "host-a:101:aaaaaaaa", "host-b:202:bbbbbbbb", "host-c:303:cccccccc"


def shard_job(rq_id: str, owner: str = OWNER_A, worker: str = "w-a") -> ShardJob:
    """A registration as a shard job of ``RUN``'s shard 0 would make it."""
    return ShardJob(
        rq_id=rq_id,
        run_id=RUN,
        shard=0,
        worker=worker,
        owner=owner,
        host="host-a",
        pid=101,
        path="tests.fleet_jobs:fleet",
        queue="q",
        budget=30.0,
    )


def add_items(store: LeaseStore, count: int = 6) -> None:
    store.add(RUN, [Item(f"i{n}", {"n": n}) for n in range(count)], shards=1)


def register(store: LeaseStore, job: ShardJob, *, beating: bool) -> None:
    if beating:
        store.client.set(store.keys.run_beat(job.run_id, job.rq_id), "{}", px=DEAD_AFTER_MS)
    store.client.hset(store.keys.shard_jobs, job.rq_id, job.to_json())


def test_cut_leases_ends_only_that_owners_leases_and_the_next_claim_takes_them_over(
    store: LeaseStore,
) -> None:
    add_items(store)
    mine = store.claim_next(RUN, OWNER_A, shard=0, limit=3, ttl=600)
    theirs = store.claim_next(RUN, OWNER_B, shard=0, limit=3, ttl=600)

    cut = store.cut_leases(RUN, 0, OWNER_A)

    assert cut.leases == 3
    with pytest.raises(LeaseLost):
        store.commit(mine[0])
    store.commit(theirs[0])  # the other owner's leases stand
    again = store.claim_next(RUN, OWNER_C, shard=0, limit=10, ttl=600)
    assert sorted(lease.item_id for lease in again) == sorted(lease.item_id for lease in mine)
    by_item = {lease.item_id: lease for lease in mine}
    assert all(lease.token > by_item[lease.item_id].token for lease in again)
    counters = store.status(RUN).counters
    assert counters["leases_cut"] == 3
    assert counters["takeovers"] == 3
    assert store.cut_leases(RUN, 0, OWNER_A).leases == 0  # nothing of it is left


def test_a_sweep_takes_over_a_silent_shard_job_once_and_leaves_a_beating_one(
    store: LeaseStore,
) -> None:
    add_items(store)
    store.claim_next(RUN, OWNER_A, shard=0, limit=2, ttl=600)
    beating = store.claim_next(RUN, OWNER_B, shard=0, limit=2, ttl=600)
    register(store, shard_job("rl-silent"), beating=False)
    register(store, shard_job("rl-beating", OWNER_B, "w-b"), beating=True)
    store.client.hset(store.keys.shard_jobs, b"rl-garbage", b"\xff\xfe{not json")

    done = sweep(store)

    assert [(d.job.rq_id, d.leases) for d in done] == [("rl-silent", 2)]
    assert [entry.key for entry in registered(store)] == [b"rl-beating"]  # garbage forgotten
    assert sweep(store) == []  # taken over once
    store.commit(beating[0])  # the beating job's leases stand
    runs = Runs(store)
    assert runs.info(RUN)["failed_jobs"] == "1"
    assert any(d["kind"] == "takeover" for d in runs.decisions(RUN))
    (logged,) = takeovers(store)
    assert (logged["rq_id"], logged["worker"], logged["leases"]) == ("rl-silent", "w-a", 2)
    rows = {row.name: row for row in worker_rows(store)}
    assert rows["w-a"].state == "dead" and rows["w-a"].leases_taken_over == 2
    assert rows["w-b"].shard_jobs[0]["beating"] is True


def test_the_dashboards_workers_page_shows_the_live_and_the_dead(store: LeaseStore) -> None:
    add_items(store)
    store.claim_next(RUN, OWNER_A, shard=0, limit=2, ttl=600)
    store.claim_next(RUN, OWNER_B, shard=0, limit=3, ttl=600)
    register(store, shard_job("rl-silent"), beating=False)
    alive = shard_job("rl-beating", OWNER_B, "w-b")
    store.client.set(store.keys.run_beat(RUN, alive.rq_id), '{"held": 3}', px=DEAD_AFTER_MS)
    store.client.hset(store.keys.shard_jobs, alive.rq_id, alive.to_json())
    beat_worker(store, "w-b", '{"host": "host-b", "pid": 202, "queues": ["q"]}')
    sweep(store)

    page = create_app(store, secret_key="k").test_client().get("/workers")

    assert page.status_code == 200
    html = " ".join(page.get_data(as_text=True).split())
    assert 'data-worker="w-b" data-state="alive"' in html
    assert 'data-worker="w-a" data-state="dead"' in html
    assert f"{RUN}</a> shard 0: 3 leases" in html
    assert f"2 leases: <div>2 of {RUN} shard 0 at" in html


def test_a_hostile_takeover_log_and_registry_show_as_text(store: LeaseStore) -> None:
    """Names are anything anyone wrote: the view keeps them as text and reads on."""
    add_items(store, 2)
    hostile = "<script>alert(1)</script>\u202e\"'"
    store.claim_next(RUN, OWNER_A, shard=0, limit=1, ttl=600)
    register(store, shard_job("rl-x", worker=hostile), beating=False)
    store.client.lpush(store.keys.takeovers, b"\xff not json", json.dumps(["a list"]))
    sweep(store)
    rows = {row.name: row for row in worker_rows(store)}
    assert rows[hostile].leases_taken_over == 1
    json.dumps([row.to_dict() for row in rows.values()])  # JSON-ready whatever was stored


@pytest.mark.real_redis_only("RQ's queues")
@pytest.mark.not_on_cluster("RQ runs on the queue URL's server")
def test_the_tick_takes_over_a_dead_registered_shard_job(
    real_store: LeaseStore, queue_name: str
) -> None:
    store = real_store
    add_items(store)
    rq_id = enqueue_shard(store, "tests.fleet_jobs:fleet", queue_name, RUN, 0, 30.0)
    rq_job = queue(store.rq, queue_name).fetch_job(rq_id)
    assert rq_job is not None
    rq_job.set_status("started")  # a worker took it, then died: no beat
    store.client.lrem(f"rq:queue:{queue_name}", 0, rq_id)
    held = store.claim_next(RUN, OWNER_A, shard=0, limit=4, ttl=600)
    register(store, shard_job(rq_id), beating=False)

    assert live_jobs(store, RUN) == {}

    assert store.status(RUN).counters["leases_cut"] == len(held)
    assert registered(store) == []
    assert Runs(store).info(RUN)["failed_jobs"] == "1"  # counted once, as taken over
    assert live_jobs(store, RUN) == {}
    assert Runs(store).info(RUN)["failed_jobs"] == "1"
