"""No RQ job this project or its scheduler entries write is pickled: shard jobs (from the
tick and from enqueue_shard), tick entries (API and CLI), and the results workers store.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
import subprocess
import sys
from datetime import date

import pytest

from redis_lease import LeaseStore
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.tick.schedule import TICK_FUNC, entries, install, remove
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.fleet.transport.shard_jobs import SHARD_FUNC, enqueue_shard
from tests import fleet_jobs
from tests.fleet_helpers import (
    FLEET_PATH,
    REPO,
    Processes,
    assert_json_job,
    fleet_env,
    purge_queue,
    text,
    wait_for,
)

pytestmark = pytest.mark.slow


def jobs_on_queue(store: LeaseStore, queue_name: str) -> list[str]:
    """Ids of every RQ job hash whose origin is ``queue_name``."""
    found = []
    for key in store.client.scan_iter(match="rq:job:*", count=1000):
        if store.client.type(key) != b"hash":  # rq:job:<id>:dependents and the like
            continue
        if text(store.client.hget(key, "origin") or b"") == queue_name:
            found.append(text(key).removeprefix("rq:job:"))
    return sorted(found)


def assert_not_pickled(raw: bytes | None, what: str) -> object:
    """A stored field is JSON text, not a pickle."""
    assert raw is not None, f"{what} is missing"
    assert not raw.startswith(b"\x80"), f"{what} is a pickle"
    return json.loads(raw)


def test_shard_jobs_and_tick_entries_are_json(
    real_store: LeaseStore,
    redis_url: str,
    procs: Processes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue_name = f"{real_store.prefix}-q"
    env = fleet_env(queue_name, items=12, shards=3, ttl=5)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    job = importlib.reload(fleet_jobs).fleet
    entry_ids: list[str] = []
    try:
        runs = Runs(real_store)
        run_id, _ = runs.ensure(job, date(2031, 7, 1), runs.server_now())
        decisions = tick(real_store, [FLEET_PATH])
        assert "dispatch" in [d.kind for d in decisions]
        known = real_store.client.hkeys(real_store.keys.run_jobs(run_id))
        shard_ids = sorted(text(k) for k in known)
        assert len(shard_ids) == 3
        shard_ids.append(enqueue_shard(real_store, FLEET_PATH, queue_name, run_id, 1, 30))

        entry_ids = install(real_store, FLEET_PATH, job, interval=60)
        cli = [sys.executable, "-m", "redis_lease", "--url", redis_url]
        cli += ["--prefix", real_store.prefix, "schedule"]
        done = subprocess.run(
            [*cli, "install", FLEET_PATH, "--interval", "30"],
            cwd=REPO,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert all(i in done.stdout for i in entry_ids)
        shown = subprocess.run(
            [*cli, "show", FLEET_PATH, "--json"],
            cwd=REPO,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        assert sorted(e["id"] for e in json.loads(shown.stdout)) == sorted(entry_ids)
        assert {e["interval"] for e in entries(real_store, job)} >= {"30"}

        written = jobs_on_queue(real_store, queue_name)
        assert sorted(shard_ids + entry_ids) == written
        for rq_id in written:
            payload = assert_json_job(real_store.client, rq_id)
            meta = real_store.client.hget(f"rq:job:{rq_id}", "meta")
            if meta is not None:
                assert_not_pickled(bytes(meta), f"rq:job:{rq_id} meta")
            if rq_id in entry_ids:
                assert payload[0] == TICK_FUNC
                assert payload[2] == [[FLEET_PATH], real_store.prefix]
            else:
                assert payload[0] == SHARD_FUNC
                assert payload[2][:2] == [FLEET_PATH, run_id]
                assert payload[2][3] == real_store.prefix

        # A worker runs the shard jobs; what it stores about them is JSON too.
        worker = procs.start(
            [*cli[:-1], "worker", "--simple", "--burst", "--queue", queue_name], env, "worker"
        )
        wait_for(lambda: worker.poll() is not None, 60, "the burst worker to finish")
        assert worker.returncode == 0, procs.log("worker")
        assert real_store.status(run_id).counts["done"] == 12
        for rq_id in shard_ids:
            rows = real_store.client.xrange(f"rq:results:{rq_id}")
            assert rows, f"no result stored for {rq_id}"
            for _entry, fields in rows:
                value = base64.b64decode(fields[b"return_value"])
                result = assert_not_pickled(value, f"result of {rq_id}")
                assert isinstance(result, dict) and result["run"] == run_id
            assert_json_job(real_store.client, rq_id)
    finally:
        remove(real_store, job)
        purge_queue(real_store.client, queue_name, extra_job_ids=tuple(entry_ids))
        monkeypatch.undo()
        importlib.reload(fleet_jobs)
    assert jobs_on_queue(real_store, queue_name) == []
