"""Hostile values in every field a user or a worker can set (tests/hostile_world.py), read
through Flask's test client on a private Redis.

Every page the links reach, and the pages of ids no link names, answer 200 or a clean 4xx
page (the one 5xx: ``/metrics`` says 503 when a run id is not UTF-8); no page holds an
element or attribute a value could have brought (a script without ``src``, a handler, an
image, a frame, a refresh, a ``javascript:`` URL, a style); each value is shown as text;
a part whose bytes are not UTF-8 is a note with its text; and nothing in Redis changes.
The same world is loaded in Chromium by tests/test_browser_hostile.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from flask.testing import FlaskClient

from redis_lease import LeaseStore
from redis_lease.operate.dashboard import create_app
from tests.dashboard_pages import Node, page, parse
from tests.hostile_world import (
    BYTES_RUN,
    RUN,
    HostileWorld,
    build,
    crawl,
    fields_shown,
    snapshot,
)
from tests.redis_server import RedisServer

SINK = "http://127.0.0.1:9/sink"
#: Elements no page of the dashboard has, so a hostile value could only have brought them.
FOREIGN_TAGS = {"iframe", "img", "object", "embed", "base", "frame", "video", "audio", "style"}
URL_ATTRIBUTES = ("href", "src", "action", "formaction", "xlink:href")


@dataclass
class Looked:
    """What the crawl saw: each URL's status and type, and the fields shown as text."""

    status: dict[str, tuple[int, str]] = field(default_factory=dict)
    shown: set[str] = field(default_factory=set)


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LeaseStore, HostileWorld]]:
    """The hostile world on a Redis of this module's own."""
    server = RedisServer(tmp_path_factory.mktemp("hostile"))
    server.start()
    store = LeaseStore.from_url(server.url)
    try:
        yield store, build(store, SINK)
    finally:
        store.close()
        server.kill()


@pytest.fixture(scope="module")
def client(world: tuple[LeaseStore, HostileWorld]) -> FlaskClient:
    return create_app(world[0], secret_key="test-secret").test_client()


def assert_inert(url: str, tree: Node) -> None:
    """No element or attribute in the page that a hostile value could have brought."""
    for node in tree.walk():
        where = f"{url}: <{node.tag} {node.attrs}>"
        assert node.tag not in FOREIGN_TAGS, where
        assert not [name for name in node.attrs if name.startswith("on")], where
        assert "style" not in node.attrs, where
        if node.tag == "script":
            assert node.attrs.get("src", "").startswith("/static/") and not node.text, where
        if node.tag == "svg":
            assert node.attrs.get("id") == "age-chart", where
        if node.tag == "meta":
            assert "http-equiv" not in node.attrs, where
        for name in URL_ATTRIBUTES:
            target = node.attrs.get(name)
            if target is not None:
                assert target.startswith("/") and not target.startswith("//"), where


def look(client: FlaskClient, world: HostileWorld) -> Looked:
    """Crawls the dashboard, checking each page as it comes."""
    looked = Looked()

    def fetch(url: str) -> list[str]:
        with client.get(url) as response:
            body = response.get_data(as_text=True)
        looked.status[url] = (response.status_code, response.mimetype)
        if response.mimetype == "application/json":
            looked.shown |= fields_shown(body, world)
            json.loads(body)
            return []
        if response.mimetype != "text/html":
            return []
        tree = parse(body)
        assert_inert(url, tree)
        looked.shown |= fields_shown(tree.text, world)
        if response.status_code != 200:
            assert tree.one(id="error-message").text, url
        return [a.attrs["href"] for a in tree.all("a") if "href" in a.attrs]

    crawl(fetch, world.direct)
    return looked


def test_every_page_shows_hostile_values_as_text_and_changes_nothing(
    world: tuple[LeaseStore, HostileWorld], client: FlaskClient
) -> None:
    store, made = world
    before = snapshot(store.client)
    looked = look(client, made)
    assert snapshot(store.client) == before
    failed = {url: s for url, (s, _) in looked.status.items() if s >= 500}
    assert failed == {"/metrics": 503}
    assert {s for s, _ in looked.status.values()} <= {200, 400, 404, 503}
    assert looked.shown == set(made.shown)  # every value reached a page, as text
    pages = [url for url, (_, kind) in looked.status.items() if kind == "text/html"]
    assert len(pages) > 40 and len(looked.status) - len(pages) >= 6  # JSON too
    for url in made.direct:
        assert url in looked.status, url
    assert looked.status[f"/runs/{RUN}"] == (200, "text/html")


def test_values_the_library_refuses_are_rows_with_notes_or_clean_4xx_pages(
    world: tuple[LeaseStore, HostileWorld], client: FlaskClient
) -> None:
    runs = page(client, "/").one("table", id="runs")
    notes = [n.text for n in runs.all(data_unreadable="a run id")]
    assert len(notes) == 2
    assert any("window.__pwned='run id'" in n and "invalid run id" in n for n in notes)
    assert any("not UTF-8" in n and "\ufffd" in n for n in notes)
    assert [r.attrs["data-run"] for r in runs.all("tr") if "data-run" in r.attrs] == [
        BYTES_RUN,
        RUN,
    ]
    dead = page(client, f"/runs/{RUN}").one("table", id="dead-items")
    (planted,) = [r for r in dead.all("tr") if "__pwned" in r.attrs.get("data-item", "")]
    refused = page(client, planted.one("a").attrs["href"], 400)
    assert "invalid item id" in refused.one(id="error-message").text
    assert "<script>window.__pwned=" in refused.one(id="error-message").text  # as text


def test_bytes_that_are_not_utf8_are_notes_holding_their_text(client: FlaskClient) -> None:
    run = page(client, f"/runs/{BYTES_RUN}")
    dead = run.one("table", id="dead-items").one(data_unreadable="its dead items").text
    assert "not UTF-8 text" in dead and "\ufffd" in dead and "<b>" in dead
    assert run.one(data_unreadable="its decision log")
    assert run.one(id="summary").field("dead") == "1"  # the rest of the page is there
    for item in ("b1", "b2", "b3"):
        view = page(client, f"/runs/{BYTES_RUN}/items/{item}")
        note = view.one(data_unreadable=f"item {item}'s record").text
        assert "not UTF-8 text" in note and "\ufffd" in note, item
    workers = page(client, "/rq/0/view/workers").one("table", id="workers")
    odd = [r for r in workers.all("tr", data_role="worker") if "\ufffd" in r.attrs["data-worker"]]
    assert len(odd) == 1 and "its name is not UTF-8 text" in odd[0].text
    job = page(client, "/rq/0/view/job/rq-bytes")
    problems = job.one(data_unreadable="job").text
    for part in ("'status' field", "'description' field", "exc_info", "data is pickled"):
        assert part in problems, part
    assert "\ufffd" in job.one("pre", id="traceback").text
