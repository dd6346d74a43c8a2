"""A stopped shard job's leases end and its items go back to work
(redis_lease.fleet.transport.takeover).

The parts on one store (every backend): ``cut_leases`` ends one owner's leases and no
one else's, the next claim takes them over with new tokens; a sweep takes over a
registered shard job without a heartbeat once, leaves a beating one alone, forgets an
entry nobody can read; the tick takes over a dead registered job it finds. The fleet
tests (real ``redis-lease worker`` processes, leases at the default 60 s) are in
``tests/test_takeover_fleet.py``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from dataclasses import replace

import pytest
from redis.exceptions import ResponseError
from rq.job_lifecycle import record_job_failure

from redis_lease import Item, LeaseStore
from redis_lease.errors import LeaseLost
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.transport import takeover
from redis_lease.fleet.transport.shard_jobs import enqueue_shard, live_jobs, queue
from redis_lease.fleet.transport.takeover import ShardJob, registered, sweep, takeovers, unregister
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


def register(store: LeaseStore, job: ShardJob, *, beating: bool, said: str = "{}") -> None:
    """Registers ``job`` as a shard job does: alive (its last beat now), or with its last
    beat longer ago than DEAD_AFTER, after a fleet clock with no stall."""
    entries, beats, _taking, _clock = store.keys.shard_job_registry
    now = no_stall(store)
    store.client.hset(entries, job.rq_id, job.to_json())
    store.client.zadd(beats, {job.rq_id: now if beating else now - DEAD_AFTER_MS - 1000})
    store.client.set(store.keys.run_beat(job.run_id, job.rq_id), said, px=DEAD_AFTER_MS)


def no_stall(store: LeaseStore) -> int:
    """Sets the fleet's clock as a fleet that beat every second for a while leaves it
    (no stall lately); returns the server's ms."""
    now = server_ms(store)
    clock = store.keys.shard_job_registry[3]
    store.client.hset(clock, mapping={"last_ms": now, "stall_end_ms": now - 10 * DEAD_AFTER_MS})
    return now


def server_ms(store: LeaseStore) -> int:
    seconds, micros = store.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


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
    entries, beats, _taking, _clock = store.keys.shard_job_registry
    store.client.hset(entries, b"rl-garbage", b"\xff\xfe{not json")
    store.client.zadd(beats, {"rl-garbage": 1})

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
    register(store, shard_job("rl-beating", OWNER_B, "w-b"), beating=True, said='{"held": 3}')
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


@pytest.mark.real_redis_only("RQ's queues")
@pytest.mark.not_on_cluster("RQ runs on the queue URL's server")
@pytest.mark.parametrize("status", ["abandoned", "finished", "canceled"])
def test_the_tick_judges_a_registered_shard_job_by_the_registry_not_by_rq(
    real_store: LeaseStore, queue_name: str, status: str
) -> None:
    """RQ's cleanup fails a started job whose registry entry expired by the clock of the
    worker that cleans (a job on a worker 2 h behind, cleaned by one 2 h ahead: RQ's own
    words below): a shard job still beating is live, its leases stand, and nothing is
    counted failed; so is one RQ says ended."""
    store = real_store
    add_items(store)
    rq_id = enqueue_shard(store, "tests.fleet_jobs:fleet", queue_name, RUN, 0, 30.0)
    rq_job = queue(store.rq, queue_name).fetch_job(rq_id)
    assert rq_job is not None
    if status == "abandoned":
        with store.rq.pipeline() as pipe:
            abandoned = "Moved to FailedJobRegistry, due to AbandonedJobError, at 2026-12-07"
            record_job_failure(rq_job, abandoned, pipe)
            pipe.execute()
    else:
        rq_job.set_status(status)
    store.client.lrem(f"rq:queue:{queue_name}", 0, rq_id)
    held = store.claim_next(RUN, OWNER_A, shard=0, limit=4, ttl=600)
    register(store, shard_job(rq_id), beating=True)

    assert live_jobs(store, RUN) == {0: [rq_id]}

    assert store.status(RUN).counters.get("leases_cut") is None
    assert Runs(store).info(RUN).get("failed_jobs") is None
    store.commit(held[0])


# -- the rule: the server's clock, and a stall's grace -----------------------------------


def test_cut_leases_finds_every_lease_of_the_owner_behind_a_thousand_others(
    store: LeaseStore,
) -> None:
    """The owner's leases expire after 1,200 of another owner's: all are cut, and only they,
    however small the pages (a batch shares one expiry, and is looked at whole)."""
    store.add(RUN, [Item(f"i{n}", {"n": n}) for n in range(1260)], shards=1)
    theirs = store.claim_next(RUN, OWNER_B, shard=0, limit=1200, ttl=300)
    mine = [*store.claim_next(RUN, OWNER_A, shard=0, limit=30, ttl=600)]
    mine += store.claim_next(RUN, OWNER_A, shard=0, limit=30, ttl=900)

    assert store.cut_leases(RUN, 0, OWNER_A).leases == 60
    assert store.cut_leases(RUN, 0, OWNER_A, limit=7).leases == 0  # nothing of it is left
    for lease in mine[:3]:
        with pytest.raises(LeaseLost):
            store.commit(lease)
    store.commit(theirs[-1])  # the other owner's leases stand
    assert store.status(RUN).counters["leases_cut"] == 60


def test_cut_leases_in_small_pages_finds_a_batch_sharing_one_expiry(store: LeaseStore) -> None:
    add_items(store, 40)
    store.claim_next(RUN, OWNER_B, shard=0, limit=10, ttl=300)
    store.claim_next(RUN, OWNER_A, shard=0, limit=25, ttl=600)  # one expiry for all 25

    assert store.cut_leases(RUN, 0, OWNER_A, limit=3).leases == 25


def test_cut_leases_refuses_a_malformed_cursor(store: LeaseStore) -> None:
    add_items(store)
    keys = store.keys.shard(RUN, 0)
    with pytest.raises(ResponseError, match="INVALID ARGV\\[3\\]"):
        store.scripts.run("cut_leases", keys, [OWNER_A, 10, "(12a"])


def stall_ended(store: LeaseStore, ago_ms: int) -> None:
    """Sets the fleet's clock as a stall that ended ``ago_ms`` ago leaves it."""
    now = server_ms(store)
    clock = store.keys.shard_job_registry[3]
    store.client.hset(clock, mapping={"last_ms": now, "stall_end_ms": now - ago_ms})


def test_after_a_stall_every_job_has_a_full_dead_after_period_to_beat_again(
    store: LeaseStore,
) -> None:
    """A job silent for long is taken over only DEAD_AFTER after the last stall ended."""
    add_items(store)
    store.claim_next(RUN, OWNER_A, shard=0, limit=2, ttl=600)
    register(store, shard_job("rl-silent"), beating=False)
    stall_ended(store, DEAD_AFTER_MS - 1500)  # the stall ended 3.5 s ago

    assert sweep(store) == []
    assert [entry.beating for entry in registered(store)] == [True]

    stall_ended(store, DEAD_AFTER_MS + 100)
    assert [d.job.rq_id for d in sweep(store)] == ["rl-silent"]


def test_a_gap_between_calls_is_a_stall_whatever_the_beats_say(store: LeaseStore) -> None:
    """Nobody reached the registry for 3 s (a stall of Redis): the next call, a sweep,
    records the stall's end, and takes nothing over."""
    add_items(store)
    store.claim_next(RUN, OWNER_A, shard=0, limit=2, ttl=600)
    register(store, shard_job("rl-silent"), beating=False)
    now = server_ms(store)
    clock = store.keys.shard_job_registry[3]
    store.client.hset(clock, mapping={"last_ms": now - 3000, "stall_end_ms": now - 60_000})

    assert sweep(store) == []
    stall_end = int(store.client.hget(clock, "stall_end_ms"))
    assert stall_end >= now and int(store.client.hget(clock, "stalls")) == 1
    assert store.status(RUN).counters.get("leases_cut") is None


def test_a_beat_never_registers_a_job_taken_over(store: LeaseStore) -> None:
    add_items(store)
    job = shard_job("rl-gone")
    register(store, job, beating=False)
    (done,) = sweep(store)
    assert done.job == job

    beat = store.scripts.call(
        "shard_job_beat", store.keys.shard_job_registry[1::2], [job.rq_id, 2000]
    )
    assert beat[0] is False
    assert registered(store) == []
    assert unregister(store, job.rq_id) is False


def test_a_takeover_left_unfinished_is_taken_again_later(store: LeaseStore) -> None:
    """A watcher that died between winning a takeover and finishing it: another takes it
    again once TAKEOVER_RETRY_MS passed, and the leases are cut once."""
    add_items(store)
    store.claim_next(RUN, OWNER_A, shard=0, limit=3, ttl=600)
    job = shard_job("rl-half")
    register(store, job, beating=False)
    entries, _beats, taking, _clock = store.keys.shard_job_registry
    store.scripts.call(
        "take_shard_jobs",
        store.keys.shard_job_registry,
        ["take", DEAD_AFTER_MS, 2000, 30_000, job.rq_id],
    )  # won, then the watcher died
    assert sweep(store) == []  # begun just now: nobody takes it again yet

    store.client.zadd(taking, {job.rq_id: server_ms(store) - 31_000})
    (done,) = sweep(store)
    assert (done.job.rq_id, done.leases) == ("rl-half", 3)
    assert store.client.hlen(entries) == 0 and store.client.zcard(taking) == 0


def test_a_watcher_never_takes_over_a_shard_job_of_its_own(store: LeaseStore) -> None:
    """Silent jobs of this process, and of this process's worker while their process runs,
    are left alone; a job of this worker whose process is gone is taken over."""
    add_items(store)
    here = socket.gethostname()
    alive = subprocess.Popen(["sleep", "30"])
    ended = subprocess.Popen(["true"])
    ended.wait()
    takeover.OWN_WORKERS.add("w-own")
    try:
        own_process = replace(shard_job("rl-own-process"), host=here, pid=os.getpid())
        own_horse = replace(shard_job("rl-own-horse", worker="w-own"), host=here, pid=alive.pid)
        dead_horse = replace(shard_job("rl-dead-horse", worker="w-own"), host=here, pid=ended.pid)
        for job in (own_process, own_horse, dead_horse):
            register(store, job, beating=False)

        assert [d.job.rq_id for d in sweep(store)] == ["rl-dead-horse"]
        assert sorted(e.job.rq_id for e in registered(store) if e.job) == [
            "rl-own-horse",
            "rl-own-process",
        ]
    finally:
        takeover.OWN_WORKERS.discard("w-own")
        alive.kill()
        alive.wait()


def test_a_takeover_enqueues_again_only_the_job_path_its_jobs_record_holds(
    real_store: LeaseStore,
) -> None:
    """A registry entry is anyone's to write: the watch enqueues a shard job for a taken-over
    entry only under the path its job's record holds (the tick dispatches otherwise), and an
    entry whose path is not a job path is not read at all."""
    from redis_lease.fleet.worker.watch import redispatch

    store = real_store
    add_items(store)
    store.client.hset(store.keys.run(RUN), "job", "fleet")  # a running run of job fleet
    store.client.hset(store.keys.job("fleet"), "path", "tests.fleet_jobs:fleet")
    ours = replace(shard_job("ours"), queue=store.prefix)  # a queue of this test's own
    forged = replace(ours, rq_id="forged", path="os:system")
    assert redispatch(store, takeover.Takeover(forged, 0, 0)) is None
    enqueued = redispatch(store, takeover.Takeover(ours, 0, 0))
    assert enqueued is not None
    # a run no tick made (shard jobs enqueued by the caller of Runs): no path recorded, so
    # the stopped job's own path is enqueued again, or its shard would wait for ever
    store.client.hdel(store.keys.job("fleet"), "path")
    assert redispatch(store, takeover.Takeover(ours, 0, 0)) is not None
    queue(store.rq, store.prefix).empty()
    assert (
        ShardJob.from_json("bad", json.dumps({**json.loads(ours.to_json()), "path": "x y"})) is None
    )
