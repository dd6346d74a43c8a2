"""The dashboard on a full Redis (``maxmemory`` reached under ``noeviction``), a private
server: every page still answers with what is stored and a banner saying Redis is full and
what to do, ``/healthz`` says ``redis full`` (503), an action Redis refuses goes back to its
page with the full line, and once memory is freed the banner goes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import quote, unquote

import pytest
import redis
from flask.testing import FlaskClient

from redis_lease import Item, LeaseStore
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.transport import shard_jobs
from redis_lease.operate.dashboard import create_app
from tests.browser.harness import chromium, screenshot, start_dashboard
from tests.dashboard_pages import Node, csrf_of, page, parse
from tests.fleet_helpers import Processes
from tests.redis_server import RedisServer
from tests.rq_helpers import failed_job
from tests.test_full_redis import FULL_LINE, fill

#: What the banner says to do, in the words of the CLI's line.
ADVICE = ("free memory", "raise maxmemory", "finish or delete old runs")
QUEUE = "full-q"
RUN = "nightly:2026-12-02"


@dataclass(frozen=True)
class Full:
    """The private server, filled, and what was written before it filled."""

    server: RedisServer
    store: LeaseStore
    admin: redis.Redis
    failed_job: str

    def free(self) -> None:
        """Lifts the limit: writes fit again (the filler keys stay)."""
        self.admin.config_set("maxmemory", "0")


@pytest.fixture
def full(private_redis: Callable[..., RedisServer], prefix: str) -> Iterator[Full]:
    """A run with a dead item and a failed run, a failed RQ job, then Redis filled."""
    server = private_redis(maxmemory="8mb", **{"maxmemory-policy": "noeviction"})
    store = LeaseStore.from_url(server.url, prefix=prefix)
    store.add(RUN, [Item("a"), Item("b"), Item("c")], shards=2)
    store.fail(store.claim(RUN, "a", "w1"), "card declined", permanent=True)
    store.add("ended:1", [Item("x")], shards=1)
    Runs(store).finalize("ended:1", "deadline passed")
    assert store.status("ended:1").state == "failed"  # nothing done: resumable
    job = failed_job(store.client, QUEUE, "provider down")
    admin = redis.Redis.from_url(server.url)
    assert fill(admin) > 0
    yield Full(server, store, admin, job)
    admin.close()
    store.client.close()


def banner(view: Node) -> str:
    """The text of the page's full-Redis banner ('' when it has none)."""
    found = view.all(id="redis-full")
    return found[0].text if found else ""


def flash_lines(view: Node) -> list[str]:
    """The page's flash lines."""
    return [node.text for node in view.all("div") if "flash" in node.attrs.get("class", "")]


def test_every_page_answers_on_a_full_redis_with_a_banner_saying_what_to_do(
    full: Full,
) -> None:
    client = create_app(full.store, secret_key="test-secret").test_client()
    run = quote(RUN, safe="")
    overview = page(client, "/")
    assert {row.attrs["data-run"] for row in overview.all("tr") if "data-run" in row.attrs} == {
        RUN,
        "ended:1",
    }
    shown = page(client, f"/runs/{run}")
    assert shown.one("span", data_field="state").text == "running"
    assert shown.one("span", data_field="pending").text == "2"
    assert shown.one("span", data_field="dead").text == "1"
    assert [r.attrs["data-item"] for r in shown.all("tr") if "data-item" in r.attrs] == ["a"]
    views = {
        "/": overview,
        f"/runs/{run}": shown,
        f"/runs/{run}/items/a": page(client, f"/runs/{run}/items/a"),
        "/workers": page(client, "/workers"),
        "/rq/": page(client, "/rq/"),
        "/rq/0/view/workers": page(client, "/rq/0/view/workers"),
        "jobs": page(client, f"/rq/0/view/jobs/{QUEUE}/failed"),
        "job": page(client, f"/rq/0/view/job/{full.failed_job}"),
        "/metrics/view": page(client, "/metrics/view"),
        "404": page(client, "/runs/nope:1", 404),
    }
    for url, view in views.items():
        said = banner(view)
        assert "Redis is full" in said, url
        assert all(words in said for words in ADVICE), (url, said)
    assert full.failed_job in views["jobs"].text
    health = client.get("/healthz")
    assert (health.status_code, health.get_data(as_text=True)) == (503, "redis full\n")

    full.free()
    assert banner(page(client, "/")) == ""
    assert banner(page(client, f"/runs/{run}")) == ""
    health = client.get("/healthz")
    assert (health.status_code, health.get_data(as_text=True)) == (200, "ok\n")


def test_actions_a_full_redis_refuses_go_back_to_their_page_with_the_full_line(
    full: Full,
) -> None:
    client: FlaskClient = create_app(full.store, secret_key="test-secret").test_client()
    run = quote(RUN, safe="")
    token = csrf_of(page(client, f"/runs/{run}"))
    for url, back, form in (
        ("/runs/ended%3A1/resume", "/runs/ended%3A1", {"hours": "2"}),
        (
            f"/rq/job/{full.failed_job}/requeue",
            f"/rq/0/view/jobs/{QUEUE}/failed",
            {"back": f"/rq/0/view/jobs/{QUEUE}/failed"},
        ),
    ):
        response = client.post(url, data={"csrf_token": token, **form})
        assert response.status_code == 303, (url, response.get_data(as_text=True)[-1500:])
        assert unquote(response.headers["Location"]) == unquote(back), url
        view = parse(client.get(back).data)
        (line,) = flash_lines(view)
        assert line.startswith("Not done:") and FULL_LINE in line, (url, line)
        assert "Redis is full" in banner(view)
    assert full.store.status("ended:1").state == "failed", "nothing resumed"
    failed = shard_jobs.queue(full.store.client, QUEUE).failed_job_registry
    assert failed.get_job_ids(cleanup=False) == [full.failed_job]
    response = client.post(  # deleting frees memory: a full Redis allows it
        f"/rq/job/{full.failed_job}/delete",
        data={"csrf_token": token, "back": f"/rq/0/view/jobs/{QUEUE}/failed"},
    )
    assert response.status_code == 303
    (line,) = flash_lines(parse(client.get(f"/rq/0/view/jobs/{QUEUE}/failed").data))
    assert line == f"job {full.failed_job} deleted"
    assert failed.get_job_ids(cleanup=False) == []

    full.free()  # room again: the same click works
    response = client.post("/runs/ended%3A1/resume", data={"csrf_token": token, "hours": "2"})
    assert response.status_code == 303
    assert full.store.status("ended:1").state == "running"
    (line,) = flash_lines(parse(client.get("/runs/ended%3A1").data))
    assert line.startswith("run ended:1 resumed")


@pytest.mark.slow
def test_the_banner_shows_in_a_browser_on_a_full_redis(
    full: Full, tmp_path_factory: pytest.TempPathFactory
) -> None:
    procs = Processes(tmp_path_factory.mktemp("full-dashboard"))
    with chromium() as browser:
        try:
            dashboard = start_dashboard(procs, full.server.url, full.store.prefix)
            for width in (1400, 1024):
                context = browser.new_context(viewport={"width": width, "height": 900})
                try:
                    opened = context.new_page()
                    for name, path in (("runs", ""), ("run", f"runs/{quote(RUN, safe='')}")):
                        response = opened.goto(f"{dashboard.url}{path}")
                        assert response is not None and response.status == 200
                        shown = opened.locator("#redis-full")
                        assert shown.is_visible()
                        box = shown.bounding_box()
                        assert box is not None and box["y"] < 200, "at the top of the page"
                        assert "Redis is full" in shown.inner_text()
                        screenshot(opened, f"full-redis-{name}-{width}", width)
                finally:
                    context.close()
        finally:
            procs.kill_all()
