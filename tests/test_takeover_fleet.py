"""A worker that dies holding work is taken over within seconds; one that is slow is not.

Real ``redis-lease worker`` processes (tests.faults.cluster: a private Redis, a proxy,
a provider that ignores idempotency keys, the history checker), leases at the default
length (60 s), so that only the heartbeat can explain a quick takeover:

- a SIGKILLed holder's leases are ended within 10 s of the kill by the other worker's
  watch, with no tick run meanwhile, and its items are claimed and paid once;
  ``redis-lease workers --json`` shows it dead with what was taken over from it;
- a SIGSTOPped holder is taken over, and when it wakes it stops before any call (its
  heartbeat lapsed), its leases counted lost in its shard job's line;
- a holder whose handler takes three times the heartbeat's life, alive, is never
  taken over, by the watch or by the tick.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from redis_lease.cli import app
from redis_lease.demo.provider import ProviderState
from redis_lease.fleet.effects.ledger import idempotency_key
from redis_lease.fleet.jobs.job import JobOptions
from redis_lease.fleet.transport.takeover import takeovers
from redis_lease.limits import DEAD_AFTER
from tests.effect_jobs import notes
from tests.faults.cluster import Cluster
from tests.fleet_helpers import wait_for

pytestmark = pytest.mark.slow

#: The default lease length: far longer than any takeover these tests wait for.
DEFAULT_TTL = JobOptions().lease_ttl_seconds
#: The most a SIGKILLed holder's items may stay out of work (the issue's bound).
TAKEOVER_BOUND_MS = 10_000


def keyless(**settings: Any) -> dict[str, Any]:
    """A provider that applies a repeated key again: only the fence stops a second payout."""
    return {"provider": ProviderState(honour_keys=False), "honours_keys": False, **settings}


def server_ms(c: Cluster) -> int:
    seconds, micros = c.store.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def tokens_held_by(c: Cluster, run_id: str, pid: int) -> dict[str, int]:
    """The items leased by process ``pid`` (owner ``host:pid:job``), with their tokens."""
    return {
        record.item_id: record.token
        for shard in range(c.config.shards)
        for record in c.store.items(run_id, shard)
        if record.state == "leased" and (record.owner or "").split(":")[-2:-1] == [str(pid)]
    }


@pytest.mark.parametrize("concurrency", [1, 16], ids=["c1", "c16"])
def test_a_killed_holders_items_are_taken_over_within_10_s_and_paid_once(
    tmp_path: Path, prefix: str, concurrency: int
) -> None:
    items = 8 if concurrency == 1 else 32
    settings = keyless(items=items, ttl=DEFAULT_TTL, pause_at=("before_call",))
    with Cluster(tmp_path / "c", prefix, concurrency=concurrency, workers=2, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=lambda: (c.hooks / "before_call.at").exists())
        index, stopped = c.wait_hook("before_call")
        killed_ms = server_ms(c)
        c.kill(index)
        held = tokens_held_by(c, run_id, stopped["pid"])  # what it held when it died
        assert stopped["item"] in held

        # No tick from here on: the other worker's watch alone takes the job over.
        def claimed_again() -> bool:
            now = {r.item_id: r for s in range(c.config.shards) for r in c.store.items(run_id, s)}
            return all(now[item].token > token for item, token in held.items())

        wait_for(claimed_again, 60, "the killed holder's items to be claimed again")
        (taken,) = [t for t in takeovers(c.store) if t["pid"] == stopped["pid"]]
        assert taken["leases"] == len(held)
        assert taken["at_ms"] - killed_ms <= TAKEOVER_BOUND_MS, c.describe()

        assert c.drive(run_id, timeout=90) == "succeeded"
        summary = c.verify(run_id)  # fenced, every item done, each payout applied once
        assert summary.effects_applied == items
        assert summary.takeovers >= len(held)
        shown = CliRunner().invoke(
            app, ["--url", c.server.url, "--prefix", prefix, "workers", "--json"]
        )
        assert shown.exit_code == 0, shown.output
        rows = json.loads(shown.stdout)
        (dead,) = [row for row in rows if row["pid"] == stopped["pid"]]
        assert dead["state"] == "dead" and dead["leases_taken_over"] == len(held)
        assert [t["run"] for t in dead["taken_over"]] == [run_id]
        assert any(row["state"] == "alive" and row["host"] for row in rows)


def test_a_paused_holder_is_taken_over_and_stops_before_any_call_when_it_wakes(
    tmp_path: Path, prefix: str
) -> None:
    settings = keyless(items=6, ttl=DEFAULT_TTL, pause_at=("before_effect",))
    with Cluster(tmp_path / "c", prefix, workers=2, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=lambda: (c.hooks / "before_effect.at").exists())
        index, stopped = c.wait_hook("before_effect")
        c.pause(index)
        c.release("before_effect")  # seen only once the process runs again
        assert c.drive(run_id, timeout=90) == "succeeded"
        assert [t["pid"] for t in takeovers(c.store)] == [stopped["pid"]]

        c.resume(index)
        wait_for(
            lambda: [n for n in notes(c.hooks, "lease_lost") if n["pid"] == stopped["pid"]],
            30,
            "the woken holder to stop on its lost lease",
        )
        key = idempotency_key(run_id, stopped["item"], "payout")
        assert c.provider.state.requests[key] == 1  # the woken holder sent nothing
        c.verify(run_id)
        log = c.workers[index].log
        wait_for(
            lambda: "leases lost to other workers" in log.read_text(errors="replace"),
            30,
            "the woken worker's shard job line",
        )


def test_a_slow_but_alive_holder_is_never_taken_over(tmp_path: Path, prefix: str) -> None:
    settings = keyless(items=4, ttl=DEFAULT_TTL, pause_at=("before_call",))
    with Cluster(tmp_path / "c", prefix, workers=2, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=lambda: (c.hooks / "before_call.at").exists())
        _index, stopped = c.wait_hook("before_call")
        item, token = stopped["item"], stopped["token"]
        # The holder's handler waits (alive, its keeper beating) three heartbeat lives,
        # while the tick runs and the other worker's watch looks.
        until = time.monotonic() + 3 * DEAD_AFTER
        c.drive(run_id, until=lambda: time.monotonic() > until)
        assert takeovers(c.store) == []
        record = c.store.item(run_id, item)
        assert (record.state, record.token) == ("leased", token)

        c.release("before_call")
        assert c.drive(run_id, timeout=60) == "succeeded"
        assert c.store.item(run_id, item).token == token  # its first holder finished it
        c.verify(run_id)
