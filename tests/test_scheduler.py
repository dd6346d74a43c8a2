"""rq-scheduler starts the nightly run: the installed tick entries, a real ``rqscheduler``
process and a real worker create the run for the date that is due, then finish it.

The job's schedule fires three minutes before the test starts, and its catch-up grace
is an hour. The server has no record of the job's runs, so the first tick takes the
latest scheduled time as due; within the grace, it counts as on time.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from redis_lease import LeaseStore
from redis_lease.errors import NotFound
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.schedule import entries, install, remove, scheduler_for
from redis_lease.fleet.tick.scheduler_tick import NO_RECORD
from tests import fleet_jobs
from tests.fleet_helpers import (
    FLEET_PATH,
    Processes,
    assert_json_job,
    fleet_env,
    purge_queue,
    text,
    wait_for,
)

pytestmark = pytest.mark.slow

RQSCHEDULER = str(Path(sys.executable).parent / "rqscheduler")


def stop_gracefully(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, so that rqscheduler gives up its lock (a killed one holds it ~11 s)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):  # else killed at teardown
            process.wait(timeout=15)


@pytest.mark.parametrize("backend", ["redis", "cluster"])
def test_rqscheduler_triggers_the_tick_and_the_run_is_created(
    backend: str,
    request: pytest.FixtureRequest,
    redis_url: str,
    procs: Processes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On one Redis, and with the lease state on a cluster (rq-scheduler, RQ and their
    jobs on the plain Redis: the queue URL)."""
    fixture = "real_store" if backend == "redis" else "cluster_store"
    store: LeaseStore = request.getfixturevalue(fixture)
    lease_url = request.getfixturevalue("redis_cluster").url if backend == "cluster" else redis_url
    runs = Runs(store)
    fire = (runs.server_now() - timedelta(minutes=3)).replace(second=0, microsecond=0)
    queue_name = f"{store.prefix}-q"
    env = fleet_env(
        queue_name, items=6, shards=2, ttl=5, schedule=f"{fire.minute} {fire.hour} * * *",
        grace=3600,
    )  # fmt: skip
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    job = importlib.reload(fleet_jobs).fleet
    run_id = job.run_id(fire.date())
    ids: list[str] = []
    try:
        ids = install(store, FLEET_PATH, job, interval=2)
        assert sorted(e["id"] for e in entries(store, job)) == sorted(ids)
        # The entry at the next scheduled time is lost: the interval tick arms it again.
        at_id = ids[0]
        scheduler_for(store, job).cancel(at_id)
        assert [e["id"] for e in entries(store, job)] == [ids[1]]
        scheduler = procs.start(
            [RQSCHEDULER, "--url", redis_url, "-i", "1", "-j", "redis_lease.dispatch.JsonJob"],
            env,
            "rqscheduler",
        )
        procs.worker(lease_url, queue_name, env, name="worker", queue_url=redis_url)

        def created() -> list[dict[str, str]] | None:
            # The tick writes the run, then its "create" decision: wait for both.
            try:
                runs.info(run_id)
            except NotFound:
                return None
            return [e for e in runs.decisions(run_id) if e["kind"] == "create"] or None

        create = wait_for(created, 60, f"run {run_id} to be created", every=0.2)
        info = runs.info(run_id)
        assert info["business_date"] == fire.date().isoformat()
        assert len(create) == 1
        assert create[0]["reason"] == f"scheduled at {fire.isoformat()}; {NO_RECORD}"
        registered = store.client.hget(store.keys.job(job.name), "registered_at")
        assert registered is not None

        # The repeating tick plans, dispatches and finally closes the run.
        def finished() -> str | None:
            state = runs.info(run_id)["state"]
            return state if state in ("succeeded", "partial", "failed") else None

        assert wait_for(finished, 60, f"run {run_id} to finish", every=0.2) == "succeeded", (
            procs.log("worker"),
            procs.log("rqscheduler"),
        )
        assert store.status(run_id).counts["done"] == 6

        def armed() -> list[dict[str, str]] | None:
            return [e for e in entries(store, job) if e["id"] == at_id] or None

        again = wait_for(armed, 30, "the tick to arm the next scheduled time", every=0.2)
        assert again[0]["next_utc"] == (fire + timedelta(days=1)).isoformat()
        assert again[0]["cron"] == job.options.schedule
        assert store.run_ids() == [run_id]  # one run, however often it ticked
        for rq_id in ids:  # what the scheduler wrote and moved stayed JSON
            payload = assert_json_job(store.rq, rq_id)
            assert payload[0] == "redis_lease.tick.tick_entry"
        stop_gracefully(scheduler)
        assert scheduler.returncode is not None
    finally:
        remove(store, job)
        purge_queue(store.rq, queue_name, extra_job_ids=tuple(ids))
        monkeypatch.undo()
        importlib.reload(fleet_jobs)
    assert entries(store, job) == []
    assert text(store.rq.exists(*[f"rq:job:{i}" for i in ids])) == "0"


SCHEDULES = """\
from datetime import timedelta

from redis_lease import Job

berlin = Job("berlin", schedule="0 2 * * *", timezone="Europe/Berlin", deadline_at="06:00")
weekly = Job("weekly", schedule="30 1 * * 1", deadline_after=timedelta(hours=4))
"""


def test_schedule_next_shows_the_runs_a_schedule_makes_without_redis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Across the spring-forward night in Berlin: the 02:00 time is 03:00 that day, the
    deadline 06:00 local; a weekly job with a duration deadline. No Redis is named."""
    from typer.testing import CliRunner

    from redis_lease.cli import app

    module = f"schedules_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(SCHEDULES)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    args = ["--url", "redis://127.0.0.1:1/0", "schedule", "next", f"{module}:berlin"]
    shown = runner.invoke(app, [*args, "--from", "2026-03-28", "--count", "2", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == [
        {
            "business_date": "2026-03-28",
            "run": "berlin:2026-03-28",
            "fires": "2026-03-28T02:00:00+01:00",
            "fires_utc": "2026-03-28T01:00:00+00:00",
            "deadline_utc": "2026-03-28T05:00:00+00:00",
        },
        {
            "business_date": "2026-03-29",
            "run": "berlin:2026-03-29",
            "fires": "2026-03-29T03:00:00+02:00",
            "fires_utc": "2026-03-29T01:00:00+00:00",
            "deadline_utc": "2026-03-29T04:00:00+00:00",
        },
    ]
    weekly = [*args[:-1], f"{module}:weekly", "--from", "2026-12-07T12:00"]
    table = runner.invoke(app, weekly, env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0] == "weekly: 30 1 * * 1 in UTC, after 2026-12-07T12:00:00+00:00"
    assert len(lines) == 2 + 5 and "weekly:2026-12-14" in lines[2]
    assert lines[1].split() == ["business", "date", "run", "fires", "(UTC)", "deadline", "(UTC)"]
    assert "2026-12-14T05:30:00+00:00" in lines[2]  # 4 hours after 01:30
    bad = runner.invoke(app, [*args, "--from", "someday"])
    assert bad.exit_code == 2
    assert "invalid --from 'someday': use YYYY-MM-DD or an ISO 8601 time" in bad.output
