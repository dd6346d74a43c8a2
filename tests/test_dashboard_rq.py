"""RQ's views under ``/rq``: queues, jobs, one job and workers, as pages and as JSON.

Counts and listings are compared with RQ's own reads (``Queue``, its registries, ``Job``);
jobs are made by RQ (a worker's burst in this process, or a real worker process when one
must stay busy). A job RQ cannot read is planted straight into Redis: it is a row with a
note, never a failed page.
"""

from __future__ import annotations

import json
import zlib
from datetime import timedelta

import pytest
import redis
import rq
from flask.testing import FlaskClient
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker

from redis_lease import LeaseStore
from redis_lease.fleet.transport import shard_jobs
from redis_lease.fleet.transport.shard_jobs import JsonJob
from redis_lease.operate.dashboard import create_app
from redis_lease.operate.dashboard.rq_jobs import INFLATED_MAX
from tests.dashboard_pages import link, page, parse, rows_with
from tests.fleet_helpers import Processes, assert_json_job, wait_for
from tests.rq_helpers import burst, failed_job, pickled_call, plant_job, planted

HOLD_SECONDS = 120
REGISTRIES = ("queued", "started", "deferred", "scheduled", "finished", "failed", "canceled")


@pytest.fixture
def client(real_store: LeaseStore) -> FlaskClient:
    return create_app(real_store, secret_key="test-secret").test_client()


def rq_counts(client: redis.Redis, name: str) -> dict[str, int]:
    """The queue's jobs by registry, as RQ counts them (no cleanup: a read)."""
    queue = shard_jobs.queue(client, name)
    counts = {"queued": queue.count}
    for registry in REGISTRIES[1:]:
        counts[registry] = getattr(queue, f"{registry}_job_registry").get_job_count(cleanup=False)
    return counts


def test_queues_page_and_json_count_every_registry_as_rq_does(
    real_store: LeaseStore, client: FlaskClient, queue_name: str
) -> None:
    rq_client = real_store.client
    queue = shard_jobs.queue(rq_client, queue_name)
    queue.enqueue("builtins.len", "done")
    failed_job(rq_client, queue_name, "boom")
    first = queue.enqueue("builtins.len", "waits")
    queue.enqueue("builtins.len", "waits too", depends_on=first)  # deferred
    queue.enqueue_in(timedelta(hours=1), "builtins.len", "later")
    expected = rq_counts(rq_client, queue_name)
    assert (expected["queued"], expected["deferred"], expected["scheduled"]) == (1, 1, 1)
    assert (expected["finished"], expected["failed"]) == (1, 1)

    view = page(client, "/rq/")
    row = view.one("table", id="queues").one("tr", data_queue=queue_name)
    assert {name: int(row.field(name)) for name in REGISTRIES} == expected
    assert link(row, queue_name) == f"/rq/0/view/jobs/{queue_name}/queued"
    for name in REGISTRIES:
        cell = row.one(data_field=name)
        assert link(cell, cell.text) == f"/rq/0/view/jobs/{queue_name}/{name}"
    where = rq_client.connection_pool.connection_kwargs
    assert f"{where['host']}:{where['port']}" in view.one(id="rq-location").text
    for legacy in ("/rq/0/", "/rq/0/view", "/rq/0/view/queues"):
        assert page(client, legacy).one("table", id="queues").has("tr", data_queue=queue_name)

    listed = client.get("/rq/0/data/queues.json").get_json()["queues"]
    (mine,) = [q for q in listed if q["name"] == queue_name]
    assert mine["count"] == expected["queued"]
    for name in REGISTRIES[1:]:
        assert mine[f"{name}_job_registry_count"] == expected[name], name
    assert mine["failed_url"] == f"/rq/0/view/jobs/{queue_name}/failed"


def test_a_jobs_page_pages_through_a_queue_both_ways(
    real_store: LeaseStore, client: FlaskClient, queue_name: str
) -> None:
    queue = shard_jobs.queue(real_store.client, queue_name)
    for n in range(25):
        queue.enqueue("builtins.len", f"job {n}")
    order = queue.job_ids
    base = f"/rq/0/view/jobs/{queue_name}/queued"

    def shown(url: str) -> list[str]:
        return [r.attrs["data-job"] for r in rows_with(page(client, url), "data-job")]

    first = page(client, base)
    assert [r.attrs["data-job"] for r in rows_with(first, "data-job")] == order[:20]
    assert shown(link(first, "next")) == order[20:]
    assert shown(f"{base}?order=dsc") == order[::-1][:20]
    assert shown(f"{base}?order=dsc&page=2") == order[::-1][20:]
    assert shown(f"{base}?per_page=8&page=2") == order[8:16]
    assert shown(f"{base}/8/dsc/2") == order[::-1][8:16]  # rq-dashboard's URL shape
    data = client.get(f"/rq/0/data/jobs/{queue_name}/queued.json?per_page=8&page=4").get_json()
    assert [j["id"] for j in data["jobs"]] == order[24:]
    assert data["pagination"] == {
        "current_page": 4,
        "num_pages": 4,
        "per_page": 8,
        "order": "asc",
        "total": 25,
    }
    legacy = client.get(f"/rq/0/data/jobs/{queue_name}/queued/8/dsc/1.json").get_json()
    assert [j["id"] for j in legacy["jobs"]] == order[::-1][:8]
    for bad in ("?page=0", "?page=x", "?page=%C2%B2", "?per_page=1000", "?order=random"):
        message = page(client, base + bad, 400).one(id="error-message").text
        assert "is not" in message, bad


def test_a_failed_jobs_page_shows_its_traceback_as_text(
    real_store: LeaseStore, client: FlaskClient, queue_name: str
) -> None:
    message = "<script>alert('x')</script> \"quoted\" <img src=x onerror=alert(1)>"
    job_id = failed_job(real_store.client, queue_name, message)
    stored = JsonJob.fetch(job_id, connection=real_store.client).latest_result()
    assert stored is not None and stored.exc_string is not None

    response = client.get(f"/rq/0/view/job/{job_id}")
    assert response.status_code == 200
    html = response.get_data(as_text=True)
    assert "<script>alert" not in html and "<img src=x" not in html
    view = parse(html)
    traceback = view.one("pre", id="traceback").text
    assert message in traceback and traceback == " ".join(stored.exc_string.split())
    assert view.one(id="summary").field("status") == "failed"
    assert view.has("button", data_action="requeue") and view.has("button", data_action="delete")

    row = page(client, f"/rq/0/view/jobs/{queue_name}/failed").one("tr", data_job=job_id)
    assert message in row.field("error")  # the traceback's last line
    assert link(row, job_id) == f"/rq/0/view/job/{job_id}"
    data = client.get(f"/rq/0/data/job/{job_id}.json").get_json()
    assert data["exc_info"] == stored.exc_string and data["status"] == "failed"
    assert data["origin"] == queue_name and data["problems"] == []


def test_unknown_queue_registry_job_and_instance_are_404_in_the_pages_format(
    client: FlaskClient, queue_name: str
) -> None:
    for url in (
        "/rq/0/view/job/no-such-job",
        f"/rq/0/view/jobs/{queue_name}/queued",  # nothing listed, nothing in it
        "/rq/0/view/jobs/default/bogus",
        "/rq/1/view/queues",
        "/rq/0/view/job/%3Cscript%3E",
    ):
        response = client.get(url)
        assert (response.status_code, response.mimetype) == (404, "text/html"), url
        assert parse(response.data).one(id="error-message").text, url
    for url in (
        "/rq/0/data/job/no-such-job.json",
        f"/rq/0/data/jobs/{queue_name}/failed.json",
        "/rq/0/data/jobs/default/bogus.json",
        "/rq/1/data/queues.json",
    ):
        response = client.get(url)
        assert (response.status_code, response.mimetype) == (404, "application/json"), url
        body = response.get_json()
        assert body["error"] == "not found" and body["message"], url
    message = client.get("/rq/0/data/job/no-such-job.json").get_json()["message"]
    assert "no RQ job 'no-such-job'" in message


def test_a_job_rq_cannot_read_is_a_row_with_a_note(
    real_store: LeaseStore, client: FlaskClient, queue_name: str, prefix: str
) -> None:
    good = failed_job(real_store.client, queue_name, "plain failure")
    garbage, pickled, wrong_type = (f"{prefix}-{n}".encode() for n in ("bytes", "pickle", "type"))
    with planted(real_store.client) as keys:
        plant_job(
            real_store.client,
            keys,
            garbage,
            {"status": b"fail\xffed", "description": b"call \xfe\xff(<b>bold</b>)", "origin": "q"},
            queue=queue_name,
        )
        plant_job(
            real_store.client,
            keys,
            pickled,
            {"status": "failed", "data": pickled_call(), "description": "pickled"},
            queue=queue_name,
        )
        real_store.client.set(b"rq:job:" + wrong_type, "not a hash")
        keys.append(b"rq:job:" + wrong_type)
        real_store.client.zadd(f"rq:failed:{queue_name}", {wrong_type: 2, b"gone-job": 3})
        for bad in (garbage, pickled):  # RQ's own reader refuses them
            with pytest.raises(Exception):  # noqa: B017  # what it raises varies
                JsonJob.fetch(bad.decode(), connection=real_store.client).func_name  # noqa: B018

        view = page(client, f"/rq/0/view/jobs/{queue_name}/failed")
        rows = {r.attrs["data-job"]: r for r in rows_with(view, "data-job")}
        assert set(rows) == {
            good,
            *(i.decode() for i in (garbage, pickled, wrong_type)),
            "gone-job",
        }
        assert not rows[good].has(data_unreadable="job")
        note = rows[garbage.decode()].one(data_unreadable="job").text
        assert "'status' field is not UTF-8" in note and "'description' field" in note
        assert rows[garbage.decode()].field("description") == "call \ufffd\ufffd(<b>bold</b>)"
        assert "pickled: cannot be read" in rows[pickled.decode()].one(data_unreadable="job").text
        assert "not a hash" in rows[wrong_type.decode()].one(data_unreadable="job").text
        assert "not in Redis" in rows["gone-job"].text

        one = page(client, f"/rq/0/view/job/{pickled.decode()}")
        assert "pickled: cannot be read" in one.one(data_unreadable="job").text
        assert one.one("pre", data_field="call").text == "null"
        data = client.get(f"/rq/0/data/job/{garbage.decode()}.json").get_json()
        assert data["status"] == "fail\ufffded" and len(data["problems"]) == 2
        listed = client.get(f"/rq/0/data/jobs/{queue_name}/failed.json").get_json()
        assert len(listed["jobs"]) == 5


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
    real_store: LeaseStore, redis_url: str, queue_name: str, procs: Processes
) -> None:
    client = real_store.client
    release = f"{real_store.prefix}:release"
    job = shard_jobs.queue(client, queue_name).enqueue(
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
        assert mine["pid"] == str(worker.pid)
        row = page(dashboard, "/rq/0/view/workers").one("tr", data_worker=worker.name)
        assert row.field("state") == "busy" and row.field("queues") == queue_name
        assert link(row, job.id) == f"/rq/0/view/job/{job.id}"
        assert page(dashboard, f"/rq/0/view/job/{job.id}").one(id="summary").field("status") == (
            "started"
        )
        shown = dashboard.get(f"/rq/0/data/job/{job.id}.json")
        assert shown.status_code == 200 and shown.get_json()["status"] == "started"
        assert json.loads(shown.get_data())["worker_name"] == worker.name
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


def test_a_burst_workers_finished_job_is_listed_with_its_result(
    real_store: LeaseStore, client: FlaskClient, queue_name: str
) -> None:
    job = shard_jobs.queue(real_store.client, queue_name).enqueue("builtins.len", "four")
    burst(real_store.client, queue_name, f"{queue_name}-w")
    row = page(client, f"/rq/0/view/jobs/{queue_name}/finished").one("tr", data_job=job.id)
    assert row.field("status") == "finished"
    assert row.field("description") == "builtins.len('four')"
    view = page(client, f"/rq/0/view/job/{job.id}")
    assert view.one("pre", data_field="result").text == "4"
    assert json.loads(view.one("pre", data_field="call").text) == [
        "builtins.len",
        None,
        ["four"],
        {},
    ]
    assert not view.has("button", data_action="requeue")  # not failed


def test_a_compressed_value_is_inflated_to_a_megabyte_at_most(
    real_store: LeaseStore, client: FlaskClient, queue_name: str, prefix: str
) -> None:
    job_id = f"{prefix}-bomb"
    bomb = zlib.compress(b"x" * (64 << 20))  # 64 MiB in about 64 KiB
    with planted(real_store.client) as keys:
        plant_job(
            real_store.client,
            keys,
            job_id.encode(),
            {"status": "failed", "origin": queue_name, "exc_info": bomb, "data": bomb},
            queue=queue_name,
        )
        data = client.get(f"/rq/0/data/job/{job_id}.json").get_json()
    assert len(data["exc_info"]) == INFLATED_MAX
    assert f"its exc_info inflates past {INFLATED_MAX} bytes: cut there" in data["problems"]
    assert f"its data inflates past {INFLATED_MAX} bytes: cut there" in data["problems"]
