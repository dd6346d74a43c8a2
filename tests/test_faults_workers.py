"""Faults of the workers and their network, on real RQ worker processes (tests.faults.cluster).

Each test starts a private Redis, a proxy, a provider and ``redis-lease worker``
processes, injects one kind of fault into the workers (SIGSTOP, SIGKILL at a
point of the effect, SIGTERM, connection resets and delays, skewed clocks)
while a run works, and then has the history checker (tests.faults.checker)
judge the recorded history, the provider's log and the final state against the
promise of DESIGN.md section 1. Where the provider does not honour idempotency
keys, only the effect ledger stands between a retry and a second payout.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from redis_lease.demo.provider import ProviderState
from redis_lease.fleet.effects.ledger import idempotency_key
from tests.faults.checker import Violation
from tests.faults.cluster import Cluster, require_faketime
from tests.faults.recorder import Op
from tests.fleet_helpers import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(params=[1, 16], ids=["c1", "c16"])
def concurrency(request: pytest.FixtureRequest) -> int:
    """Handlers each worker runs at once: the faults meet one at a time, and 16."""
    return int(request.param)


def calls(cluster: Cluster, pid: int, name: str, item: str, token: int) -> list[Op]:
    """The recorded ``name`` calls of process ``pid`` for ``item`` under ``token``."""
    return [
        op
        for op in cluster.ops()
        if op.process.endswith(f":{pid}")
        and op.get("f") == name
        and op.get("item") == item
        and op.get("token") == token
    ]


def commits(cluster: Cluster, run_id: str) -> int:
    """Items of the run done so far."""
    return cluster.store.status(run_id).counts["done"]


def scale(concurrency: int) -> int:
    """How many times the items and the provider's latency grow for several handlers per
    worker, so that a run lasts as long and its faults still meet work in flight."""
    return 4 if concurrency > 1 else 1


def keyless(**settings: Any) -> dict[str, Any]:
    """Settings for a provider that applies a repeated key again (no dedupe)."""
    return {"provider": ProviderState(honour_keys=False), "honours_keys": False, **settings}


# -- a holder paused past its lease ------------------------------------------------------


def test_paused_holder_resumes_and_its_late_commit_is_refused(
    tmp_path: Path, prefix: str, concurrency: int
) -> None:
    """SIGSTOP a worker with its effect applied and its commit not sent, past its lease;
    another worker takes the item over and finishes it; SIGCONT: the late commit is refused.

    The provider does not honour keys. Breaks if the late commit is accepted over
    the new holder's (a fence that let an old token through), or if the new holder
    pays again instead of finding the payout applied in the ledger.
    """
    settings = keyless(items=12, ttl=1.5, pause_at=("after_effect",))
    if concurrency > 1:
        # The paused process has other calls on their way; one recorded 'intended' and not
        # yet sent goes out late on SIGCONT, and only a provider honouring keys stops
        # that second payout (README, promise 5): so the provider honours them here.
        settings["provider"] = ProviderState(honour_keys=True)
    with Cluster(tmp_path / "c", prefix, concurrency=concurrency, workers=2, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=lambda: (c.hooks / "after_effect.at").exists())
        index, stopped = c.wait_hook("after_effect")
        item, token = stopped["item"], stopped["token"]
        c.pause(index)
        c.release("after_effect")  # seen only once the process runs again
        assert c.drive(run_id, timeout=60) == "succeeded"
        taken = c.store.item(run_id, item)
        assert taken.state == "done" and taken.token > token

        c.resume(index)
        late = wait_for(
            lambda: [
                op for op in calls(c, stopped["pid"], "commit", item, token) if op.ended_wall_ms
            ],
            30,
            "the resumed worker's commit to end",
        )
        assert [op.type for op in late] == ["fail"], late  # refused: the lease is lost
        after = c.store.item(run_id, item)
        assert (after.state, after.token, after.result) == ("done", taken.token, taken.result)
        assert c.provider.state.requests[idempotency_key(run_id, item, "payout")] == 1
        summary = c.verify(run_id)
        assert summary.takeovers >= 1 and summary.refused_commits >= 1


@pytest.mark.parametrize("keys", ["ignored", "honoured"])
def test_a_holder_paused_before_its_call_sends_late_and_only_keys_stop_it(
    tmp_path: Path, prefix: str, keys: str, concurrency: int
) -> None:
    """The limit of a fence kept in Redis: a request already on its way is not fenced.

    SIGSTOP a worker between its ledger's ``intended`` and its request, past its
    lease; the new holder finds the earlier attempt ambiguous, looks the key up
    (not applied), pays and commits; SIGCONT: the old worker's request goes out
    late. A provider that ignores idempotency keys applies it a second time (the
    checker reports ``duplicate-effect``); one that honours them applies it once
    and the history passes. (The chaos found this with a provider ignoring keys;
    docs/testing.md.) Breaks if the late request were never sent (the pause point
    is not before the call) or if honoured keys did not stop it.
    """
    honoured = keys == "honoured"
    provider = ProviderState(honour_keys=honoured)
    settings = {"provider": provider, "honours_keys": False, "items": 6, "ttl": 1.5}
    with Cluster(
        tmp_path / "c",
        prefix,
        concurrency=concurrency,
        workers=2,
        pause_at=("before_call",),
        **settings,
    ) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=lambda: (c.hooks / "before_call.at").exists())
        index, stopped = c.wait_hook("before_call")
        item, token = stopped["item"], stopped["token"]
        c.pause(index)
        c.release("before_call")  # seen only once the process runs again
        assert c.drive(run_id, timeout=60) == "succeeded"
        assert c.store.item(run_id, item).token > token  # done by the new holder
        key = idempotency_key(run_id, item, "payout")
        assert c.provider.state.requests[key] == 1  # the new holder's payout

        c.resume(index)
        wait_for(lambda: c.provider.state.requests[key] == 2, 30, "the late request")
        assert c.provider.state.applications[key] == (1 if honoured else 2)
        if honoured:
            c.verify(run_id)
        else:
            with pytest.raises(Violation) as seen:
                c.verify(run_id)
            assert seen.value.kinds == {"duplicate-effect"}


# -- a worker killed at each point of its effect ---------------------------------------


def kill_at_hook(c: Cluster, run_id: str, point: str) -> tuple[str, int]:
    """Kills the first worker to reach ``point``; returns its item and token."""
    c.drive(run_id, until=lambda: (c.hooks / f"{point}.at").exists())
    index, stopped = c.wait_hook(point)
    c.kill(index)
    return stopped["item"], stopped["token"]


def kill_during_call(c: Cluster, run_id: str) -> tuple[str, int]:
    """Kills the worker whose request the provider applied and is still holding.

    The held request is the one left in flight, its item still leased, once the
    other calls (of a worker running several handlers) have come back.
    """
    state = c.provider.state
    c.drive(run_id, until=lambda: len(state.applications) >= 1)

    def held() -> str | None:
        keys = [
            key
            for key in list(state.applications)
            if c.store.item(run_id, key.split("|")[1]).state == "leased"
        ]
        return keys[0] if state.in_flight == 1 and len(keys) == 1 else None

    key = wait_for(held, 2.5, "the held request to be the only one in flight")
    item = key.split("|")[1]
    index = c.holder(run_id, item)
    assert index is not None
    token = c.store.item(run_id, item).token
    c.kill(index)
    return item, token


def kill_before_reply(c: Cluster, run_id: str) -> tuple[str, int]:
    """Kills a worker after the server ran its commit and before the reply reached it.

    The worker waits at ``after_effect``; the proxy then holds back every reply to
    the workers 1 s; the worker goes on and commits; once the server shows the
    item done under its token, the worker is killed while the reply is held.
    (Its lease, 6 s renewed every 2 s, outlasts the delayed round trips: the proxy
    delays each chunk in turn, so a worker running 16 handlers, whose pipelines come
    in several chunks, waits up to about 3 s for a reply.)
    """
    c.drive(run_id, until=lambda: (c.hooks / "after_effect.at").exists())
    index, stopped = c.wait_hook("after_effect")
    item, token = stopped["item"], stopped["token"]
    c.delay(1.0, "down")
    c.release("after_effect")

    def committed() -> bool:
        record = c.store.item(run_id, item)
        return record.state == "done" and record.token == token

    wait_for(committed, 60, "the server to run the commit")
    c.kill(index)
    c.delay(0.0)
    (sent,) = calls(c, stopped["pid"], "commit", item, token)
    assert (sent.type, sent.ended_wall_ms) == ("info", None), "the reply never reached it"
    return item, token


@pytest.mark.parametrize(
    "point", ["before_call", "during_call", "after_call", "after_effect", "before_reply"]
)
def test_killed_worker_is_recovered_without_second_effect(
    tmp_path: Path, prefix: str, point: str, concurrency: int
) -> None:
    """SIGKILL a holder before, during or after its provider call, after its ledger says
    applied, or between its commit and the reply; the next holder finishes the item.

    The provider does not honour keys. Breaks if the next holder pays again (the
    ledger or the lookup missed an applied effect), if the item is never finished,
    or if a commit the server ran is redone.
    """
    settings = keyless(items=8, ttl=1.5)
    if point == "during_call":  # applied, and the answer held past the kill
        settings["provider"] = ProviderState(
            honour_keys=False, hold_seconds=3.0, faults={"timeout_after_accept": 1}
        )
    elif point != "before_reply":
        settings["pause_at"] = (point,)
    else:  # one item per batch: its commit is sent as soon as the handler returns
        settings.update(pause_at=("after_effect",), batch_size=1, ttl=6.0)
    with Cluster(tmp_path / "c", prefix, concurrency=concurrency, workers=2, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        if point == "during_call":
            item, token = kill_during_call(c, run_id)
        elif point == "before_reply":
            item, token = kill_before_reply(c, run_id)
        else:
            item, token = kill_at_hook(c, run_id, point)
        assert c.drive(run_id, timeout=60) == "succeeded"
        final = c.store.item(run_id, item)
        if point == "before_reply":
            assert final.token == token, "the commit the server ran stands"
        else:
            assert final.token > token, "the next holder finished it"
        summary = c.verify(run_id)
        events = c.store.status(run_id).counters
        if point in ("during_call", "after_call"):
            assert events["effects_reconciled"] >= 1  # found applied by lookup, not re-sent
        assert summary.effects_applied == c.config.items


# -- the network between the workers and Redis -------------------------------------


def test_connections_reset_again_and_again(tmp_path: Path, prefix: str, concurrency: int) -> None:
    """Every worker connection is reset every 0.2 s while the run works.

    Breaks if a reset loses an item, lets a retried write apply twice (a second
    payout with a provider that does not dedupe) or wedges the run.
    """
    n = scale(concurrency)
    provider = ProviderState(honour_keys=False, latency=0.05 * n)
    settings = keyless(items=60 * n, shards=3, provider=provider)
    with Cluster(tmp_path / "c", prefix, concurrency=concurrency, workers=3, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        last = [time.monotonic()]

        def reset_now_and_then() -> None:
            if time.monotonic() - last[0] >= 0.2:
                c.reset_connections()
                last[0] = time.monotonic()

        assert c.drive(run_id, timeout=90, step=reset_now_and_then) == "succeeded"
        resets = [f for f in c.faults if f[1] == "reset"]
        assert len(resets) >= 4 and c.proxy.resets >= 10, c.faults
        print(f"{len(resets)} resets of {c.proxy.resets} connections; faults {c.faults}")
        c.verify(run_id)


def test_connections_delayed_past_the_lease(tmp_path: Path, prefix: str, concurrency: int) -> None:
    """Every byte between the workers and Redis waits 2.5 s (leases last 1.5 s) for 4 s.

    Replies arrive after the leases they grant or renew have expired on the
    server. Breaks if a write after the expiry is accepted, or the run cannot
    recover once the delay ends.
    """
    n = scale(concurrency)
    provider = ProviderState(honour_keys=False, latency=0.02 * n)
    with Cluster(
        tmp_path / "c",
        prefix,
        concurrency=concurrency,
        workers=2,
        **keyless(items=30 * n, provider=provider, hold_after=8),
    ) as c:
        c.wait_ready()
        run_id = c.start_run()
        # the passes past the 8th wait at the hold until the delay is on: leases are held
        c.drive(run_id, until=c.work_held(run_id, 3))
        c.delay(2.5)
        c.lift_hold()
        until = time.monotonic() + 4.0
        c.drive(run_id, until=lambda: time.monotonic() > until)  # the fault lasts 4 s
        c.delay(0.0)
        assert c.drive(run_id, timeout=60) == "succeeded"
        summary = c.verify(run_id)
        ops = summary.operations
        refused = sum(n for name, n in ops.items() if name.endswith(":fail"))
        assert refused + summary.takeovers >= 1, ops  # leases did run out under the delay
        print(f"refused {refused}, takeovers {summary.takeovers}: {dict(ops)}")


def test_skewed_worker_clocks_change_nothing(tmp_path: Path, prefix: str, concurrency: int) -> None:
    """One worker runs 3 h ahead, one 3 h behind (libfaketime); only the server's clock
    decides: every lease lasts the TTL on it, none is taken over, the run succeeds.

    Breaks if an expiry were computed from a worker's clock (the one behind would
    hand out leases that expire at once, the one ahead leases 3 h long).
    """
    require_faketime()
    provider = ProviderState(latency=0.03)
    # leases of 4 s, renewed every 4/3 s: a loaded machine does not make them lapse
    settings: dict[str, Any] = {"items": 24, "shards": 2, "ttl": 4.0, "provider": provider}
    with Cluster(
        tmp_path / "c",
        prefix,
        concurrency=concurrency,
        workers=2,
        clocks=["+3h", "-3h"],
        **settings,
    ) as c:
        c.wait_ready()
        run_id = c.start_run()
        assert c.drive(run_id, timeout=60) == "succeeded"
        summary = c.verify(run_id)
        assert summary.takeovers == 0
        skews = {}
        for op in c.ops():
            grants = op.get("grants") or []
            for grant in grants:
                assert grant["expires_ms"] - grant["server_ms"] == 4000, grant
            if op.get("server_ms") is not None:
                pid = int(op.process.rsplit(":", 1)[1])
                skew = (op.ended_wall_ms or op.invoked_wall_ms) - int(op.get("server_ms"))
                skews.setdefault(c.index_of(pid), []).append(skew / 3_600_000)
        # each worker really ran on its skewed clock
        assert {i: round(min(s)) for i, s in skews.items()} == {0: 3, 1: -3}, c.describe()


# -- one of six consumers drained --------------------------------------------------


def test_one_of_six_workers_drained_mid_run(tmp_path: Path, prefix: str, concurrency: int) -> None:
    """Six workers on six shards; once a tenth is done, SIGTERM one of the holders.

    It finishes its item and gives the rest back; its shard waits for a free
    worker, so the oldest eligible age rises, then falls to 0 as the others take
    it up. Breaks if a drained item is lost or left leased, or the age is not
    reported.

    The handler passes past the 24th wait at the hold until the drain is under way,
    so the run cannot finish before it on a slow machine, and the drained worker
    still holds claimed items not started.
    """
    n = scale(concurrency)
    provider = ProviderState(latency=0.03 * n)
    settings: dict[str, Any] = {
        "items": 180 * n,
        "shards": 6,
        "batch_size": 60,  # claims sized to the 30 ms handler: a few items wait per worker
        "ttl": 3.0,  # held items' leases are renewed by a keeper a loaded machine may slow
        "provider": provider,
        "hold_after": 24,
    }
    with Cluster(tmp_path / "c", prefix, concurrency=concurrency, workers=6, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        ages: list[tuple[float, float]] = []
        drained: list[int] = []

        # a tenth paid and a handler at the hold (a tenth done could wait forever: a worker
        # may keep its paid items' commits for its next settlement, behind the hold)
        def ready() -> bool:
            paid = c.store.status(run_id).counters.get("effects_applied", 0)
            return paid >= 18 and c.held() >= 1

        def released() -> bool:
            return c.store.status(run_id).counters.get("releases", 0) >= 1

        def sample() -> None:
            status = c.store.status(run_id)
            ages.append((time.monotonic(), status.oldest_eligible_age_seconds))
            if drained or not ready():
                return
            held = Counter(c.holder(run_id, r.item_id) for r in leased(c, run_id))
            held.pop(None, None)
            # the holder of the most leases; more than it runs at once: some not started
            index, count = held.most_common(1)[0] if held else (None, 0)
            if index is None or count <= concurrency:
                return
            c.terminate(index)
            drained.append(index)
            ages.append((time.monotonic(), -1.0))  # the drain, in the samples
            if concurrency > 1:
                # its loop gives the waiting items back while its handlers are held; one
                # handler runs inline (c1) and sees the stop once the hold lets it go on
                wait_for(released, 90, "the drained worker to give its items back")
            c.lift_hold()

        assert c.drive(run_id, timeout=90, step=sample) == "succeeded"
        assert drained, "no worker was drained"
        process = c.workers[drained[0]].process
        assert process.wait(timeout=30) == 0, "the drained worker exits cleanly"
        c.verify(run_id)
        status = c.store.status(run_id)
        # the drained batch went back at once
        assert status.counters.get("releases", 0) >= 1, (status.counters, c.faults)
        shown = [round(age, 2) for _, age in ages]
        print("oldest eligible age (-1: the drain):", shown)
        drain_at = shown.index(-1.0)
        after = shown[drain_at + 1 :]
        peak = max(after)
        # the drained batch waits from its release: the age rises from the first sample
        # after the drain, then falls to 0 when another worker takes the shard
        assert peak >= max(0.2, after[0] + 0.1), shown
        assert after.index(peak) < len(after) - 1 and after[-1] == 0.0, shown
        assert status.oldest_eligible_age_seconds == 0.0


def leased(c: Cluster, run_id: str) -> list[Any]:
    """The run's leased item records."""
    found = []
    for shard in range(c.config.shards):
        found += [r for r in c.store.items(run_id, shard) if r.state == "leased"]
    return found
