"""rq-dashboard under ``/rq`` while a real worker is busy with a JSON job.

rq-dashboard 0.9's workers views list workers without the serializer, so a busy
worker's JSON job was read with pickle and the views answered 500; the mount
gives them RQ's JSON serializer. The test shows both: with rq-dashboard's own
``Worker`` put back, the same request fails.
"""

from __future__ import annotations

import pytest
import redis
import rq
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker
from rq_dashboard import web

from redis_lease import LeaseStore, dispatch
from redis_lease.dashboard import create_app
from redis_lease.dispatch import JsonJob
from tests.fleet_helpers import Processes, assert_json_job, wait_for

HOLD_SECONDS = 120


def block_until_released(url: str, key: str) -> str:
    """The job: waits (up to HOLD_SECONDS) until the test pushes to ``key``."""
    client = redis.Redis.from_url(url)
    try:
        popped = client.blpop([key], timeout=HOLD_SECONDS)
    finally:
        client.close()
    return "released" if popped else "timed out"


@pytest.mark.slow
def test_workers_view_works_while_a_worker_runs_a_json_job(
    real_store: LeaseStore,
    redis_url: str,
    queue_name: str,
    procs: Processes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = real_store.client
    release = f"{real_store.prefix}:release"
    job = dispatch.queue(client, queue_name).enqueue(
        f"{__name__}.block_until_released", redis_url, release, job_timeout=HOLD_SECONDS + 60
    )
    assert_json_job(client, job.id)
    procs.worker(redis_url, queue_name, {}, name="busy")

    def busy_worker() -> BaseWorker | None:
        for worker in rq.Worker.all(connection=client, serializer=JSONSerializer):
            if worker.get_current_job_id() == job.id:
                return worker
        return None

    worker = wait_for(busy_worker, 30, f"a worker to start the job ({procs.log('busy')})")
    dashboard = create_app(real_store).test_client()
    try:
        listed = dashboard.get("/rq/0/data/workers.json")
        assert listed.status_code == 200, listed.get_data(as_text=True)[-1500:]
        (mine,) = [w for w in listed.get_json()["workers"] if w["name"] == worker.name]
        assert mine["state"] == "busy" and mine["queues"] == [queue_name]
        assert mine["current_job"]["job_id"] == job.id
        assert "block_until_released" in mine["current_job"]["description"]
        assert dashboard.get("/rq/0/view/workers").status_code == 200
        assert dashboard.get(f"/rq/0/view/job/{job.id}").status_code == 200
        shown = dashboard.get(f"/rq/0/data/job/{job.id}.json")
        assert shown.status_code == 200 and shown.get_json()["status"] == "started"

        # rq-dashboard's own Worker reads the job with pickle: the view fails.
        monkeypatch.setattr(web, "Worker", rq.Worker)
        assert dashboard.get("/rq/0/data/workers.json").status_code == 500
        monkeypatch.undo()
    finally:
        client.rpush(release, "go")
    finished = wait_for(
        lambda: JsonJob.fetch(job.id, connection=client).get_status() == "finished",
        30,
        "the released job to finish",
    )
    assert finished
    assert JsonJob.fetch(job.id, connection=client).return_value() == "released"
    client.delete(release)
