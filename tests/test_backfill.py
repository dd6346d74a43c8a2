"""Backfill a range of business dates, and pause and resume a job's schedule.

Backfill creates the runs of the scheduled dates in a range (``all``) or of the
newest (``latest``), idempotently; bad input writes nothing. A paused schedule
creates no run (the tick says so), records who paused it and when, and ``schedule
show`` says it; after resuming, the next scheduled date gets its run again, and the
dates skipped while paused are left to backfill.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from redis_lease import LeaseStore
from redis_lease.errors import InvalidInput
from redis_lease.fleet.runs.lifecycle import Runs, to_ms
from redis_lease.fleet.tick.backfill import backfill, backfill_dates
from redis_lease.fleet.tick.schedule import pause, pause_state, pause_states, resume
from redis_lease.fleet.tick.scheduler_tick import tick
from tests.fleet_helpers import NIGHTLY_PATH, Configure, configure_nightly
from tests.helpers import snapshot
from tests.test_fleet_frictions import cli, write_module

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.fixture
def nightly(real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[Configure]:
    """The nightly job (02:00 UTC daily, catch-up all) on an RQ queue of this test's own."""
    yield from configure_nightly(real_store, monkeypatch, items=2)


def test_backfill_all_creates_each_scheduled_date_once(
    real_store: LeaseStore, nightly: Configure
) -> None:
    job = nightly()
    decisions = backfill(real_store, job, date(2026, 3, 1), date(2026, 3, 5), "all", now=NOW)
    wanted = [f"nightly:2026-03-0{n}" for n in range(1, 6)]
    assert [d.run_id for d in decisions] == wanted
    assert all(d.kind == "backfill" for d in decisions)
    assert decisions[0].reason == (
        "backfilled (policy all, 2026-03-01 to 2026-03-05); scheduled for 2026-03-01T02:00:00+00:00"
    )
    assert sorted(real_store.run_ids()) == wanted
    runs = Runs(real_store)
    for run_id in wanted:
        info = runs.info(run_id)
        assert info["business_date"] == run_id.split(":")[1]
        # The full six-hour window, counted from now: the run is not born past its deadline.
        assert int(info["deadline_at"]) == to_ms(NOW + timedelta(hours=6))
        assert [e["kind"] for e in runs.decisions(run_id)][-1] == "backfill"
    # Twice: nothing new; overlapping: only the new dates.
    assert backfill(real_store, job, date(2026, 3, 1), date(2026, 3, 5), "all", now=NOW) == []
    more = backfill(real_store, job, date(2026, 3, 4), date(2026, 3, 7), "all", now=NOW)
    assert [d.run_id for d in more] == ["nightly:2026-03-06", "nightly:2026-03-07"]
    # The next tick plans and dispatches them all (the tick's own catch-up adds nothing).
    ticked = tick(real_store, [NIGHTLY_PATH], now=NOW + timedelta(minutes=1))
    assert sorted(d.run_id for d in ticked if d.kind == "plan") == sorted(real_store.run_ids())
    assert [d for d in ticked if d.kind in ("create", "catch_up")] == []


def test_backfill_latest_creates_only_the_newest_date(
    real_store: LeaseStore, nightly: Configure
) -> None:
    job = nightly()
    made = backfill(real_store, job, date(2026, 4, 1), date(2026, 4, 3), "latest", now=NOW)
    assert [d.run_id for d in made] == ["nightly:2026-04-03"]
    assert real_store.run_ids() == ["nightly:2026-04-03"]
    assert backfill(real_store, job, date(2026, 4, 1), date(2026, 4, 3), "latest", now=NOW) == []


def test_backfill_takes_only_the_dates_the_schedule_fires_on(
    real_store: LeaseStore, nightly: Configure
) -> None:
    job = nightly(schedule="0 2 * * 1-5")  # weekdays
    dates = backfill_dates(job, date(2026, 3, 2), date(2026, 3, 8))  # Monday to Sunday
    assert dates == [date(2026, 3, n) for n in range(2, 7)]
    made = backfill(real_store, job, date(2026, 3, 2), date(2026, 3, 8), now=NOW)
    assert len(made) == 5


def test_backfill_refuses_bad_ranges_and_writes_nothing(
    real_store: LeaseStore, redis_url: str, nightly: Configure, tmp_path: Path
) -> None:
    job = nightly()
    before = snapshot(real_store.client, real_store.prefix)
    with pytest.raises(InvalidInput, match="before --from"):
        backfill(real_store, job, date(2026, 3, 5), date(2026, 3, 1), now=NOW)
    with pytest.raises(InvalidInput, match="at most 366 days"):
        backfill(real_store, job, date(2025, 1, 1), date(2026, 3, 1), now=NOW)
    with pytest.raises(InvalidInput, match="unknown policy"):
        backfill(real_store, job, date(2026, 3, 1), date(2026, 3, 2), "none", now=NOW)
    root = str(Path(__file__).resolve().parent.parent)
    for args, message in [
        (["--from", "2026-03-05", "--to", "2026-03-01"], "--to 2026-03-01 is before --from"),
        (["--from", "2026-03-01", "--to", "2026-3-5x"], "invalid --to '2026-3-5x'"),
        (["--from", "20260301", "--to", "2026-03-05"], "invalid --from '20260301': use YYYY-MM-DD"),
        (["--from", "2026-03-01", "--to", "2026-03-02", "--policy", "none"], "unknown --policy"),
    ]:
        done = cli(redis_url, real_store.prefix, "backfill", NIGHTLY_PATH, *args, cwd=Path(root))
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], done.stderr
    assert snapshot(real_store.client, real_store.prefix) == before


def test_backfill_command_creates_plans_and_is_idempotent(
    real_store: LeaseStore, redis_url: str, queue_name: str, tmp_path: Path
) -> None:
    name = f"{real_store.prefix}-bf"
    path = write_module(tmp_path, name, queue_name, handler=True)
    args = ["backfill", path, "--from", "2026-01-10", "--to", "2026-01-12"]
    done = cli(redis_url, real_store.prefix, *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # The fixture's job fires only on 29 February: none of these dates is scheduled.
    assert done.stdout.startswith(f"0 runs created ({name}, 2026-01-10 to 2026-01-12")
    leap = ["backfill", path, "--from", "2024-02-01", "--to", "2024-03-31", "--json"]
    first = cli(redis_url, real_store.prefix, *leap, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)
    assert data["created"] == [f"{name}:2024-02-29"]
    kinds = [d["kind"] for d in data["decisions"]]
    assert kinds[:3] == ["backfill", "plan", "dispatch"]
    again = json.loads(cli(redis_url, real_store.prefix, *leap, cwd=tmp_path).stdout)
    assert again["created"] == []
    assert real_store.run_ids() == [f"{name}:2024-02-29"]
    assert real_store.status(f"{name}:2024-02-29").total == 6


def test_pause_stops_new_runs_and_resume_restarts_them(
    real_store: LeaseStore, redis_url: str, nightly: Configure
) -> None:
    job = nightly(catch_up="all")
    day = datetime(2026, 3, 10, 2, 0, 30, tzinfo=UTC)
    first = tick(real_store, [NIGHTLY_PATH], now=day)
    assert "create" in [d.kind for d in first]
    paused = pause(real_store, "nightly", by="alice")
    assert paused.by == "alice" and paused.at_ms > 0
    assert pause_state(real_store, "nightly") == paused
    assert pause(real_store, "nightly", by="bob") == paused  # the first record stays
    assert pause_states(real_store, ["nightly", "other"]) == {"nightly": paused}
    assert paused.describe().startswith("paused by alice at ")

    # Two scheduled times pass while paused: no run, and the tick says why.
    skipped = tick(real_store, [NIGHTLY_PATH], now=day + timedelta(days=1))
    assert [d.kind for d in skipped if d.run_id == "nightly"] == ["paused"]
    note = next(d for d in skipped if d.kind == "paused").reason
    assert note.startswith("schedule paused by alice: no run created for 2026-03-11")
    tick(real_store, [NIGHTLY_PATH], now=day + timedelta(days=2))
    assert real_store.run_ids() == ["nightly:2026-03-10"]
    # The run made before the pause goes on: it was ticked, not stopped.
    assert Runs(real_store).info("nightly:2026-03-10")["state"] in ("running", "partial", "failed")

    ended = resume(real_store, "nightly")
    assert ended == paused
    assert pause_state(real_store, "nightly") is None
    after_day = day + timedelta(days=3)
    after = tick(real_store, [NIGHTLY_PATH], now=after_day)
    created = [d.run_id for d in after if d.kind in ("create", "catch_up")]
    assert created == ["nightly:2026-03-13"]  # not the dates skipped while paused
    record = real_store.client.hget(real_store.keys.job("nightly"), "last_catch_up")
    assert record is not None and b"while paused by alice" in record
    made = backfill(real_store, job, date(2026, 3, 11), date(2026, 3, 12), now=after_day)
    assert [d.run_id for d in made] == ["nightly:2026-03-11", "nightly:2026-03-12"]


def test_schedule_commands_pause_show_and_resume(
    real_store: LeaseStore, redis_url: str, nightly: Configure
) -> None:
    root = Path(__file__).resolve().parent.parent
    prefix = real_store.prefix
    unknown = cli(redis_url, prefix, "schedule", "pause", "nightly", cwd=root)
    assert unknown.returncode == 5  # no tick has seen a job of that name: give its path
    assert len(unknown.stderr.strip().splitlines()) == 1
    paused = cli(redis_url, prefix, "schedule", "pause", NIGHTLY_PATH, cwd=root)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith(f"nightly: paused by {getpass.getuser()} at ")
    by_name = cli(redis_url, prefix, "schedule", "pause", "nightly", "--by", "carol", cwd=root)
    assert by_name.returncode == 0  # known by name now; the first pause is kept
    assert f"paused by {getpass.getuser()}" in by_name.stdout

    shown = cli(redis_url, prefix, "schedule", "show", NIGHTLY_PATH, cwd=root)
    assert shown.returncode == 0, shown.stderr
    head = shown.stdout.splitlines()[0]
    assert head.startswith("nightly: 0 2 * * * in UTC; next ")
    assert " UTC (+00:00); paused by " in head and head.endswith("(no new runs)")
    rows = json.loads(
        cli(redis_url, prefix, "schedule", "show", NIGHTLY_PATH, "--json", cwd=root).stdout
    )
    assert rows == []  # nothing installed: the entries, none
    installed = cli(redis_url, prefix, "schedule", "install", NIGHTLY_PATH, "--json", cwd=root)
    try:
        assert installed.returncode == 0, installed.stderr
        made = json.loads(installed.stdout)
        assert made["job"] == "nightly" and len(made["installed"]) == 2
        shown_json = cli(redis_url, prefix, "schedule", "show", NIGHTLY_PATH, "--json", cwd=root)
        rows = json.loads(shown_json.stdout)
        assert sorted(r["id"] for r in rows) == sorted(made["installed"])
        assert {r["paused"]["by"] for r in rows} == {getpass.getuser()}
        assert all(r["paused"]["text"].startswith("paused by ") for r in rows)
    finally:
        removed = cli(redis_url, prefix, "schedule", "remove", NIGHTLY_PATH, "--json", cwd=root)
    assert removed.returncode == 0, removed.stderr
    assert json.loads(removed.stdout) == {"job": "nightly", "removed": 2}

    resumed = cli(redis_url, prefix, "schedule", "resume", "nightly", cwd=root)
    assert resumed.returncode == 0
    assert resumed.stdout.startswith(f"nightly: resumed (was paused by {getpass.getuser()}")
    assert pause_state(real_store, "nightly") is None
    again = cli(redis_url, prefix, "schedule", "resume", "nightly", "--json", cwd=root)
    assert json.loads(again.stdout) == {"job": "nightly", "paused": None, "was": None}
    bad = cli(redis_url, prefix, "schedule", "pause", "nightly", "--by", "a b", cwd=root)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_backfill_refuses_dates_not_due_yet_and_writes_nothing(
    real_store: LeaseStore, redis_url: str, nightly: Configure
) -> None:
    job = nightly()  # 02:00 UTC daily; NOW is 12:00 UTC on 3 December
    before = snapshot(real_store.client, real_store.prefix)
    for policy in ("all", "latest"):
        with pytest.raises(InvalidInput) as refused:
            backfill(real_store, job, date(2026, 12, 1), date(2026, 12, 4), policy, now=NOW)
        assert str(refused.value).startswith("--to 2026-12-04 is too late: 2026-12-04 is ")
        assert "the last date allowed is 2026-12-03" in str(refused.value)
    early = NOW.replace(hour=1)  # before the day's 02:00: the day's run is not due yet
    with pytest.raises(InvalidInput, match="the last date allowed is 2026-12-02"):
        backfill(real_store, job, date(2026, 12, 1), date(2026, 12, 3), now=early)
    assert snapshot(real_store.client, real_store.prefix) == before
    made = backfill(real_store, job, date(2026, 12, 2), date(2026, 12, 3), now=NOW)
    assert [d.run_id for d in made] == ["nightly:2026-12-02", "nightly:2026-12-03"]

    # By the server's clock, through the command line: one line, exit 2, nothing written.
    before = snapshot(real_store.client, real_store.prefix)
    server_now = Runs(real_store).server_now()
    today = server_now.date()
    allowed = today if server_now.hour >= 2 else today - timedelta(days=1)
    args = ["--from", str(today), "--to", str(today + timedelta(days=2))]
    root = Path(__file__).resolve().parent.parent
    done = cli(redis_url, real_store.prefix, "backfill", NIGHTLY_PATH, *args, cwd=root)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"the last date allowed is {allowed}" in lines[0], done.stderr
    assert snapshot(real_store.client, real_store.prefix) == before


def test_pause_returns_what_it_wrote_when_a_resume_comes_at_once(
    real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = real_store.keys.job("nightly")
    client = real_store.client
    make = client.pipeline

    def pipeline(*args: Any, **options: Any) -> Any:
        """A pipeline whose transaction is followed at once by a resume."""
        pipe = make(*args, **options)
        execute = pipe.execute

        def then_resume(*a: Any, **o: Any) -> Any:
            replies = execute(*a, **o)
            if options.get("transaction", True):
                client.hdel(key, "paused_by", "paused_at")
            return replies

        pipe.execute = then_resume  # type: ignore[method-assign]
        return pipe

    monkeypatch.setattr(client, "pipeline", pipeline)
    paused = pause(real_store, "nightly", by="alice")
    monkeypatch.undo()
    assert paused.by == "alice" and paused.at_ms > 0
    assert pause_state(real_store, "nightly") is None  # the resume came after it
