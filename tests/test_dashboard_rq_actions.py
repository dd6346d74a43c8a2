"""What the RQ pages change: requeue, delete, requeue all, empty, compact, as POST forms.

Each action is sent as the page's own form would send it (its CSRF token and its way
back), and checked by what RQ then reads in Redis. Other methods are 405, a POST without
the token 400, and a read-only dashboard shows no form and refuses every POST (403). A
job RQ cannot read is left as it is and the line says so.
"""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from redis_lease import LeaseStore
from redis_lease.fleet.transport import shard_jobs
from redis_lease.fleet.transport.shard_jobs import JsonJob
from redis_lease.operate.dashboard import create_app
from tests.dashboard_pages import Node, csrf_of, page
from tests.rq_helpers import failed_job, pickled_call, plant_job, planted


@pytest.fixture
def client(real_store: LeaseStore) -> FlaskClient:
    return create_app(real_store, secret_key="test-secret").test_client()


def form_of(view: Node, action: str) -> dict[str, str]:
    """The fields of the page's form whose button is ``data-action=action``, with its URL."""
    (form,) = [f for f in view.all("form") if f.has("button", data_action=action)]
    fields = {i.attrs["name"]: i.attrs.get("value", "") for i in form.all("input")}
    return {"url": form.attrs["action"], **fields}


def submit(client: FlaskClient, view: Node, action: str, status: int = 303) -> str:
    """Sends the page's form ``action``; returns where it goes back to."""
    fields = form_of(view, action)
    response = client.post(fields.pop("url"), data=fields)
    assert response.status_code == status, response.get_data(as_text=True)[-1500:]
    return str(response.headers.get("Location", ""))


def failed_and_queued(store: LeaseStore, queue_name: str) -> tuple[list[str], list[str]]:
    queue = shard_jobs.queue(store.client, queue_name)
    return queue.failed_job_registry.get_job_ids(cleanup=False), queue.job_ids


def test_requeue_from_the_job_page_puts_the_failed_job_back_on_its_queue(
    real_store: LeaseStore, client: FlaskClient, queue_name: str
) -> None:
    job = failed_job(real_store.client, queue_name, "boom")
    view = page(client, f"/rq/0/view/job/{job}")
    back = submit(client, view, "requeue")
    assert back == f"/rq/0/view/job/{job}"
    assert failed_and_queued(real_store, queue_name) == ([], [job])
    after = page(client, back)
    assert f"job {job} requeued on {queue_name}" in after.text
    assert after.one(id="summary").field("status") == "queued"
    assert not after.has("button", data_action="requeue")
    again = client.post(f"/rq/job/{job}/requeue", data={"csrf_token": csrf_of(view)})
    assert again.status_code == 303 and again.headers["Location"] == "/rq/"
    assert "is not in the failed registry" in page(client, "/rq/").text


def test_delete_from_a_registry_page_removes_the_job(
    real_store: LeaseStore, client: FlaskClient, queue_name: str
) -> None:
    kept = failed_job(real_store.client, queue_name, "kept")
    gone = failed_job(real_store.client, queue_name, "deleted")
    url = f"/rq/0/view/jobs/{queue_name}/failed?order=dsc"
    view = page(client, url)
    row = view.one("tr", data_job=gone)
    fields = form_of(row, "delete")
    response = client.post(fields.pop("url"), data=fields)
    assert response.headers["Location"] == url  # back to the same page, same order
    assert failed_and_queued(real_store, queue_name) == ([kept], [])
    assert not real_store.client.exists(f"rq:job:{gone}")
    assert f"job {gone} deleted" in page(client, url).text


def test_requeue_all_and_empty_leave_a_job_rq_cannot_read_and_say_so(
    real_store: LeaseStore, client: FlaskClient, queue_name: str, prefix: str
) -> None:
    first = failed_job(real_store.client, queue_name, "one")
    second = failed_job(real_store.client, queue_name, "two")
    unreadable = f"{prefix}-garbage"
    with planted(real_store.client) as keys:
        garbage = {"status": "failed", "description": b"\xff\xfe", "data": pickled_call()}
        plant_job(
            real_store.client,
            keys,
            unreadable.encode(),
            {**garbage, "origin": queue_name},
            queue=queue_name,
        )
        real_store.client.zadd(f"rq:failed:{queue_name}", {b"gone-job": 0})
        view = page(client, f"/rq/0/view/jobs/{queue_name}/failed")
        submit(client, view, "requeue-all")
        failed, queued = failed_and_queued(real_store, queue_name)
        assert sorted(queued) == sorted([first, second])
        assert sorted(failed) == sorted([unreadable, "gone-job"])
        said = page(client, f"/rq/0/view/jobs/{queue_name}/failed").text
        assert "2 failed job(s) of" in said and "2 left: RQ cannot read them" in said

        view = page(client, f"/rq/0/view/jobs/{queue_name}/failed")
        submit(client, view, "empty")
        assert failed_and_queued(real_store, queue_name)[0] == [unreadable]  # gone-job dropped
        assert real_store.client.exists(f"rq:job:{unreadable}")
        said = page(client, f"/rq/0/view/jobs/{queue_name}/failed").text
        assert "1 deleted; 1 left: RQ cannot read them" in said

        for action in ("requeue", "delete"):
            refused = client.post(
                f"/rq/job/{unreadable}/{action}", data={"csrf_token": csrf_of(view)}
            )
            assert refused.status_code == 303
            assert "RQ cannot read it" in page(client, "/rq/").text
        assert real_store.client.exists(f"rq:job:{unreadable}")


def test_empty_and_compact_a_queue(
    real_store: LeaseStore, client: FlaskClient, queue_name: str
) -> None:
    queue = shard_jobs.queue(real_store.client, queue_name)
    jobs = [queue.enqueue("builtins.len", f"job {n}").id for n in range(5)]
    real_store.client.delete(f"rq:job:{jobs[1]}", f"rq:job:{jobs[3]}")  # expired meanwhile
    view = page(client, f"/rq/0/view/jobs/{queue_name}/queued")
    assert "not in Redis" in view.one("tr", data_job=jobs[1]).text
    submit(client, view, "compact")
    assert queue.job_ids == [jobs[0], jobs[2], jobs[4]]  # order kept
    assert "2 id(s) of gone jobs removed" in page(client, "/rq/").text
    view = page(client, f"/rq/0/view/jobs/{queue_name}/queued")
    submit(client, view, "empty")
    assert queue.job_ids == [] and not real_store.client.exists(f"rq:job:{jobs[0]}")


def test_actions_answer_post_with_the_token_only(
    real_store: LeaseStore, client: FlaskClient, queue_name: str
) -> None:
    job = failed_job(real_store.client, queue_name, "boom")
    urls = (
        f"/rq/job/{job}/requeue",
        f"/rq/job/{job}/delete",
        f"/rq/requeue/{queue_name}",
        f"/rq/queue/{queue_name}/failed/empty",
        f"/rq/queue/{queue_name}/compact",
    )
    for url in urls:
        for method in ("GET", "HEAD", "PUT", "DELETE", "PATCH"):
            assert client.open(url, method=method).status_code == 405, (method, url)
        refused = client.post(url)
        assert refused.status_code == 400, url
        assert "CSRF token is missing" in refused.get_data(as_text=True)
    forged = client.post(urls[0], data={"csrf_token": "forged"})
    assert forged.status_code == 400
    assert failed_and_queued(real_store, queue_name) == ([job], [])
    token = csrf_of(page(client, f"/rq/0/view/job/{job}"))
    for bad in (f"/rq/queue/{queue_name}/bogus/empty", "/rq/requeue/no-such-queue"):
        assert client.post(bad, data={"csrf_token": token}).status_code == 404, bad
    assert failed_and_queued(real_store, queue_name) == ([job], [])


@pytest.mark.parametrize(
    "back",
    ["https://evil.example/", "//evil.example/rq/", "/runs/x", "/rq/\r\nX-Evil: 1", "javascript:x"],
)
def test_an_action_goes_back_only_to_a_page_under_rq(
    real_store: LeaseStore, client: FlaskClient, queue_name: str, back: str
) -> None:
    job = failed_job(real_store.client, queue_name, "boom")
    token = csrf_of(page(client, f"/rq/0/view/job/{job}"))
    response = client.post(f"/rq/job/{job}/requeue", data={"csrf_token": token, "back": back})
    assert response.status_code == 303
    assert response.headers["Location"] == "/rq/"
    assert "X-Evil" not in response.headers
    assert JsonJob.fetch(job, connection=real_store.client).get_status() == "queued"


def test_read_only_shows_no_forms_and_refuses_every_action(
    real_store: LeaseStore, queue_name: str
) -> None:
    job = failed_job(real_store.client, queue_name, "boom")
    client = create_app(real_store, read_only=True).test_client()
    for url in (
        "/rq/",
        f"/rq/0/view/jobs/{queue_name}/failed",
        f"/rq/0/view/jobs/{queue_name}/queued",
        f"/rq/0/view/job/{job}",
    ):
        assert not page(client, url).all("form"), url
    for url in (
        f"/rq/job/{job}/requeue",
        f"/rq/job/{job}/delete",
        f"/rq/requeue/{queue_name}",
        f"/rq/queue/{queue_name}/failed/empty",
        f"/rq/queue/{queue_name}/queued/empty",
        f"/rq/queue/{queue_name}/compact",
    ):
        assert client.post(url).status_code == 403, url
        assert client.get(url).status_code == 405, url
    assert failed_and_queued(real_store, queue_name) == ([job], [])
