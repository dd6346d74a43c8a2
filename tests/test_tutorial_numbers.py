"""The tutorial's numbers hold at a reader's pace, not only at the suite's.

tests/test_snippets.py runs docs/tutorial.md with a bank ten times faster than a
reader's, so it cannot see a step that only fails at the reader's pace. These tests take
the numbers from the tutorial itself (its ``jobs.py``, its blocks, its prose) and check
them against what the code does: step 7's ``wait --timeout`` covers what is left after
the kill at a second a payout, the leases a worker holds are the ones step 4 names, and
the first run a tick creates, at any hour, is the one step 2's table names.
"""

from __future__ import annotations

import copy
import importlib
import math
import re
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from redis_lease import ActiveLease, Item, Job, LeaseStore
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.fleet.worker import shard_loop
from redis_lease.fleet.worker.lease_keeper import LeaseKeeper
from redis_lease.limits import DEAD_AFTER, HEARTBEAT, TICK_EVERY, TICK_TAKEOVER_BOUND
from redis_lease.protocol.leases import from_ms
from tests.redis_server import RedisServer
from tests.snippets.parse import Page, read_page

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = "docs/tutorial.md"
#: How much longer than the slowest end of the run step 7's timeout must be.
MARGIN = 1.2


def page() -> Page:
    """The tutorial, as the snippet runner reads it."""
    return read_page(ROOT, TUTORIAL)


def prose() -> str:
    """The tutorial's text, its line breaks as spaces (a phrase may span two lines)."""
    return " ".join((ROOT / TUTORIAL).read_text().split())


@pytest.fixture
def tutorial_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The tutorial's ``jobs.py``, imported as ``tutorial_jobs`` at a reader's pace (no
    ``BANK_SECONDS`` given), in a directory of its own (its bank's file goes there)."""
    code = next(s.code for s in page().snippets if s.file == "jobs.py")
    (tmp_path / "tutorial_jobs.py").write_text(code)
    monkeypatch.delenv("BANK_SECONDS", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("tutorial_jobs", None)
    yield importlib.import_module("tutorial_jobs")
    sys.modules.pop("tutorial_jobs", None)


def test_step_7s_timeout_covers_the_rest_of_the_run_at_a_readers_pace(
    tutorial_jobs: ModuleType,
) -> None:
    """Killed at once (step 6 may come as soon as both workers work), one worker pays
    every item at the reader's second a payout, after the takeover; and should the last
    shard job not end the run, a new tick leader and its next tick do."""
    job: Job = tutorial_jobs.nightly
    items = len(list(tutorial_jobs.plan(date(2026, 12, 6))))
    payout = tutorial_jobs.BANK_SECONDS
    workers = [s for s in page().snippets if s.background and "redis-lease worker" in s.code]
    waits = [s for s in page().snippets if "redis-lease wait" in s.code]
    assert len(workers) == 2 and len(waits) == 1, "the tutorial's steps changed: see this test"
    timeout = re.search(r"--timeout (\d+)", waits[0].code)
    assert timeout is not None, "step 7 waits with --timeout"
    survivor_slots = (len(workers) - 1) * job.options.concurrency
    work = items * payout / survivor_slots
    slowest = work + DEAD_AFTER + HEARTBEAT + TICK_TAKEOVER_BOUND + TICK_EVERY
    assert (items, payout, survivor_slots) == (400, 1.0, 1), "the numbers step 7's prose gives"
    assert int(timeout[1]) >= MARGIN * slowest, (
        f"step 7 waits {timeout[1]} s; after a kill at once the run may take {slowest:.0f} s "
        f"({items} items x {payout} s on {survivor_slots} slot, the takeover, a new leader, "
        f"the next tick): give at least {math.ceil(MARGIN * slowest)} s"
    )


def test_a_worker_holds_the_leases_step_4_names(
    tutorial_jobs: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    private_redis: Callable[..., RedisServer],
    prefix: str,
) -> None:
    """The tutorial's job on the real shard loop: the leases held while the first item is
    paid, and once the first claim is worked off. A quarter-second payout claims as a
    second-long one does (one item a claim), in a quarter of the time."""
    store = LeaseStore.from_url(private_redis().url, prefix=prefix)
    monkeypatch.setattr(tutorial_jobs, "BANK_SECONDS", 0.25)
    assert math.ceil(shard_loop.CLAIM_SPAN / 0.25) == math.ceil(shard_loop.CLAIM_SPAN / 1.0)
    job: Job = tutorial_jobs.nightly
    runs = Runs(store)
    now = runs.server_now()
    run_id, _ = runs.ensure(job, date(2026, 12, 6), now, deadline=now + timedelta(hours=1))
    runs.plan(job, run_id)
    first = int(_phrase(r"first claim takes (\d+) items"))
    later = int(_phrase(r"from about \d+ seconds on stays at (\d+)"))
    held: list[int] = []
    stop = threading.Event()
    handle = job.handle_item
    assert handle is not None

    def counting(item: Item, lease: ActiveLease) -> Any:
        held.append(store.status(run_id).counts["leased"])
        if len(held) == first + 3:
            stop.set()  # a few items past the first claim: enough seen
        return handle(item, lease)

    watched = copy.copy(job)
    watched.handle_item = counting
    keeper = LeaseKeeper(store, job.options.lease_ttl_seconds)  # not started: no renewal needed
    shard_loop.work_shard(
        store, watched, run_id, 0, worker="w1", budget=60, stop=stop, keeper=keeper
    )
    assert held[0] == first, held
    assert held[first + 1 :] == [later] * (len(held) - first - 1), held


def test_the_first_run_of_any_hour_is_the_one_step_2s_table_names(
    tutorial_jobs: ModuleType, private_redis: Callable[..., RedisServer], prefix: str
) -> None:
    """A tick of the new job at each hour of a day (and around 06:00 UTC), on a server
    with no record of it: the run it creates, its decision and its deadline."""
    rows = _first_run_table()
    url = private_redis().url
    day = date(2026, 12, 6)
    moments = [datetime(2026, 12, 6, hour, 30, tzinfo=UTC) for hour in range(24)]
    moments += [datetime(2026, 12, 6, 5, 59, tzinfo=UTC), datetime(2026, 12, 6, 6, tzinfo=UTC)]
    for number, now in enumerate(moments):
        store = LeaseStore.from_url(url, prefix=f"{prefix}-{number}")  # a new job each time
        made = list(tick(store, ["tutorial_jobs:nightly"], now=now))
        created = [d for d in made if d.kind in ("create", "catch_up")]
        assert len(created) == 1, (now, made)
        row = rows[0] if now.time() < rows[1][0] else rows[1]
        deadline = from_ms(int(Runs(store).info(created[0].run_id)["deadline_at"]))
        assert created[0].run_id == f"nightly:{day}", now
        assert created[0].kind == row[1], now
        assert deadline == row[2](now), now


def _phrase(pattern: str) -> str:
    """The first group of ``pattern`` in the tutorial's prose (it must say so)."""
    found = re.search(pattern, prose())
    assert found is not None, f"the tutorial no longer says {pattern!r}"
    return found[1]


Row = tuple[time, str, Callable[[datetime], datetime]]


def _first_run_table() -> list[Row]:
    """Step 2's table: from when (UTC), the decision, and the deadline it names."""
    text = prose()
    before = re.search(
        r"\| before (\d\d):(\d\d) \| today's, on time \| `(\w+)` \| (\d\d):(\d\d) UTC today \|",
        text,
    )
    after = re.search(
        r"\| from (\d\d):(\d\d) \| today's, caught up \| `(\w+)` \| six hours after the tick \|",
        text,
    )
    assert before is not None and after is not None, "step 2's first-run table changed"
    assert before.group(1, 2) == after.group(1, 2)
    switch = time(int(before[1]), int(before[2]))
    due = (int(before[4]), int(before[5]))
    return [
        (switch, before[3], lambda now: now.replace(hour=due[0], minute=due[1])),
        (switch, after[3], lambda now: now + timedelta(hours=6)),
    ]
