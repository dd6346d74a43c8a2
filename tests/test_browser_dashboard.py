"""The web dashboard in a real browser: headless Chromium (Debian's package) driven by
Playwright, against ``redis-lease dashboard`` serving a fleet's runs on a private Redis.

Every page's numbers are checked against ``redis-lease status --json`` (and the library);
a requeue clicked in the browser makes a dead item pending; the RQ workers page shows a
busy worker and links its job; a read-only dashboard offers no buttons; a dashboard with
a password asks for it; no page breaks its Content-Security-Policy. Hostile values are
tests/test_browser_hostile.py's. The tests run in any
order: the requeue takes the last dead item, which no other test looks at, and the
resume reopens a partial run of its own. Screenshots of the pages go to
``$REDIS_LEASE_ARTIFACTS`` (else tests/artifacts/); with ``REDIS_LEASE_UPDATE_SCREENSHOTS=1``
the README's images in docs/images/ are refreshed too.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redis_lease.fleet.runs import run_ages
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.protocol.leases import Item
from tests.browser import jobs
from tests.browser.harness import (
    DOC_IMAGES,
    WIDTH,
    Dashboard,
    artifacts,
    chromium,
    cli_json,
    screenshot,
    start_dashboard,
    updating_doc_images,
)
from tests.browser.scenario import PREFIX, World, hold_a_worker, private_world

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

pytestmark = pytest.mark.slow

COUNTS = ("done", "dead", "pending", "leased")
#: How long a page's element may take to appear.
WAIT_MS = 15_000


# -- fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Chromium (skipped, or failed under CI=true, when it is missing)."""
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def world(browser: Browser, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """A private Redis with a finished settlement run (done and dead items); made after the
    browser, so that a missing Chromium skips before any process starts."""
    with private_world(tmp_path_factory.mktemp("dashboard")) as made:
        yield made


@pytest.fixture(scope="module")
def dashboard(world: World) -> Dashboard:
    """``redis-lease dashboard`` on the world's Redis."""
    return start_dashboard(world.procs, world.redis_url, PREFIX)


@pytest.fixture(scope="module")
def held(world: World) -> str:
    """The held run, its worker busy inside the item's handler until the world ends."""
    return hold_a_worker(world)


@pytest.fixture(scope="module")
def resumable(world: World) -> str:
    """A partial run of the resume test's own (one item done, one pending)."""
    store, run = world.store, "adhoc-resume:1"
    store.add(run, [Item("a"), Item("b")], shards=1)
    store.commit(store.claim(run, "a", "browser-test"))
    Runs(store).finalize(run, "deadline passed")
    assert store.status(run).state == "partial"
    return run


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page, 1280 pixels wide; it must break no Content-Security-Policy."""
    context = browser.new_context(viewport={"width": WIDTH, "height": 900})
    opened = context.new_page()
    opened.set_default_timeout(WAIT_MS)
    violations: list[str] = []
    opened.on(
        "console",
        lambda message: (
            violations.append(message.text) if "Content Security Policy" in message.text else None
        ),
    )
    yield opened
    context.close()
    assert not violations, violations


# -- helpers ----------------------------------------------------------------------


def status(world: World, run: str | None = None) -> Any:
    """``redis-lease status [RUN] --json`` on the world's Redis."""
    return cli_json(world.redis_url, PREFIX, "status", *([run] if run else []))


def cell(row: Locator, name: str) -> str:
    """The text of the row's ``data-field=name`` cell."""
    return row.locator(f'[data-field="{name}"]').inner_text().strip()


def number(text: str) -> int:
    """A count as the page writes it (digits, maybe grouped)."""
    digits = text.replace(",", "").replace("\u202f", "").strip()
    assert digits.isdigit(), f"not a count: {text!r}"
    return int(digits)


def field(page: Page, name: str) -> str:
    """The text of the page's ``<span data-field=name>``."""
    return page.locator(f'span[data-field="{name}"]').first.inner_text().strip()


def shows_time(text: str, iso: str | None) -> bool:
    """True when ``text`` shows the ISO time ``iso`` (its date and hour:minute), or when
    both are empty."""
    if not iso:
        return not re.search(r"\d", text)
    day, clock = iso.split("T", 1)
    return day in text and clock[:5] in text


def expected_health(one: dict[str, Any]) -> str:
    """A run's health from its ``status --json``: failed (partial or failed), late (past its
    deadline, not succeeded or canceled), at-risk (projected past its deadline), else ok."""
    if one["state"] in ("partial", "failed"):
        return "failed"
    if not one["deadline"] or one["state"] in ("succeeded", "canceled"):
        return "ok"
    deadline = datetime.fromisoformat(one["deadline"])
    if datetime.now(UTC) > deadline:
        return "late"
    projected = one["projected_finish"]
    return "at-risk" if projected and datetime.fromisoformat(projected) > deadline else "ok"


def open_run(page: Page, dashboard: Dashboard, run: str) -> None:
    """Opens the run page by its link on the runs page."""
    page.goto(dashboard.url)
    page.locator(f'#runs tr[data-run="{run}"] a').first.click()
    page.wait_for_selector("table#shards")


def dead_items(world: World, run: str) -> set[str]:
    """The run's dead items, as ``redis-lease dead RUN --json`` lists them."""
    return {row["item"] for row in cli_json(world.redis_url, PREFIX, "dead", run)["items"]}


def keep_for_docs(name: str) -> None:
    """Copies the artifact ``name``.png to docs/images/ when the images are refreshed."""
    if updating_doc_images():
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(artifacts() / f"{name}.png", DOC_IMAGES / f"{name}.png")


# -- the pages --------------------------------------------------------------------


def test_runs_page_rows_match_status_json(
    page: Page, dashboard: Dashboard, world: World, held: str
) -> None:
    response = page.goto(dashboard.url)
    assert response is not None and response.status == 200
    page.wait_for_selector("table#runs")
    listed = status(world)
    assert {world.settlement_run, held} <= {s["run"] for s in listed}
    assert page.locator("#runs tr[data-run]").count() == len(listed)
    for run in listed:
        row = page.locator(f'#runs tr[data-run="{run["run"]}"]')
        assert row.count() == 1, run["run"]
        one = status(world, run["run"])
        assert row.get_attribute("data-health") == expected_health(one), one
        assert cell(row, "job") == one["info"].get("job", "")
        assert cell(row, "state") == one["state"]
        for name in COUNTS:
            assert number(cell(row, name)) == one["counts"][name], (run["run"], name)
        assert number(cell(row, "planned")) == one["planned"]
        assert number(cell(row, "lost")) == one["lost"]
        assert shows_time(cell(row, "deadline"), one["deadline"]), one["deadline"]
        if one["state"] != "running":  # a running run's projection moves between reads
            assert shows_time(cell(row, "projected_finish"), one["projected_finish"])
    settled = page.locator(f'#runs tr[data-run="{world.settlement_run}"]')
    assert cell(settled, "state") == "partial" and settled.get_attribute("data-health") == "failed"
    assert number(cell(settled, "dead")) == len(dead_items(world, world.settlement_run)) > 0
    screenshot(page, "dashboard-runs")
    keep_for_docs("dashboard-runs")


def test_run_page_counts_shards_and_age_chart(
    page: Page, dashboard: Dashboard, world: World
) -> None:
    run = world.settlement_run
    # A requeued item waits as pending, so the age grows while the page loads: it lies
    # between the ages read before and after.
    age_before = world.store.status(run).oldest_eligible_age_seconds
    open_run(page, dashboard, run)
    one = status(world, run)
    assert field(page, "state") == one["state"] == "partial"
    for name in COUNTS:
        assert number(field(page, name)) == one["counts"][name], name
    assert number(field(page, "planned")) == one["planned"] == jobs.ACCOUNTS
    assert number(field(page, "lost")) == one["lost"] == 0
    age = re.search(r"\d+(\.\d+)?", field(page, "oldest_eligible_age"))
    assert age is not None
    assert age_before - 0.1 <= float(age.group()) <= one["oldest_eligible_age_seconds"] + 0.1

    shards = page.locator("table#shards tr[data-shard]")
    assert shards.count() == one["shards"] == jobs.settlement.options.shards
    per_shard = world.store.shard_counts(run)
    for n, counts in enumerate(per_shard):
        row = page.locator(f'table#shards tr[data-shard="{n}"]')
        for name in COUNTS:
            assert number(cell(row, name)) == counts[name], (n, name)
    for name in COUNTS:  # the shards add up to the run
        assert sum(c[name] for c in per_shard) == one["counts"][name]

    chart = page.locator("svg#age-chart")
    assert chart.is_visible()
    samples = run_ages.read(world.store, run)
    assert len(samples) >= 5, "the ticks sampled the run's ages"
    assert chart_points(chart) == len(samples)

    decisions = page.locator("table#decisions").inner_text()
    for decision in one["decisions"]:
        assert decision["kind"] in decisions, decision
    assert "finalize" in decisions
    dead = dead_items(world, run)
    rows = page.locator("table#dead-items tr[data-item]")
    assert {rows.nth(n).get_attribute("data-item") for n in range(rows.count())} == dead
    for item in dead:
        row = page.locator(f'table#dead-items tr[data-item="{item}"]')
        assert "acquirer refused: account closed" in row.inner_text()
        assert row.locator('button[data-action="requeue"]').count() == 1
        assert row.locator("a").count() >= 1
    assert "acquirer" in page.locator("table#providers").inner_text()
    page.locator("table#job-failures").wait_for(state="attached")
    assert page.locator('button[data-action="resume"]').count() == 1  # a partial run
    screenshot(page, "dashboard-run")
    keep_for_docs("dashboard-run")


def chart_points(chart: Locator) -> int:
    """The data points the chart draws: its line's vertices, else its markers."""
    line = chart.locator("polyline")
    if line.count():
        points = line.first.get_attribute("points") or ""
        return len(re.findall(r"-?[\d.]+\s*,\s*-?[\d.]+", points))
    markers = chart.locator("circle").count()
    if markers:
        return markers
    path = chart.locator("path").first.get_attribute("d") or ""
    return len(re.findall(r"[MLml]", path))


def test_item_page_of_a_dead_item_shows_its_attempts_with_trace_ids(
    page: Page, dashboard: Dashboard, world: World
) -> None:
    run, item = world.settlement_run, world.dead_items[0]
    open_run(page, dashboard, run)
    page.locator(f'table#dead-items tr[data-item="{item}"] a').first.click()
    page.wait_for_selector("table#attempts")
    inspected = cli_json(world.redis_url, PREFIX, "inspect", run, item)
    assert field(page, "state") == inspected["state"] == "dead"
    assert number(field(page, "token")) == inspected["token"]
    assert number(field(page, "attempts")) == inspected["attempts"] == 2
    traces = page.locator("table#attempts [data-field=trace]")
    shown = {traces.nth(n).inner_text().strip() for n in range(traces.count())}
    logged = {a["trace_id"] for a in inspected["attempt_log"]}
    assert len(logged) == 2 and all(re.fullmatch(r"[0-9a-f]{32}", t) for t in logged)
    assert shown == logged
    attempts = page.locator("table#attempts").inner_text()
    assert "provider 503: upstream timeout" in attempts
    assert "acquirer refused: account closed" in attempts
    page.locator("table#effects").wait_for(state="attached")
    screenshot(page, "dashboard-item")


def test_requeue_clicked_in_the_browser_makes_a_dead_item_pending(
    page: Page, dashboard: Dashboard, world: World
) -> None:
    run, item = world.settlement_run, world.dead_items[-1]  # no other test looks at it
    assert len(world.dead_items) >= 2 and item != world.dead_items[0]
    assert cli_json(world.redis_url, PREFIX, "inspect", run, item)["state"] == "dead"
    open_run(page, dashboard, run)
    dead_before = number(field(page, "dead"))
    with page.expect_navigation():
        page.locator(
            f'table#dead-items tr[data-item="{item}"] button[data-action="requeue"]'
        ).click()
    assert cli_json(world.redis_url, PREFIX, "inspect", run, item)["state"] == "pending"
    assert item not in dead_items(world, run)
    page.wait_for_selector("table#shards")
    assert page.locator(f'table#dead-items tr[data-item="{item}"]').count() == 0
    assert number(field(page, "dead")) == dead_before - 1
    assert number(field(page, "pending")) == status(world, run)["counts"]["pending"] >= 1
    assert item in page.content()  # the flash message names it
    screenshot(page, "dashboard-requeued")


# -- RQ, health and metrics --------------------------------------------------------------


def test_rq_pages_list_queues_and_the_busy_worker(
    page: Page, dashboard: Dashboard, world: World, held: str
) -> None:
    response = page.goto(f"{dashboard.url}rq/")
    assert response is not None and response.status == 200
    queues = page.locator("table#queues tr[data-role=queue]")
    queues.first.wait_for()
    names = {queues.nth(n).locator("td").first.inner_text().strip() for n in range(queues.count())}
    assert {jobs.settlement.options.queue, jobs.hold.options.queue} <= names
    page.get_by_role("link", name="RQ workers", exact=True).click()
    busy = page.locator("table#workers tr[data-role=worker]", has_text=jobs.hold.options.queue)
    busy.wait_for()
    assert busy.locator("a").count() == 1, "the busy worker's current job is linked"
    screenshot(page, "dashboard-rq-workers")
    answer = page.request.get(f"{dashboard.url}rq/0/data/workers.json")
    assert answer.status == 200
    workers = [w for w in answer.json()["workers"] if jobs.hold.options.queue in w["queues"]]
    assert len(workers) == 1
    current = workers[0]["current_job"]
    assert isinstance(current, dict), f"the worker looks idle: {workers[0]}"
    busy.locator("a").click()
    page.locator("#summary").wait_for()
    assert page.locator('#summary [data-field="status"]').inner_text() == "started"
    assert page.locator("h1").inner_text() == f"RQ job {current['job_id']}"
    assert world.store.status(held).counts["leased"] == 1, "still held while the page looked"


def test_health_and_metrics(page: Page, dashboard: Dashboard, world: World) -> None:
    health = page.request.get(f"{dashboard.url}healthz")
    assert (health.status, health.text().strip()) == (200, "ok")
    metrics = page.request.get(f"{dashboard.url}metrics")
    assert metrics.status == 200
    families = {f.name: f for f in text_string_to_metric_families(metrics.text())}
    run = world.settlement_run
    done = [
        s.value
        for s in families["redis_lease_items"].samples
        if s.labels.get("run") == run and s.labels.get("state") == "done"
    ]
    assert done == [float(status(world, run)["counts"]["done"])]
    assert done[0] > 0


#: The widths every page is looked at: a laptop's and a small one's.
WIDTHS = (1400, 1024)
#: Cells whose values read badly split (counts, pids, times, states) and buttons.
ONE_LINE = "td.num, td.time, td.nowrap, button"
#: The lines each matching element's text takes, by distinct line tops (a cell's row can be
#: taller than its text, so the text's own boxes are measured, not the cell).
LINES = """
(selector) => [...document.querySelectorAll(selector)].map((el) => {
  const range = document.createRange();
  range.selectNodeContents(el);
  const tops = [...range.getClientRects()].filter((r) => r.width > 0 && r.height > 0)
    .map((r) => Math.round(r.top));
  const lines = [];
  for (const top of tops.sort((a, b) => a - b)) {
    if (!lines.length || top - lines[lines.length - 1] > 4) lines.push(top);
  }
  return {text: el.innerText.trim(), lines: lines.length};
})
"""


def split_cells(page: Page) -> list[str]:
    """The ONE_LINE elements of the page whose text takes more than one line."""
    measured = page.evaluate(LINES, ONE_LINE)
    return [f"{m['text']!r} on {m['lines']} lines" for m in measured if m["lines"] > 1]


def test_pages_keep_counts_times_and_buttons_on_one_line_at_1400_and_1024(
    browser: Browser, dashboard: Dashboard, world: World, held: str
) -> None:
    queue = jobs.settlement.options.queue
    pages = {
        "runs": "",
        "run": f"runs/{quote(world.settlement_run, safe='')}",
        "workers": "workers",
        "rq-queues": "rq/",
        "rq-workers": "rq/0/view/workers",
        "rq-jobs": f"rq/0/view/jobs/{queue}/finished",
    }
    shots = []
    for width in WIDTHS:
        context = browser.new_context(viewport={"width": width, "height": 900})
        try:
            page = context.new_page()
            for name, path in pages.items():
                response = page.goto(f"{dashboard.url}{path}")
                assert response is not None and response.status == 200, path
                page.locator("table").first.wait_for()
                shots.append(screenshot(page, f"layout-{name}-{width}", width))
                assert page.locator(ONE_LINE).count() > 0, name
                if name == "rq-jobs":
                    assert page.locator('button[data-action="delete"]').count() > 0
                assert split_cells(page) == [], (name, width)
                overflow = page.evaluate("document.documentElement.scrollWidth - innerWidth")
                assert overflow <= 0, f"{name} is {overflow} px wider than {width}"
            page.goto(f"{dashboard.url}rq/0/view/workers")
            for column in ("jobs_done", "jobs_failed"):  # RQ writes a counter only once it counts
                cells = page.locator(f'table#workers [data-field="{column}"]')
                assert cells.count() == len(world_rq_workers(page, dashboard)) > 0
                shown = [cells.nth(n).inner_text().strip() for n in range(cells.count())]
                assert all(text.isdigit() for text in shown), (column, shown)
            assert "0" in shown, "a worker that failed no job shows 0"
        finally:
            context.close()
    assert all(shot.stat().st_size > 0 for shot in shots)


def world_rq_workers(page: Page, dashboard: Dashboard) -> list[Any]:
    """The RQ workers, as the dashboard's JSON lists them."""
    answer = page.request.get(f"{dashboard.url}rq/0/data/workers.json")
    assert answer.status == 200
    workers: list[Any] = answer.json()["workers"]
    return workers


def test_the_metrics_link_opens_a_dashboard_page_with_a_way_back(
    page: Page, dashboard: Dashboard, world: World
) -> None:
    page.goto(dashboard.url)
    page.get_by_role("link", name="Metrics", exact=True).click()
    page.locator("table#metrics").wait_for()
    assert page.locator("h1").inner_text() == "Metrics"
    assert page.get_by_role("link", name="Runs", exact=True).count() == 1  # the way back
    raw = page.locator("a#raw-metrics")
    assert raw.get_attribute("href") == "/metrics"
    family = page.locator('tbody[data-family="redis_lease_items"]')
    run = world.settlement_run
    done = family.locator("tr[data-sample]", has_text=f'run="{run}"').filter(has_text='"done"')
    assert done.count() == 1
    expected = status(world, run)["counts"]["done"]
    assert done.locator("td.num").inner_text().strip() == str(expected)
    screenshot(page, "dashboard-metrics", 1400)
    raw.click()
    assert page.url == f"{dashboard.url}metrics"
    assert "redis_lease_items" in page.content()
    page.go_back()
    page.locator("table#metrics").wait_for()


# -- read-only and password -----------------------------------------------------------


def test_a_read_only_dashboard_offers_no_buttons_and_refuses_posts(
    page: Page, world: World
) -> None:
    read_only = start_dashboard(
        world.procs, world.redis_url, PREFIX, "--read-only", name="dashboard-read-only"
    )
    run = world.settlement_run
    open_run(page, read_only, run)
    dead = dead_items(world, run)
    assert page.locator("table#dead-items tr[data-item]").count() == len(dead) > 0
    assert page.locator('button[data-action="requeue"]').count() == 0
    assert page.locator('button[data-action="resume"]').count() == 0
    item = world.dead_items[0]  # never requeued by another test
    assert item in dead
    page.locator(f'table#dead-items tr[data-item="{item}"] a').first.click()
    page.wait_for_selector("table#attempts")
    assert page.locator("button").count() == 0
    for path in (
        f"{page.url}/requeue",
        f"{read_only.url}runs/{quote(run, safe='')}/resume",
        f"{read_only.url}rq/queue/{jobs.settlement.options.queue}/failed/empty",
        f"{read_only.url}rq/requeue/{jobs.settlement.options.queue}",
    ):
        refused = page.request.post(path, max_redirects=0)
        assert refused.status == 403, (path, refused.status)
    requeue_all = page.request.get(f"{read_only.url}rq/requeue/{jobs.settlement.options.queue}")
    assert requeue_all.status == 405  # POST only
    assert page.goto(f"{read_only.url}rq/") is not None
    assert page.locator("form").count() == 0
    assert cli_json(world.redis_url, PREFIX, "inspect", run, item)["state"] == "dead"
    assert status(world, run)["state"] == "partial"


def test_a_dashboard_with_a_password_asks_for_it(browser: Browser, world: World) -> None:
    guarded = start_dashboard(
        world.procs,
        world.redis_url,
        PREFIX,
        "--user",
        "operator",
        "--password",
        "night-shift-7",
        name="dashboard-auth",
    )
    anonymous = browser.new_context()
    try:  # a page without credentials is cancelled by Chromium; its request API shows the 401
        challenge = anonymous.request.get(guarded.url)
        assert challenge.status == 401
        assert "basic" in (challenge.headers.get("www-authenticate") or "").lower()
    finally:
        anonymous.close()
    wrong = browser.new_context(http_credentials={"username": "operator", "password": "nope"})
    try:
        refused = wrong.new_page().goto(guarded.url)
        assert refused is not None and refused.status == 401
    finally:
        wrong.close()
    known = browser.new_context(
        http_credentials={"username": "operator", "password": "night-shift-7"}
    )
    try:
        signed_in = known.new_page()
        answer = signed_in.goto(guarded.url)
        assert answer is not None and answer.status == 200
        signed_in.wait_for_selector(f'#runs tr[data-run="{world.settlement_run}"]')
    finally:
        known.close()


# -- resume ------------------------------------------------------------------------------


def test_resume_clicked_in_the_browser_reopens_a_partial_run(
    page: Page, dashboard: Dashboard, world: World, resumable: str
) -> None:
    open_run(page, dashboard, resumable)
    assert field(page, "state") == "partial"
    with page.expect_navigation():
        page.locator('button[data-action="resume"]').click()
    assert status(world, resumable)["state"] == "running"
    page.wait_for_selector("table#decisions")
    assert field(page, "state") == "running"
    assert "resume" in page.locator("table#decisions").inner_text()
    assert page.locator('button[data-action="resume"]').count() == 0
    assert status(world, world.settlement_run)["state"] == "partial"  # only its own run
