"""A real Redis loses data in the middle of a fleet run: the loss is told, counted, and every
item of the date is done in the end with no effect applied twice.

Each test runs the effects job of :mod:`tests.effect_jobs` on ``redis-lease worker``
processes (:mod:`tests.faults.cluster`), with a provider that honours idempotency keys,
and ticks from the test's process, whose store remembers the data set it ticked
(:mod:`redis_lease.fleet.loss.tick_memory`). The job fires every minute, so its date is covered by
its schedule and catch-up policy. The losses:

- (a) everything: ``redis-server`` restarts with no data;
- (b) one run's record: every key of the run deleted (what eviction or a careless
  ``DEL`` does), the rest of the data set kept;
- (c) the last writes: a Sentinel failover to a replica that stopped replicating before
  the primary died (tests/test_sentinel.py's harness): either the last commits, or the
  run itself, made after the cut.

After it the tick must say so (a ``data_lost`` decision for (a) and (c), a ``rerun`` of
the run where it vanished), count it (``redis_lease_data_set_losses_total``,
``redis_lease_lost_runs_total``), record it on the run (``after_loss``,
``replanned_items``), and the run must end ``succeeded`` with each payout applied once.
The history checker judges everything outside the loss window strictly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from redis_lease.demo.provider import ProviderState
from redis_lease.fleet.loss.data_set_mark import observe, read_mark
from redis_lease.fleet.runs.job_tallies import read as read_tallies
from redis_lease.fleet.runs.lifecycle import Decision, Runs
from tests.faults.cluster import Cluster
from tests.helpers import server_ms
from tests.redis_cluster import _admin
from tests.test_sentinel import SentinelCluster, cut_replica, done_count, judge_on

pytestmark = pytest.mark.slow

#: Every minute: today's date is always due, so a lost run of it is made again.
EVERY_MINUTE = "* * * * *"


@pytest.fixture(params=[1, 16], ids=["c1", "c16"])
def concurrency(request: pytest.FixtureRequest) -> int:
    """Handlers each worker runs at once."""
    return int(request.param)


def fleet_settings(concurrency: int) -> dict[str, Any]:
    """A run of a few seconds (more items at c16), a provider that honours idempotency keys;
    the passes past a quarter of the items and 4 wait at the hold until the loss is in
    place (:func:`quarter_done`), so that it comes mid-run however slow the machine."""
    items = 48 if concurrency == 1 else 48 * 6
    return {
        "items": items,
        "hold_after": items // 4 + 4,
        "shards": 2,
        "ttl": 1.5,
        "schedule": EVERY_MINUTE,
        "provider": ProviderState(latency=0.08 if concurrency == 1 else 0.2),
        "honours_keys": True,
    }


def quarter_done(c: Cluster, run_id: str) -> bool:
    """At least a quarter of the run's items are done, and the rest waits at the hold."""
    return c.work_held(run_id, c.config.items // 4)()


def of_kind(decisions: list[Decision], kind: str, run_id: str | None = None) -> list[Decision]:
    """The decisions of ``kind`` (about ``run_id``)."""
    return [d for d in decisions if d.kind == kind and (run_id is None or d.run_id == run_id)]


def assert_done_once(c: Cluster, run_id: str) -> None:
    """Every planned item is done, and the provider applied each payout exactly once; items
    done before the loss were done again, under the same keys: their payouts sent again, or
    found by the handler's lookup (a run marked after the loss has no record to trust)."""
    records = {
        record.item_id: record.state
        for shard in range(c.config.shards)
        for record in c.store.items(run_id, shard)
    }
    assert records == dict.fromkeys(c.planned(run_id), "done")
    applied = c.provider.state.applications
    assert len(applied) == c.config.items and set(applied.values()) == {1}, applied
    resent = any(sent > 1 for sent in c.provider.state.requests.values())
    assert resent or c.store.status(run_id).counters.get("effects_reconciled", 0) > 0


def assert_made_again(c: Cluster, run_id: str, why: str) -> None:
    """The run was made again after it vanished: decided, recorded, counted."""
    [rerun] = of_kind(c.decisions, "rerun", run_id)
    assert why in rerun.reason, rerun
    info = Runs(c.store).info(run_id)
    assert why in info["after_loss"]
    assert info["replanned_items"] == str(c.config.items)  # the planner made every item again
    logged = [e["kind"] for e in Runs(c.store).decisions(run_id, count=1000)]
    assert logged.count("rerun") == 1
    assert read_tallies(c.store, [c.job.name])[c.job.name].lost == 1


def test_everything_lost_mid_run_is_told_and_the_run_made_again(
    tmp_path: Path, prefix: str, concurrency: int
) -> None:
    """(a) ``redis-server`` restarts with no data while the workers are mid-run.

    The test's tick side remembers the data set: it tells the wipe (``replaced``), counts
    it once, and makes the run it remembered open again; the planner makes every item
    again, and the handler's lookup finds each payout made before the wipe (the effect
    ledger went with it), or the provider's idempotency keys stop a second one. Breaks if
    the wipe goes untold or uncounted, if the run is not made again, or if a payout is
    applied twice.
    """
    settings = fleet_settings(concurrency)
    with Cluster(tmp_path / "c", prefix, concurrency=concurrency, workers=2, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=lambda: quarter_done(c, run_id))
        before = read_mark(c.store)
        assert done_count(c, run_id) < c.config.items  # mid-run: work is left
        restarted = c.restart_redis(empty=True)
        c.lift_hold()
        assert c.drive(run_id, timeout=90) == "succeeded"
        [told] = of_kind(c.decisions, "data_lost")
        assert before is not None and f"mark {before.id} now" in told.reason
        assert_made_again(c, run_id, "the tick side remembered it open")
        mark = read_mark(c.store)
        assert mark is not None and mark.losses == {"replaced": 1, "rolled_back": 0, "mark_lost": 0}
        assert_done_once(c, run_id)
        summary = c.verify(run_id, loss=(0, restarted))
        assert summary.regranted_after_loss >= 1  # items done before the wipe were done again


def test_one_runs_keys_deleted_mid_run_the_run_is_made_again(
    tmp_path: Path, prefix: str, concurrency: int
) -> None:
    """(b) Every key of the run is deleted while the workers are mid-run; the rest stays.

    No memory is needed: the job's open runs still list it. The next tick makes it again
    (a ``rerun`` decision, not a failure), the planner makes its items again, and the
    workers finish them. The data set itself was not replaced: no ``data_lost``. Breaks if
    the run is dropped, not made again, counted twice, or a payout applied twice.
    """
    settings = fleet_settings(concurrency)
    with Cluster(tmp_path / "c", prefix, concurrency=concurrency, workers=2, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=lambda: quarter_done(c, run_id))
        client = c.store.client
        keys = [key for key in client.scan_iter(match=f"{prefix}:*{{{run_id}*", count=1000)]
        deleted_at = server_ms(client)
        assert done_count(c, run_id) < c.config.items  # mid-run: work is left
        client.delete(*keys)
        c.note("delete-run-keys", f"{len(keys)} keys at server ms {deleted_at}")
        c.lift_hold()
        assert c.drive(run_id, timeout=90) == "succeeded"
        assert not of_kind(c.decisions, "data_lost") and not of_kind(c.decisions, "error")
        assert_made_again(c, run_id, "it is listed among the job's open runs")
        assert_done_once(c, run_id)
        c.verify(run_id, loss=(0, deleted_at))


@pytest.mark.parametrize("lost", ["commits", "run"])
def test_a_failover_that_missed_the_last_writes_is_told_and_the_run_finished(
    tmp_path: Path, prefix: str, lost: str
) -> None:
    """(c) The replica stops replicating, the primary takes more writes, then dies; the
    sentinel promotes the replica, which never had those writes.

    ``commits``: the run was made before the cut; the commits after it are lost and the
    items done again. ``run``: the run itself was made after the cut; the promoted
    replica has no trace of it but the tick side remembers it open, and makes it again.
    Either way the tick tells that the data set went back (``rolled_back``: its own ticks'
    writes are gone), counts it once, records it on the run, and the run ends
    ``succeeded`` on the new primary with each payout applied once. Breaks if the
    rollback goes untold, or the run is lost or paid twice.
    """
    provider = ProviderState(latency=0.1)
    settings = {"items": 96, "shards": 2, "ttl": 1.5, "schedule": EVERY_MINUTE, "hold_after": 28}
    with SentinelCluster(tmp_path / "c", prefix, workers=2, provider=provider, **settings) as c:
        c.wait_ready()
        observe(c.store, c.job.name)  # the data set is marked before the cut
        run_id = c.start_run() if lost == "commits" else ""
        if run_id:
            c.drive(run_id, until=lambda: quarter_done(c, run_id))
        old, replica = c.group.primary_port(), c.group.replica.port
        cut = cut_replica(old, replica)
        c.note("cut", f"replica {replica} stops replicating at server ms {cut}")
        if not run_id:
            run_id = c.start_run()
        at_cut = done_count(c, run_id)
        c.hold_more(8)  # commits after the cut, the rest still held
        c.drive(run_id, until=c.work_held(run_id, at_cut + 4))
        assert done_count(c, run_id) < c.config.items  # mid-run: work is left
        c.group.kill_primary()
        c.note("kill-primary", str(old))
        new = c.group.wait_for_new_primary(old)
        c.lift_hold()
        with _admin(new) as promoted_server:
            promoted = server_ms(promoted_server)
        assert new == replica
        assert c.drive(run_id, timeout=90) == "succeeded"
        judge_on(c, new)
        [told] = of_kind(c.decisions, "data_lost")
        assert told.reason.startswith("the data set went back in time"), told
        mark = read_mark(c.store)
        assert mark is not None and mark.losses == {"replaced": 0, "rolled_back": 1, "mark_lost": 0}
        if lost == "run":
            assert_made_again(c, run_id, "the tick side remembered it open")
        else:
            assert of_kind(c.decisions, "loss", run_id)  # it lived through the loss: told so
            assert "went back in time" in Runs(c.store).info(run_id)["after_loss"]
        assert_done_once(c, run_id)
        c.verify(run_id, loss=(cut, promoted))
