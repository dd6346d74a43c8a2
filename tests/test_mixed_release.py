"""A worker of the previous release beside one of this release, on one run.

A fleet is upgraded without stopping it by replacing its workers one at a time, so for a
while workers of two releases work the same runs. The previous release is the newest
numbered one of CHANGELOG.md (:func:`tests.releases.previous`); its commit is built into
a venv of its own, and its ``redis-lease worker --simple`` runs the effects job of its own
``tests/`` beside this release's, in the fault harness (:mod:`tests.faults.cluster`: a
private Redis, a provider, every script call recorded), ticked by this release. The
provider ignores idempotency keys, so only the fence and the ledger stand between a
takeover and a second payout. The history checker judges each run:

- both workers work one run side by side, each committing, and it succeeds;
- each takes the other's work over: the previous release's worker, paused holding its
  claims, is taken over by this release's once its leases expire (it neither registers
  nor beats, so no heartbeat takeover helps), and stops when it wakes; this release's
  worker, killed with a payout applied and not committed, is taken over by this
  release's tick, and the previous release's worker finishes its items from the ledger
  without paying again.

Building the release takes about half a minute (pip's cache holds the dependencies);
a commit that cannot be found or built fails the test.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from redis_lease.demo.provider import ProviderState
from redis_lease.fleet.effects.ledger import idempotency_key
from redis_lease.fleet.transport.takeover import takeovers
from tests import effect_jobs
from tests.faults.cluster import Cluster
from tests.faults.recorder import OK, Op
from tests.fleet_helpers import wait_for
from tests.releases import Release, build, previous

pytestmark = pytest.mark.slow

#: The previous release's worker slot; slot 1 is this release's.
OLD, NEW = 0, 1
#: Every slot of a worker of this release, then of the previous one.
RELEASES = {NEW: "this", OLD: "previous"}
#: Commands an RQ worker waits in for a job.
BLOCKING = {"blpop", "blmove", "brpoplpush", "bzpopmin"}


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The previous release, built into a venv of its own."""
    return build(previous(), tmp_path_factory.mktemp("previous-release"))


class MixedCluster(Cluster):
    """The fault harness with the worker of slot :data:`OLD` running the previous release."""

    def __init__(self, directory: Path, prefix: str, release: Release, **settings: Any) -> None:
        self.earlier = release
        #: Every process each slot ran.
        self.pids: dict[int, list[int]] = collections.defaultdict(list)
        super().__init__(directory, prefix, **settings)

    def __enter__(self) -> MixedCluster:
        super().__enter__()
        return self

    def _spawn(self, clock: str, log: Path) -> Any:
        index = int(log.stem.rsplit("-", 1)[1])
        if index != OLD:
            process = super()._spawn(clock, log)
        else:  # the same worker command line, from the release's venv and tree
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(effect_jobs, "WORKER_COMMAND", (str(self.earlier.command),))
                patch.setattr(effect_jobs, "worker_env", self.earlier.env)
                patch.setattr(effect_jobs, "ROOT", self.earlier.jobs)
                process = super()._spawn(clock, log)
        self.pids[index].append(process.pid)
        return process

    def ops_of(self, index: int) -> list[Op]:
        """The recorded calls of every process slot ``index`` ran."""
        suffixes = tuple(f":{pid}" for pid in self.pids[index])
        return [op for op in self.ops() if op.process.endswith(suffixes)]

    def commits_of(self, index: int) -> int:
        """The commits slot ``index``'s processes had accepted (repeats aside)."""
        return sum(
            op.type == OK and op.get("f") == "commit" and not op.get("repeated")
            for op in self.ops_of(index)
        )

    def takeovers_of(self, index: int) -> int:
        """The expired or cut leases slot ``index``'s processes took over."""
        return sum(
            bool(grant.get("takeover"))
            for op in self.ops_of(index)
            if op.type == OK
            for grant in op.get("grants") or []
        )

    def wait_waiting(self, count: int) -> None:
        """Waits until ``count`` RQ workers block on the queue, so that jobs enqueued now
        go one to each."""
        wait_for(
            lambda: sum(c.get("cmd") in BLOCKING for c in self.store.client.client_list()) >= count,
            60,
            f"{count} workers waiting for a job\n{self.describe()}",
        )


Mixed = Callable[..., MixedCluster]


@pytest.fixture
def mixed(tmp_path: Path, prefix: str, release: Release) -> Mixed:
    """Makes a :class:`MixedCluster` whose provider ignores idempotency keys."""

    def make(**settings: Any) -> MixedCluster:
        provider = ProviderState(honour_keys=False)
        return MixedCluster(
            tmp_path / "c", prefix, release, provider=provider, honours_keys=False, **settings
        )

    return make


def test_a_previous_and_a_current_worker_share_a_run_and_the_history_holds(mixed: Mixed) -> None:
    with mixed(workers=2, items=48, shards=4) as c:
        c.wait_ready()
        c.wait_waiting(2)  # each takes one of the first shard jobs
        run_id = c.start_run()
        assert c.drive(run_id, timeout=90) == "succeeded"
        summary = c.verify(run_id)
        assert summary.done == summary.accepted_commits == 48
        assert summary.effects_applied == 48
        for index, which in RELEASES.items():
            assert c.commits_of(index) > 0, f"the {which} release's worker committed nothing"
        assert c.commits_of(OLD) + c.commits_of(NEW) == 48


def test_each_release_takes_the_others_work_over_fenced_and_pays_once(mixed: Mixed) -> None:
    pause_at = ("before_effect", "after_effect")
    with mixed(workers=1, items=6, shards=1, pause_at=pause_at) as c:
        c.wait_ready()
        run_id = c.start_run()
        # The previous release's worker claims the shard's items and stops at its first.
        c.drive(run_id, until=lambda: (c.hooks / "before_effect.at").exists())
        index, paused = c.wait_hook("before_effect")
        assert index == OLD
        c.pause(OLD)
        c.release("before_effect")  # seen once the process runs again

        # This release's worker takes the expired leases over and stops with a payout
        # applied and not committed.
        assert c.start_worker() == NEW
        c.wait_ready()
        c.drive(run_id, until=lambda: (c.hooks / "after_effect.at").exists())
        index, applied = c.wait_hook("after_effect")
        assert index == NEW and c.takeovers_of(NEW) > 0
        c.resume(OLD)
        c.kill(NEW)  # its payout applied, its commit never sent

        # This release's tick takes the dead worker's job over; the previous release's
        # worker finishes the items, the applied payout from the ledger.
        assert c.drive(run_id, timeout=90) == "succeeded"
        summary = c.verify(run_id)
        assert summary.done == summary.accepted_commits == 6 and summary.effects_applied == 6
        for stopped in (paused, applied):
            record = c.store.item(run_id, stopped["item"])
            assert record.state == "done" and record.token > stopped["token"]
            key = idempotency_key(run_id, stopped["item"], "payout")
            assert c.provider.state.applications.get(key, 0) == 1
        assert c.commits_of(OLD) > 0 and c.takeovers_of(OLD) > 0
        assert c.commits_of(NEW) == 0
        # by heartbeat, only this release's job may be taken over: the previous release's
        # worker never registered its jobs, and its leases' expiry alone freed its items
        # (on a loaded machine this release's leases may run out first, and then no job is
        # taken over by heartbeat at all)
        taken_from = [entry["pid"] for entry in takeovers(c.store)]
        assert set(taken_from) <= set(c.pids[NEW]), taken_from
        assert c.workers[OLD].alive, f"the previous release's worker quit\n{c.describe()}"
        assert c.pids[OLD] == [c.workers[OLD].process.pid]  # never restarted
