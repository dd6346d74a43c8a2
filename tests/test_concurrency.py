"""Many OS processes race for the items of one run; the merged history must hold.

Eight spawned processes claim a 2,000-item, 4-shard run in batches and commit
each lease. Two of them are "sleepy": now and then they take a batch on a short
TTL, commit half of it, wait on the server clock until the rest has expired and
commit that too, so stale commits and takeovers really happen. Every claim and
script call is recorded (tests/faults/recorder.py) into a per-process history;
tests/faults/checker.py checks the merged histories and the final records, and
the shard counters are compared with the history and a scan of the items.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from redis_lease import LeaseStore
from redis_lease.errors import LeaseLost
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.protocol.leases import COUNT_STATES, Item
from tests.faults import recorder
from tests.faults.checker import check
from tests.faults.evidence import collect

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
    """One process: claim batches and commit them until the run has no unfinished item.

    Its script calls are recorded into the directory ``out``.
    """
    recorder.install(out, name)
    store = LeaseStore.from_url(url, prefix=prefix)
    rng = random.Random(seed)
    go.wait(60)  # a barrier: every process has started and imported before any claims
    first = True
    deadline = time.monotonic() + 60

    def commit(lease: Any) -> None:
        with contextlib.suppress(LeaseLost):  # the refusal is in the history
            store.commit(lease, result={"worker": name, "token": lease.token})

    while time.monotonic() < deadline:
        short = sleepy and (first or rng.random() < 0.3)
        first = False
        ttl = SHORT_TTL if short else TTL
        leases = store.claim_next(RUN, name, limit=BATCH, ttl=ttl)
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
    procs = [
        ctx.Process(
            target=worker,
            args=(redis_url, prefix, f"w{n}", str(tmp_path), go, n < SLEEPY, 1000 + n),
        )
        for n in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    go.wait(60)
    for proc in procs:
        proc.join(timeout=120)
    assert [proc.exitcode for proc in procs] == [0] * PROCESSES

    # every item done: the run may close, and the whole history must hold
    Runs(store).finalize(RUN, "every item is done")
    evidence = collect(store, RUN, ids, history_dir=tmp_path, applied={}, marked=False)
    summary = check(evidence)
    assert summary.accepted_commits == ITEMS
    assert summary.unknown_outcomes == 0  # every reply arrived, so no token is missing:
    assert all(summary.max_token[i] == summary.grants_per_item[i] for i in ids)
    # the faults happened: stale commits were refused and expired leases taken over
    assert summary.refused_commits > 0
    assert summary.takeovers > 0
    assert sum(n > 1 for n in summary.grants_per_item.values()) > 0

    status = store.status(RUN)
    scanned = Counter(rec.state for shard in range(SHARDS) for rec in store.items(RUN, shard))
    assert status.counts == {state: scanned.get(state, 0) for state in COUNT_STATES}
    assert status.counts == {"pending": 0, "leased": 0, "done": ITEMS, "dead": 0}
    assert status.counters["claims"] == summary.grants
    assert status.counters["commits"] == summary.accepted_commits
    assert status.counters["takeovers"] == summary.takeovers
    assert status.counters["stale_refused"] == summary.refused_commits

    winners = {
        op.get("item"): (op.process.split(":")[0], op.get("token"))
        for op in evidence.ops
        if op.get("f") == "commit" and op.type == "ok" and not op.get("repeated")
    }
    for shard in range(SHARDS):
        for rec in store.items(RUN, shard):
            worker_name, token = winners[rec.item_id]
            assert rec.token == summary.max_token[rec.item_id] == token
            assert rec.result == {"worker": worker_name, "token": token}
