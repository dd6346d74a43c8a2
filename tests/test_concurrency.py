"""Many OS processes race for the items of one run; the merged history must hold.

Eight spawned processes claim a 2,000-item, 4-shard run in batches and commit
each lease. Two of them are "sleepy": now and then they take a batch on a short
TTL, commit half of it, wait on the server clock until the rest has expired and
commit that too, so stale commits and takeovers really happen. Every claim and
commit outcome goes to a per-process JSON-lines file; tests/history.py checks
the merged log, and the shard counters are compared with a scan of the items.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from redis_lease import LeaseStore
from redis_lease.errors import LeaseLost
from redis_lease.lease import COUNT_STATES, Item
from tests import history
from tests.history import Event

pytestmark = pytest.mark.slow

PROCESSES = 8
SLEEPY = 2
ITEMS = 2000
SHARDS = 4
BATCH = 10
TTL = 10.0
SHORT_TTL = 0.05
RUN = "concurrency:2026-01-01"


def server_ms(store: LeaseStore) -> int:
    """The server clock in milliseconds, as the scripts read it."""
    seconds, micros = store.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def worker(url: str, prefix: str, name: str, out: str, go: Any, sleepy: bool, seed: int) -> None:
    """One process: claim batches and commit them until the run has no unfinished item."""
    store = LeaseStore.from_url(url, prefix=prefix)
    rng = random.Random(seed)
    go.wait(60)  # a barrier: every process has started and imported before any claims
    first = True
    deadline = time.monotonic() + 60
    with open(out, "w") as log:

        def commit(lease: Any) -> None:
            try:
                outcome = store.commit(lease, result={"worker": name, "token": lease.token})
            except LeaseLost:
                log.write(Event.lost(lease).to_json() + "\n")
            else:
                log.write(Event.committed(lease, outcome).to_json() + "\n")

        while time.monotonic() < deadline:
            short = sleepy and (first or rng.random() < 0.3)
            first = False
            ttl = SHORT_TTL if short else TTL
            leases = store.claim_next(RUN, name, limit=BATCH, ttl=ttl)
            for lease in leases:
                log.write(Event.claimed(lease, round(ttl * 1000)).to_json() + "\n")
            if not leases:
                if store.status(RUN).unfinished == 0:
                    return
                time.sleep(0.005)  # others hold the rest; poll again
                continue
            keep = len(leases) // 2 if short else len(leases)
            for lease in leases[:keep]:
                commit(lease)
            if short:
                # the fault: stall past the TTL (server clock) before committing the rest
                expiry = max(lease.expires_at_ms for lease in leases)
                while server_ms(store) < expiry:
                    time.sleep(0.005)
                for lease in leases[keep:]:
                    commit(lease)
    raise RuntimeError(f"{name} ran out of time")


def test_processes_commit_every_item_exactly_once(
    redis_url: str, prefix: str, real_store: LeaseStore, tmp_path: Path
) -> None:
    store = real_store
    ids = [f"acct_{n}:cursor_{n % 7}" for n in range(ITEMS)]
    added, _ = store.add(
        RUN, [Item(i, {"n": n}) for n, i in enumerate(ids)], shards=SHARDS, max_attempts=1000
    )
    assert len(added) == ITEMS

    ctx = multiprocessing.get_context("spawn")
    go = ctx.Barrier(PROCESSES + 1)
    files = [tmp_path / f"worker-{n}.jsonl" for n in range(PROCESSES)]
    procs = [
        ctx.Process(
            target=worker,
            args=(redis_url, prefix, f"w{n}", str(files[n]), go, n < SLEEPY, 1000 + n),
        )
        for n in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    go.wait(60)
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES

    events = history.read(files)
    summary = history.check(events, items=ids, contiguous=True)
    assert summary.accepted == ITEMS
    # the faults happened: stale commits were refused and expired leases taken over
    assert summary.lost > 0
    assert summary.takeovers > 0
    assert summary.reclaimed_items > 0

    status = store.status(RUN)
    scanned = Counter(rec.state for shard in range(SHARDS) for rec in store.items(RUN, shard))
    assert status.counts == {state: scanned.get(state, 0) for state in COUNT_STATES}
    assert status.counts == {"pending": 0, "leased": 0, "done": ITEMS, "dead": 0}
    assert status.events["claims"] == summary.claims
    assert status.events["commits"] == summary.accepted
    assert status.events["takeovers"] == summary.takeovers
    assert status.events["stale_refused"] == summary.lost

    winners = {e.item: e for e in events if e.kind == history.COMMIT}
    for shard in range(SHARDS):
        for rec in store.items(RUN, shard):
            win = winners[rec.item_id]
            assert rec.token == summary.max_token[rec.item_id] == win.token
            assert rec.result == {"worker": win.worker, "token": win.token}


def test_history_checker_reports_each_violation() -> None:
    def claim(item: str, token: int, at: int, worker: str = "w") -> Event:
        return Event(history.CLAIM, item, token, worker, at_ms=at, expires_ms=at + 100)

    def commit(item: str, token: int, at: int) -> Event:
        return Event(history.COMMIT, item, token, "w", at_ms=at)

    good = [claim("a", 1, 0), claim("a", 2, 200), Event(history.LOST, "a", 1), commit("a", 2, 250)]
    assert history.check(good, items=["a"], contiguous=True).accepted == 1
    cases = {
        "handed out twice": [claim("a", 1, 0, "x"), claim("a", 1, 5, "y")],
        "tokens went back": [claim("a", 1, 50), claim("a", 2, 10)],
        "2 accepted commits": [claim("a", 1, 0), commit("a", 1, 5), commit("a", 1, 6)],
        "a stale commit won": [claim("a", 1, 0), claim("a", 2, 200), commit("a", 1, 50)],
        "outside its lease": [claim("a", 1, 0), commit("a", 1, 100)],
        "never granted": [commit("a", 3, 5)],
        "both accepted and refused": [
            claim("a", 1, 0),
            commit("a", 1, 5),
            Event(history.LOST, "a", 1),
        ],
        "no accepted commit": [claim("a", 1, 0)],
        "are not 1..": [claim("a", 2, 0), commit("a", 2, 5)],
    }
    for message, events in cases.items():
        with pytest.raises(history.HistoryViolation, match=message):
            history.check(events, items=["a"], contiguous=True)
