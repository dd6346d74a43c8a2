"""Hostile values in every field a user or a worker can set (tests/hostile_world.py), in a
real browser: headless Chromium under Playwright, against ``redis-lease dashboard`` on a
private Redis.

Every page the links reach, and the pages of ids no link names, are loaded. A value that
ran would set ``window.__pwned``, open a dialog, call the sink this test serves, navigate,
or (blocked) leave a Content-Security-Policy violation; the test watches for each, and looks
in every HTML page's DOM for any element or attribute a value could have brought. Every
value is seen as text somewhere, and a snapshot of every key before and after is equal.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from redis_lease import LeaseStore
from tests.browser.harness import Dashboard, chromium, screenshot, start_dashboard
from tests.browser.sink import Sink, sink
from tests.fleet_helpers import Processes
from tests.hostile_world import HostileWorld, build, crawl, fields_shown, snapshot
from tests.redis_server import RedisServer

if TYPE_CHECKING:
    from playwright.sync_api import Browser

pytestmark = pytest.mark.slow

#: Before any page script: record every CSP violation the page reports.
WATCH = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__violations.push(`${event.violatedDirective} ${event.blockedURI}`);
});
"""
#: What the page holds once loaded: the flag a hostile script would set, the violations,
#: elements and attributes no page of the dashboard has (HTML pages), its text and links.
LOOK = """
(html) => {
  const foreign = [];
  const tags = ["iframe", "img", "object", "embed", "base", "frame", "video", "audio", "style"];
  for (const el of html ? document.querySelectorAll("*") : []) {
    const tag = el.tagName.toLowerCase();
    if (tags.includes(tag)) foreign.push(tag);
    const src = el.getAttribute("src") || "";
    if (tag === "script" && !src.startsWith("/static/")) foreign.push("script");
    if (tag === "svg" && el.id !== "age-chart") foreign.push("svg");
    if (tag === "meta" && el.hasAttribute("http-equiv")) foreign.push("meta http-equiv");
    for (const attr of el.attributes) {
      if (attr.name.startsWith("on") || attr.name === "style") foreign.push(`${tag} ${attr.name}`);
      if (/^\\s*javascript:/i.test(attr.value) && ["href", "src", "action"].includes(attr.name)) {
        foreign.push(`${tag} ${attr.name}=javascript:`);
      }
    }
  }
  return {
    pwned: window.__pwned === undefined ? null : String(window.__pwned),
    violations: window.__violations || [],
    foreign: foreign,
    text: document.body ? document.body.innerText : "",
    links: Array.from(document.querySelectorAll("a[href]"), (a) => a.getAttribute("href")),
    url: location.href,
  };
}
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium (skipped, or failed under CI=true, when it is missing)."""
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def called() -> Iterator[Sink]:
    """The sink a hostile value would call."""
    with sink() as made:
        yield made


@pytest.fixture(scope="module")
def served(
    browser: Browser, called: Sink, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LeaseStore, HostileWorld, Dashboard]]:
    """The hostile world on a private Redis, and ``redis-lease dashboard`` serving it."""
    directory = tmp_path_factory.mktemp("hostile-browser")
    server = RedisServer(directory)
    server.start()
    procs = Processes(directory)
    store = LeaseStore.from_url(server.url)
    try:
        world = build(store, called.url)
        yield store, world, start_dashboard(procs, server.url, store.prefix)
    finally:
        procs.kill_all()
        store.close()
        server.kill()


def test_no_page_runs_a_hostile_value_and_none_changes_a_key(
    browser: Browser, called: Sink, served: tuple[LeaseStore, HostileWorld, Dashboard]
) -> None:
    store, world, dashboard = served
    before = snapshot(store.client)
    context = browser.new_context()
    page = context.new_page()
    page.add_init_script(WATCH)
    dialogs: list[str] = []
    console: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.on(
        "console",
        lambda message: console.append(message.text) if "Security Policy" in message.text else None,
    )
    shown: set[str] = set()
    statuses: dict[str, int] = {}
    base = dashboard.url.rstrip("/")

    def fetch(url: str) -> list[str]:
        response = page.goto(base + url)
        assert response is not None, url
        statuses[url] = response.status
        html = (response.headers.get("content-type") or "").startswith("text/html")
        found: dict[str, Any] = page.evaluate(LOOK, html)
        assert found["url"] == base + url or found["url"].startswith(base), (url, found["url"])
        assert found["pwned"] is None, (url, found["pwned"])
        assert found["violations"] == [], (url, found["violations"])
        assert found["foreign"] == [], (url, found["foreign"])
        shown.update(fields_shown(found["text"], world))
        return list(found["links"])

    try:
        pages = crawl(fetch, world.direct)
        failing = next(url for url in pages if url.startswith("/rq/0/view/job/") and "-" in url)
        page.goto(base + failing)
        screenshot(page, "dashboard-hostile-rq-job")
    finally:
        context.close()
    assert dialogs == [] and console == [] and called.hits == []
    assert shown == set(world.shown)  # every value reached a page, as text
    assert {status for status in statuses.values()} <= {200, 400, 404, 503}
    assert [url for url, status in statuses.items() if status >= 500] == ["/metrics"]
    assert len(pages) > 40
    after = snapshot(store.client)
    changed = {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}
    assert not changed, sorted(changed)
