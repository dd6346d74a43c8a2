"""The named setups a page asks for on its first line (``<!-- run: setup NAME -->``).

Each builds, on the page's Redis and prefix, the scene the page starts from, and may give
the page's commands environment variables of their own (a reader's pace made quick for the
suite). Keep them few: a page that can make its own scene with its own snippets should.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

from redis_lease import LeaseStore
from redis_lease.fleet.runs.lifecycle import Runs, to_ms
from redis_lease.fleet.worker.lease_keeper import LeaseKeeper
from redis_lease.fleet.worker.shard_loop import work_shard
from redis_lease.protocol.leases import Item
from tests.helpers import wait_past
from tests.walkthrough_jobs import RUN, payments

#: The checkout (the tutorial installs from it, as from a reader's clone).
ROOT = str(Path(__file__).resolve().parents[2])


def late_run(store: LeaseStore, workdir: Path) -> None:
    """The walk-through's run (tests/walkthrough_jobs.py), worked by the real shard loop
    until only the broken account is left (dead), then past its deadline: partial, late."""
    runs = Runs(store)
    now = runs.server_now()
    deadline = now + timedelta(seconds=5)  # room for the work on a busy machine
    run_id, _ = runs.ensure(payments, date(2026, 12, 2), now, deadline=deadline)
    assert run_id == RUN
    assert runs.plan(payments, run_id) == 20
    keeper = LeaseKeeper(store, payments.options.lease_ttl_seconds)  # not started: nothing to renew
    give_up = time.monotonic() + 20
    while store.status(run_id).unfinished:  # a pass ends when nothing is due: retry later
        assert time.monotonic() < give_up, store.status(run_id).counts
        for shard in range(payments.options.shards):
            stop = threading.Event()
            work_shard(
                store, payments, run_id, shard, worker="w1", budget=5, stop=stop, keeper=keeper
            )
        time.sleep(0.02)  # the retry's backoff (20-50 ms) runs on the server clock
    status = store.status(run_id)
    assert (status.counts["done"], status.counts["dead"]) == (19, 1), status.counts
    wait_past(store.client, to_ms(deadline), timeout=10)
    assert runs.finalize(run_id, "deadline passed") is not None


def fixture_items(store: LeaseStore, workdir: Path) -> None:
    """Run ``fixture:2026-12-02`` with three pending items (the runner's own test page)."""
    store.add("fixture:2026-12-02", [Item(name, {"n": n}) for n, name in enumerate("abc")])
    (workdir / "setup.txt").write_text("made by the setup\n")


def tutorial(store: LeaseStore, workdir: Path) -> dict[str, str]:
    """The tutorial's scene: its directory sits beside a clone of the repository
    (``../redis-lease`` is this checkout: the tutorial installs from it, as a reader does
    while the package is not on the package index; its dependencies come from there),
    and the tutorial's bank answers in 0.1 s, not the second a reader's payout takes (so
    a reader has minutes to kill a worker, and the suite seconds; that step 7's timeout
    covers the reader's pace is checked by tests/test_tutorial_numbers.py, and
    scripts/tutorial-at-reader-pace.py runs the page at that pace)."""
    (workdir.parent / "redis-lease").symlink_to(ROOT)
    return {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "BANK_SECONDS": "0.1"}


def clone(store: LeaseStore, workdir: Path) -> None:
    """The page's directory stands for a clone of the repository: ``clients/`` is there."""
    (workdir / "clients").symlink_to(Path(ROOT) / "clients")


#: A setup: what it adds to the page's environment, if anything.
Setup = Callable[[LeaseStore, Path], dict[str, str] | None]

SETUPS: dict[str, Setup] = {
    "late-run": late_run,
    "tutorial": tutorial,
    "clone": clone,
    "fixture-items": fixture_items,
}
