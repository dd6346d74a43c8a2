"""The dashboard's pages and actions through Flask's test client, on the real Redis.

Every number a page shows is compared with the library's own reads
(``store.status``, ``status_by_shard``, the item record, the attempt log); the
actions are checked by what they change in Redis. The pages are read with a
small HTML tree builder (stdlib), by the ids and ``data-*`` attributes of the
dashboard's contract.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import flask
import pytest
import redis
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_lease import LeaseStore
from redis_lease.errors import NotClaimable
from redis_lease.fleet.effects.provider_gate import ProviderGate
from redis_lease.fleet.runs import run_ages
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.runs.run_states import FINAL_STATES, OPEN_STATES, RESUMABLE_STATES
from redis_lease.fleet.transport import shard_jobs
from redis_lease.fleet.transport.shard_job_failures import record_job_failure
from redis_lease.operate.dashboard import create_app
from redis_lease.operate.dashboard import pages as pages_module
from redis_lease.operate.dashboard.security import loopback_hosts
from redis_lease.operate.dashboard.server import wsgi_app
from redis_lease.operate.dashboard.times import short_time
from redis_lease.operate.run_views import deadline_text, projected_finish_text
from redis_lease.operate.views import run_ids_since
from redis_lease.protocol.leases import Item, Lease
from tests.dashboard_pages import csrf_of, link, page, parse, rows_with
from tests.fleet_helpers import wait_for

# -- fixtures -----------------------------------------------------------------------


def dead_item(store: LeaseStore, run: str, item: str, error: str) -> None:
    """Claims the item and fails it for good."""
    store.fail(store.claim(run, item, "w1"), error, permanent=True)


def claim_or_none(store: LeaseStore, run: str, item: str) -> Lease | None:
    try:
        return store.claim(run, item, "w2")
    except NotClaimable:
        return None


def server_ms(store: LeaseStore) -> int:
    seconds, micros = store.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.fixture
def app(real_store: LeaseStore) -> flask.Flask:
    return create_app(real_store, secret_key="test-secret")


@pytest.fixture
def client(app: flask.Flask) -> FlaskClient:
    return app.test_client()


def job_run(store: LeaseStore, run_id: str, items: list[str], **fields: str) -> None:
    """A job's run (the fields Runs.ensure writes) with ``items``, two shards."""
    job, business_date = run_id.split(":", 1)
    store.create_run(run_id, 2, fields={"job": job, "business_date": business_date, **fields})
    store.add(run_id, [Item(i) for i in items])


# -- the runs page ---------------------------------------------------------------------


def test_health_is_not_ok_for_a_run_that_cannot_finish_well(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    """Every item dead: failed before its end; one dead: at risk; planning that failed and
    waits, or that lasts 10 minutes: at risk; planning just begun: ok."""
    store = real_store
    now = server_ms(store)
    ahead = str(now + 3_600_000)
    job_run(store, "alldead:2026-12-01", ["a", "b"], deadline_at=ahead)
    job_run(store, "onedead:2026-12-01", ["a", "b"], deadline_at=ahead)
    for item in ("a", "b"):
        dead_item(store, "alldead:2026-12-01", item, "account closed")
    dead_item(store, "onedead:2026-12-01", "a", "account closed")
    planning = {"job": "p", "deadline_at": ahead}
    for run_id, extra in [
        ("stuck:2026-12-01", {"state_at": str(now - 11 * 60_000)}),
        ("retrying:2026-12-01", {"planning_error": "planning error: the planner raised X: y"}),
        ("fresh:2026-12-01", {}),
    ]:
        store.create_run(run_id, 1, state="planning", fields={**planning, "business_date": "x"})
        if extra:
            store.client.hset(store.keys.run(run_id), mapping=extra)

    rows = rows_with(page(client, "/").one("table", id="runs"), "data-run")
    health = {r.attrs["data-run"]: r.attrs["data-health"] for r in rows}
    assert health == {
        "alldead:2026-12-01": "failed",
        "onedead:2026-12-01": "at-risk",
        "stuck:2026-12-01": "at-risk",
        "retrying:2026-12-01": "at-risk",
        "fresh:2026-12-01": "ok",
    }
    why = {
        r.attrs["data-run"]: r.one("td", **{"class": "health"}).attrs.get("title", "") for r in rows
    }
    assert why["alldead:2026-12-01"] == "every item is dead or lost (2): it can only end failed"
    assert why["onedead:2026-12-01"] == "1 item dead, 0 lost: it can end partial at best"
    assert why["stuck:2026-12-01"].startswith("planning for 11 minutes")
    assert why["retrying:2026-12-01"].endswith("the planner raised X: y")
    assert why["fresh:2026-12-01"] == ""
    shown = page(client, "/runs/alldead:2026-12-01").one("div", id="summary")
    assert "it can only end failed" in shown.text


def test_runs_page_shows_every_run_newest_first_with_the_status_numbers(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    store = real_store
    now = server_ms(store)
    hour = 3_600_000
    job_run(store, "late:2026-12-01", ["a", "b"], deadline_at=str(now - hour))
    job_run(
        store,
        "risky:2026-12-01",
        ["a", "b", "c"],
        deadline_at=str(now + hour),
        projected_finish_at=str(now + 2 * hour),
        planned_items="5",
    )
    job_run(
        store,
        "fine:2026-12-01",
        ["a"],
        deadline_at=str(now + hour),
        projected_finish_at=str(now + hour // 2),
    )
    job_run(store, "broken:2026-12-01", ["a", "b"], deadline_at=str(now - hour))
    store.commit(store.claim("broken:2026-12-01", "a", "w1"))
    dead_item(store, "broken:2026-12-01", "b", "account closed")
    Runs(store).transition("broken:2026-12-01", "running", "partial", "deadline passed")
    store.claim("risky:2026-12-01", "b", "w1")
    dead_item(store, "risky:2026-12-01", "c", "boom")

    runs = page(client, "/").one("table", id="runs")
    rows = rows_with(runs, "data-run")
    assert [r.attrs["data-run"] for r in rows] == run_ids_since(store)
    health = {r.attrs["data-run"]: r.attrs["data-health"] for r in rows}
    assert health == {
        "late:2026-12-01": "late",
        "risky:2026-12-01": "at-risk",
        "fine:2026-12-01": "ok",
        "broken:2026-12-01": "failed",
    }
    # a run the deadline closed is late as well as failed
    shown = {r.attrs["data-run"]: r.one("td", **{"class": "health"}).text for r in rows}
    assert shown["broken:2026-12-01"] == "failed, late" and shown["late:2026-12-01"] == "late"
    assert shown["fine:2026-12-01"] == "ok"
    for row in rows:
        status = store.status(row.attrs["data-run"])
        assert row.field("job") == status.info["job"]
        assert row.field("state") == status.state
        for name in ("done", "dead", "pending", "leased"):
            assert row.field(name) == str(status.counts[name]), name
        assert row.field("planned") == str(status.planned)
        assert row.field("lost") == str(status.lost)
        deadline = deadline_text(status)
        assert deadline is not None and row.one(data_field="deadline").attrs["title"] == deadline
        assert row.field("deadline") == short_time(deadline)  # to the second
        projected = projected_finish_text(status) or ""
        assert row.one(data_field="projected_finish").attrs["title"] == projected
    risky = runs.one("tr", data_run="risky:2026-12-01")
    assert (risky.field("planned"), risky.field("lost")) == ("5", "2")
    assert (risky.field("leased"), risky.field("dead"), risky.field("pending")) == ("1", "1", "1")
    assert risky.one(data_field="projected_finish").attrs["title"] == projected_finish_text(
        store.status("risky:2026-12-01")
    )
    assert runs.one("tr", data_run="broken:2026-12-01").field("projected_finish") == ""
    assert link(risky, "risky:2026-12-01") == "/runs/risky:2026-12-01"


def test_runs_page_pages_through_the_runs(
    real_store: LeaseStore, client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages_module, "RUNS_PER_PAGE", 2)
    for name in ("r1", "r2", "r3"):
        real_store.add(name, [Item("a")])
    newest_first = run_ids_since(real_store)
    first = page(client, "/")
    assert [r.attrs["data-run"] for r in rows_with(first, "data-run")] == newest_first[:2]
    second = page(client, link(first, "older"))
    assert [r.attrs["data-run"] for r in rows_with(second, "data-run")] == newest_first[2:]
    assert not [a for a in second.all("a") if a.text == "older"]
    for bad in ("0", "x", "%C2%B2"):  # the last a superscript two: a digit, not a number
        message = page(client, f"/?page={bad}", 400).one(id="error-message").text
        assert "not a page number" in message, bad


# -- the run page ------------------------------------------------------------------------


def test_run_page_shows_shards_chart_decisions_failures_dead_items_and_providers(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    store = real_store
    run = "nightly:2026-12-02"
    job_run(store, run, [f"i{n}" for n in range(8)])
    store.commit(store.claim(run, "i0", "w1"))
    store.claim(run, "i1", "w1")
    dead_item(store, run, "i2", "provider 503: upstream down")
    dead_item(store, run, "i3", "account closed")
    record_job_failure(store, run, 1, "ImportError: cannot import app.jobs")
    Runs(store).record_decision(run, "created", "run for 2026-12-02")
    status = store.status(run)
    now = server_ms(store)
    for step in range(3):
        run_ages.record(store, status, now + step * run_ages.MIN_INTERVAL_MS)
    gate = ProviderGate(store, "bank", max_concurrency=4)
    before = store.status(run).oldest_eligible_age_seconds
    with gate.slot():
        view = page(client, f"/runs/{run}")
    status, shard_counts = store.status_by_shard(run)
    after = status.oldest_eligible_age_seconds
    summary = view.one(id="summary")
    for name in ("done", "dead", "pending", "leased"):
        assert summary.field(name) == str(status.counts[name])
    assert summary.field("state") == status.state == "running"
    assert summary.field("planned") == str(status.planned)
    assert summary.field("lost") == str(status.lost)
    assert after > 0  # pending items have waited since they were added
    assert before - 0.05 <= float(summary.field("oldest_eligible_age")) <= after + 0.05
    shards = view.one("table", id="shards")
    for number, counts in enumerate(shard_counts):
        row = shards.one("tr", data_shard=str(number))
        for name in ("done", "pending", "leased", "dead"):
            assert row.field(name) == str(counts[name])
    chart = view.one("svg", id="age-chart")
    assert chart.attrs["data-samples"] == "3"
    assert len(chart.one("polyline").attrs["points"].split()) == 3
    decisions = view.one("table", id="decisions")
    assert [d.text for d in decisions.all(data_field="kind")] == ["created"]
    failures = view.one("table", id="job-failures")
    assert failures.field("count") == "1"
    assert "shard 1: ImportError: cannot import app.jobs" in failures.field("last_error")
    dead = view.one("table", id="dead-items")
    rows = {r.attrs["data-item"]: r for r in rows_with(dead, "data-item")}
    assert set(rows) == {"i2", "i3"}
    assert rows["i2"].field("error") == "provider 503: upstream down"
    assert link(rows["i3"], "i3") == f"/runs/{run}/items/i3"
    assert rows["i3"].has("button", data_action="requeue")
    bank = view.one("table", id="providers").one("tr", data_provider="bank")
    assert (bank.field("cap"), bank.field("in_use")) == ("4", "1")
    assert not view.has("button", data_action="resume")  # running: nothing to resume


def test_run_page_without_samples_failures_or_dead_items(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    real_store.add("quiet", [Item("a")])
    view = page(client, "/runs/quiet")
    chart = view.one("svg", id="age-chart")
    assert chart.attrs["data-samples"] == "0" and not chart.has("polyline")
    assert "none" in view.one("table", id="job-failures").text
    assert not rows_with(view.one("table", id="dead-items"), "data-item")


def test_unknown_run_and_item_are_a_404_page_that_says_so(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    missing = page(client, "/runs/nope:2026-12-02", 404)
    said = missing.one(id="error-message").text
    assert said.startswith("There is no run 'nope:2026-12-02'. The runs page lists every run")
    assert "`" not in said and "redis-lease" not in said, "a page's words, not a command line's"
    assert missing.one("h1").text == "Not found"
    assert link(missing, "All runs") == "/"
    real_store.add("r", [Item("a")])
    item = page(client, "/runs/r/items/zz", 404).one(id="error-message").text
    assert "zz" in item and "not found" in item
    gone = page(client, "/runs/nope/items/a", 404).one(id="error-message").text
    assert "nope" in gone


def test_item_page_of_an_expired_run_says_it_is_gone(real_store: LeaseStore) -> None:
    real_store.add("old:2026-01-01", [Item("a")])
    real_store.client.delete(real_store.keys.run("old:2026-01-01"))  # its record expired
    fresh = LeaseStore(real_store.client, prefix=real_store.prefix)  # no cached shard count
    client = create_app(fresh).test_client()
    for url in ("/runs/old:2026-01-01", "/runs/old:2026-01-01/items/a"):
        message = page(client, url, 404).one(id="error-message").text
        assert "run 'old:2026-01-01' is gone" in message, url


@pytest.mark.parametrize(
    ("run", "item"),
    [
        ("pay:2026-12-02/eu-west", "acct:42@bank+x=1/2"),
        ("x/items/y", "a/b"),
        ("a/b", "x/items/y"),
        ("r:1", "r:1"),
        ("x", "items/y/requeue"),
    ],
)
def test_ids_with_colons_slashes_and_other_characters_round_trip(
    real_store: LeaseStore, client: FlaskClient, run: str, item: str
) -> None:
    real_store.add(run, [Item(item), Item("other:1")], shards=2)
    dead_item(real_store, run, item, "closed")
    runs = page(client, "/")
    href = link(runs, run)
    assert href.count("/") == 2, href  # /runs/<one segment>
    view = page(client, href)
    assert view.one("h1").text == f"Run {run}"
    assert view.one(id="summary").field("dead") == "1"
    row = view.one("table", id="dead-items").one("tr", data_item=item)
    one = page(client, link(row, item))
    assert one.one("h1").text == f"Item {item}"
    summary = one.one(id="summary")
    assert (summary.field("state"), summary.field("attempts")) == ("dead", "1")
    assert link(one, f"run {run}") == href
    form = row.one("form")
    response = client.post(form.attrs["action"], data={"csrf_token": csrf_of(view)})
    assert response.status_code == 303 and response.headers["Location"] == href
    assert real_store.item(run, item).state == "pending"
    assert real_store.item(run, "other:1").state == "pending"


def test_an_id_in_a_url_is_one_segment_with_tilde_for_slash(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    real_store.add("x/items/y", [Item("a/b")])
    real_store.add("x", [Item("y")])
    view = page(client, "/runs/x~items~y/items/a~b")
    assert view.one(id="summary").field("state") == "pending"
    assert view.one("h1").text == "Item a/b"
    assert page(client, "/runs/x/items/y").one("h1").text == "Item y"  # run x, item y
    page(client, "/runs/x/items/y/items/a/b", 404)  # a slash never splits an id


def test_an_id_with_a_space_is_refused_with_a_clear_message(client: FlaskClient) -> None:
    message = page(client, "/runs/a%20b", 400).one(id="error-message").text
    assert "invalid run id 'a b'" in message and "no braces, '#', spaces" in message


# -- the item page -----------------------------------------------------------------------


def test_item_page_shows_the_record_effects_and_attempts_with_trace_ids(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    store = real_store
    store.add("r", [Item("a", {"n": 1}), Item("b")], backoff_base=0.001, backoff_cap=0.001)
    first = store.claim("r", "a", "w1")
    store.fail(first, "provider 503")
    second = wait_for(lambda: claim_or_none(store, "r", "a"), 10, "the retry to be due")
    store.record_effect(second, "r|a|pay", "pay", "intended")
    store.record_effect(second, "r|a|pay", "pay", "applied", {"ref": "p-9"})
    view = page(client, "/runs/r/items/a")
    record = store.item("r", "a")
    summary = view.one(id="summary")
    assert summary.field("state") == record.state == "leased"
    assert summary.field("token") == str(record.token)
    assert summary.field("attempts") == str(record.attempts) == "2"
    effects = view.one("table", id="effects")
    (pay,) = effects.all("tr", data_effect="pay")
    assert pay.field("state") == "applied" and "p-9" in pay.text
    attempts = view.one("table", id="attempts")
    traces = [cell.text for cell in attempts.all(data_field="trace")]
    expected = [a.trace_id for a in store.attempts("r", "a", limit=50)]
    assert traces == expected and first.trace_id in traces
    assert "provider 503" in view.one("table", id="errors").text
    assert not view.has("button", data_action="requeue")  # not dead


# -- actions ---------------------------------------------------------------------------


def test_requeue_makes_the_dead_item_pending_and_says_so(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    real_store.add("r", [Item("a"), Item("b")])
    dead_item(real_store, "r", "a", "boom")
    view = page(client, "/runs/r")
    form = view.one("table", id="dead-items").one("tr", data_item="a").one("form")
    response = client.post(form.attrs["action"], data={"csrf_token": csrf_of(view)})
    assert response.status_code == 303 and response.headers["Location"] == "/runs/r"
    record = real_store.item("r", "a")
    assert (record.state, real_store.status("r").counts["dead"]) == ("pending", 0)
    after = page(client, "/runs/r")
    assert "item a requeued" in after.text
    again = client.post(form.attrs["action"], data={"csrf_token": csrf_of(view)})
    assert again.status_code == 303
    assert "item a is not dead" in page(client, "/runs/r").text


def test_requeue_from_the_item_page_goes_back_to_it(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    real_store.add("r", [Item("a")])
    dead_item(real_store, "r", "a", "boom")
    view = page(client, "/runs/r/items/a")
    assert view.one("button", data_action="requeue").text == "Requeue"
    action = next(f for f in view.all("form") if f.has("button", data_action="requeue"))
    response = client.post(
        action.attrs["action"], data={"csrf_token": csrf_of(view), "back": "item"}
    )
    assert response.headers["Location"] == "/runs/r/items/a"
    assert real_store.item("r", "a").state == "pending"


def test_a_post_without_a_valid_csrf_token_is_refused(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    real_store.add("r", [Item("a")])
    dead_item(real_store, "r", "a", "boom")
    page(client, "/runs/r")  # a session exists, with its token
    missing = client.post("/runs/r/items/a/requeue")
    assert missing.status_code == 400
    assert "CSRF token is missing" in parse(missing.data).one(id="error-message").text
    forged = client.post("/runs/r/items/a/requeue", data={"csrf_token": "forged"})
    assert forged.status_code == 400
    assert client.post("/runs/r/resume").status_code == 400
    assert real_store.item("r", "a").state == "dead"


def test_resume_reopens_a_partial_run_with_a_new_deadline(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    store = real_store
    store.add("r", [Item("a"), Item("b")])
    store.commit(store.claim("r", "a", "w1"))
    Runs(store).finalize("r", "deadline passed")
    assert store.status("r").state == "partial"
    view = page(client, "/runs/r")
    assert view.has("button", data_action="resume")
    form = next(f for f in view.all("form") if f.has("button", data_action="resume"))
    assert form.one("input", name="hours").attrs["value"] == "2"  # its deadline has passed
    said = " ".join(form.one(data_field="resume-text").text.split())
    assert said.startswith("This run ended partial and its deadline has passed. Resume it")
    token = csrf_of(view)
    refused = client.post(form.attrs["action"], data={"csrf_token": token})
    assert refused.status_code == 303
    assert "not resumed" in page(client, "/runs/r").text  # no deadline: it is past
    assert store.status("r").state == "partial"
    bad = client.post(form.attrs["action"], data={"csrf_token": token, "hours": "-1"})
    assert bad.status_code == 303 and "give hours from now" in page(client, "/runs/r").text
    done = client.post(form.attrs["action"], data={"csrf_token": token, "hours": "2"})
    assert done.status_code == 303
    assert store.status("r").state == "running"
    after = page(client, "/runs/r")
    assert "run r resumed" in after.text
    assert not after.has("button", data_action="resume")
    assert store.claim("r", "b", "w1").item_id == "b"  # claims are granted again


@pytest.mark.parametrize("state", [*OPEN_STATES, *FINAL_STATES])
def test_resume_is_offered_exactly_for_the_resumable_states(
    real_store: LeaseStore, client: FlaskClient, state: str
) -> None:
    real_store.add("r", [Item("a")])
    if state != "running":
        assert Runs(real_store).transition("r", "running", state, "set by the test")
    offered = page(client, "/runs/r").has("button", data_action="resume")
    assert offered == (state in RESUMABLE_STATES)


def test_resume_of_a_canceled_run_is_refused_with_its_reason(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    job_run(real_store, "j:2026-12-03", ["a"], deadline_at=str(server_ms(real_store) + 60_000))
    dead_item(real_store, "j:2026-12-03", "a", "boom")  # its requeue form carries a token
    assert Runs(real_store).cancel("j:2026-12-03")
    view = page(client, "/runs/j:2026-12-03")
    response = client.post("/runs/j:2026-12-03/resume", data={"csrf_token": csrf_of(view)})
    assert response.status_code == 303
    shown = page(client, "/runs/j:2026-12-03").text
    assert "not resumed: run 'j:2026-12-03' is canceled, which is final" in shown
    assert real_store.status("j:2026-12-03").state == "canceled"


def test_resume_keeps_a_deadline_still_ahead(real_store: LeaseStore, client: FlaskClient) -> None:
    store = real_store
    ahead = server_ms(store) + 3_600_000
    job_run(store, "j:2026-12-02", ["a", "b"], deadline_at=str(ahead))
    dead_item(store, "j:2026-12-02", "a", "boom")
    store.commit(store.claim("j:2026-12-02", "b", "w1"))
    Runs(store).finalize("j:2026-12-02", "all items finished")
    view = page(client, "/runs/j:2026-12-02")
    form = next(f for f in view.all("form") if f.has("button", data_action="resume"))
    assert form.one("input", name="hours").attrs["value"] == ""
    response = client.post(form.attrs["action"], data={"csrf_token": csrf_of(view)})
    assert response.status_code == 303
    assert store.status("j:2026-12-02").state == "running"
    assert store.status("j:2026-12-02").info["deadline_at"] == str(ahead)


def test_read_only_shows_no_buttons_and_refuses_every_post(real_store: LeaseStore) -> None:
    store = real_store
    store.add("r", [Item("a"), Item("b")])
    dead_item(store, "r", "a", "boom")
    store.commit(store.claim("r", "b", "w1"))
    Runs(store).finalize("r", "deadline passed")
    client = create_app(store, read_only=True).test_client()
    view = page(client, "/runs/r")
    assert view.one("table", id="dead-items").has("tr", data_item="a")
    assert not view.has("button", data_action="requeue")
    assert not view.has("button", data_action="resume")
    assert not page(client, "/runs/r/items/a").has("button", data_action="requeue")
    assert client.post("/runs/r/items/a/requeue").status_code == 403
    assert client.post("/runs/r/resume", data={"hours": "2"}).status_code == 403
    assert client.post("/rq/queue/default/compact").status_code == 403  # RQ's too
    assert store.item("r", "a").state == "dead" and store.status("r").state == "partial"


# -- auth, proxy, metrics, health --------------------------------------------------------


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_basic_auth_guards_every_page_but_healthz(real_store: LeaseStore) -> None:
    real_store.add("r", [Item("a")])
    client = create_app(real_store, auth=("ops", "s3cret:pass")).test_client()
    for url in ("/", "/runs/r", "/runs/r/items/a", "/metrics", "/rq/"):
        refused = client.get(url)
        assert refused.status_code == 401, url
        assert refused.headers["WWW-Authenticate"].startswith("Basic realm=")
        assert client.get(url, headers=basic("ops", "wrong")).status_code == 401
        assert client.get(url, headers=basic("ops", "s3cret:pass")).status_code == 200, url
    assert client.post("/runs/r/items/a/requeue").status_code == 401  # before CSRF
    assert client.get("/healthz").status_code == 200


def test_behind_a_proxy_links_keep_the_forwarded_prefix(real_store: LeaseStore) -> None:
    real_store.add("r:1", [Item("a")])
    dead_item(real_store, "r:1", "a", "boom")
    app = create_app(real_store, hosts=None)
    app.wsgi_app = wsgi_app(app, behind_proxy=True)  # type: ignore[method-assign]
    client = app.test_client()
    headers = {
        "X-Forwarded-Prefix": "/ops/lease",
        "X-Forwarded-Host": "ops.example.com",
        "X-Forwarded-Proto": "https",
        "X-Forwarded-For": "10.0.0.9",
    }
    runs = page(client, "/", headers=headers)
    assert link(runs, "r:1") == "/ops/lease/runs/r:1"
    assert link(runs, "RQ queues") == "/ops/lease/rq/"
    view = page(client, "/runs/r:1", headers=headers)
    form = view.one("table", id="dead-items").one("form")
    assert form.attrs["action"] == "/ops/lease/runs/r:1/items/a/requeue"
    response = client.post(
        "/runs/r:1/items/a/requeue",
        data={"csrf_token": csrf_of(view)},
        headers={**headers, "Referer": "https://ops.example.com/ops/lease/runs/r:1"},
    )
    assert response.status_code == 303
    assert response.headers["Location"] == "/ops/lease/runs/r:1"
    plain = create_app(real_store).test_client()  # not behind a proxy: headers ignored
    assert link(page(plain, "/", headers=headers), "r:1") == "/runs/r:1"


def test_metrics_are_the_lease_collectors_and_parse(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    real_store.add("r:1", [Item("a"), Item("b"), Item("c")])
    dead_item(real_store, "r:1", "a", "boom")
    response = client.get("/metrics")
    assert response.status_code == 200 and response.mimetype == "text/plain"
    families = {f.name: f for f in text_string_to_metric_families(response.get_data(as_text=True))}
    items = {
        s.labels["state"]: s.value
        for s in families["redis_lease_items"].samples
        if s.labels["run"] == "r:1"
    }
    status = real_store.status("r:1")
    assert items == {state: float(count) for state, count in status.counts.items()}


def test_healthz_says_whether_redis_answers_and_nothing_more(
    client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    ok = client.get("/healthz")
    assert (ok.status_code, ok.get_data(as_text=True)) == (200, "ok\n")
    nowhere = redis.Redis(port=1, socket_connect_timeout=1)
    url = "redis://ops:hunter2@127.0.0.1:1/0"
    down = create_app(LeaseStore(nowhere, url=url), auth=("u", "p")).test_client()
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="redis_lease.dashboard.app"):
        refused = down.get("/healthz")  # no login asked
    assert (refused.status_code, refused.get_data(as_text=True)) == (503, "redis unavailable\n")
    assert time.monotonic() - started < 30  # no retries waited out: not the socket timeout
    logged = caplog.text
    assert "127.0.0.1:1" in logged and "hunter2" not in logged  # the detail, masked


# -- secrets, hosts, headers, cookies, escaping -------------------------------------------

SECRET_URLS = (
    "redis://ops:hunter2-userinfo@127.0.0.1:6379/0",
    "redis://127.0.0.1:6379/0?password=hunter2-query&db=0",
    "redis://:hunter2-bare@127.0.0.1:6379/0?ssl_password=hunter2-ssl",
)


@pytest.mark.parametrize("url", SECRET_URLS)
def test_no_page_shows_the_redis_password(
    real_store: LeaseStore, queue_name: str, url: str
) -> None:
    secrets_in_url = [part for part in url.replace("@", "&").split("&") if "hunter2" in part]
    assert secrets_in_url
    real_store.add("r:1", [Item("a")])
    dead_item(real_store, "r:1", "a", "boom")
    shard_jobs.queue(real_store.client, queue_name).enqueue("builtins.len", "abc")
    store = LeaseStore(real_store.client, prefix=real_store.prefix, url=url)
    client = create_app(store).test_client()
    down = redis.Redis(port=1, socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    broken = create_app(LeaseStore(down, prefix=real_store.prefix, url=url)).test_client()
    answers = [
        client.get(path)
        for path in (
            "/",
            "/rq/",
            "/rq/0/view/workers",
            "/rq/0/data/queues.json",
            f"/rq/0/view/jobs/{queue_name}/queued",
            "/runs/r:1",
            "/runs/r:1/items/a",
            "/runs/nope",
            "/healthz",
            "/metrics",
        )
    ] + [broken.get(path) for path in ("/", "/runs/r:1", "/healthz")]
    assert [a.status_code for a in answers[-3:]] == [503, 503, 503]
    rq_page = answers[1].get_data(as_text=True)
    assert "127.0.0.1:6379" in rq_page  # the URL is shown, masked
    for answer in answers:
        text = answer.get_data(as_text=True)
        assert "hunter2" not in text, (answer.request.path, text[-1500:])


def test_a_request_for_another_host_is_refused(real_store: LeaseStore, client: FlaskClient) -> None:
    real_store.add("r", [Item("a")])
    for host in ("evil.example", "evil.example:8050", "127.0.0.1.evil.example"):
        refused = client.get("/", headers={"Host": host})
        assert refused.status_code == 400, host
        assert "is not one this dashboard answers to" in refused.get_data(as_text=True)
    assert client.get("/healthz", headers={"Host": "evil.example"}).status_code == 400
    for host in ("localhost", "127.0.0.1:8050", "LOCALHOST:1", "[::1]:8050"):
        assert client.get("/runs/r", headers={"Host": host}).status_code == 200, host
    bound = create_app(real_store, hosts=loopback_hosts("127.0.0.2")).test_client()
    assert bound.get("/", headers={"Host": "127.0.0.2:8050"}).status_code == 200
    anywhere = create_app(real_store, hosts=None).test_client()
    assert anywhere.get("/", headers={"Host": "evil.example"}).status_code == 200


def test_a_csrf_token_outlives_an_hour(
    real_store: LeaseStore, client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import itsdangerous.timed

    real_store.add("r", [Item("a")])
    dead_item(real_store, "r", "a", "boom")
    view = page(client, "/runs/r")
    later = time.time() + 5 * 3600  # the page was left open for five hours
    monkeypatch.setattr(itsdangerous.timed, "time", type("Clock", (), {"time": lambda: later}))
    form = view.one("table", id="dead-items").one("form")
    response = client.post(form.attrs["action"], data={"csrf_token": csrf_of(view)})
    assert response.status_code == 303, response.get_data(as_text=True)[-800:]
    assert real_store.item("r", "a").state == "pending"


def policy(response: Any) -> dict[str, str]:
    """The response's Content-Security-Policy, directive -> sources."""
    text = response.headers["Content-Security-Policy"]
    parts = [part.strip().split(None, 1) for part in text.split(";") if part.strip()]
    return {name: rest for name, rest in ((p[0], p[1] if len(p) > 1 else "") for p in parts)}


def test_every_response_carries_the_security_headers(
    real_store: LeaseStore, client: FlaskClient, queue_name: str
) -> None:
    real_store.add("r", [Item("a")])
    job = shard_jobs.queue(real_store.client, queue_name).enqueue("builtins.len", "abc")
    pages = ("/", "/runs/r", "/runs/r/items/a", "/runs/nope", "/metrics", "/healthz")
    rq_pages = ("/rq/", "/rq/0/view/workers", f"/rq/0/view/jobs/{queue_name}/queued")
    rq_data = ("/rq/0/data/queues.json", f"/rq/0/view/job/{job.id}", "/rq/0/data/job/x.json")
    assets = ("/static/dashboard.css", "/static/live.js")
    for path in (*pages, *rq_pages, *rq_data, *assets):
        with client.get(path) as response:
            body = response.get_data()
        assert response.headers["X-Frame-Options"] == "DENY", path
        assert response.headers["X-Content-Type-Options"] == "nosniff", path
        assert response.headers["Referrer-Policy"] == "same-origin", path
        directives = policy(response)
        assert directives["default-src"] == "'self'", path
        assert directives["frame-ancestors"] == "'none'", path
        assert directives["script-src"] == directives["style-src"] == "'self'", path
        assert "unsafe" not in response.headers["Content-Security-Policy"], path
        if response.mimetype == "text/html":  # no inline script, style or handler at all
            for node in parse(body).walk():
                assert node.tag != "style" and "style" not in node.attrs, (path, node.tag)
                assert not [name for name in node.attrs if name.startswith("on")], path
                if node.tag == "script":
                    assert node.attrs["src"].startswith("/static/") and not node.text, path
    styled = parse(client.get("/runs/r").data)
    assert [n.attrs["href"] for n in styled.all("link")] == ["/static/dashboard.css"]
    assert [n.attrs["src"] for n in styled.all("script")] == ["/static/live.js"]


def test_cookies_are_secure_when_the_request_came_over_https(real_store: LeaseStore) -> None:
    real_store.add("r", [Item("a")])
    dead_item(real_store, "r", "a", "boom")
    app = create_app(real_store, hosts=None)
    app.wsgi_app = wsgi_app(app, behind_proxy=True)  # type: ignore[method-assign]

    def cookies(proto: str) -> list[str]:
        client = app.test_client()
        headers = {"X-Forwarded-Proto": proto}
        got = client.get("/runs/r", headers=headers).headers.getlist("Set-Cookie")
        return got

    tls = cookies("https")
    assert {c.split("=", 1)[0] for c in tls} == {"redis_lease_dashboard"}
    assert all("; Secure" in c for c in tls), tls
    plain = cookies("http")
    assert len(plain) == 1 and not any("Secure" in c for c in plain), plain


SCRIPT = "<script>alert(1)</script>"


def test_html_in_errors_payloads_and_reasons_is_shown_as_text(
    real_store: LeaseStore, client: FlaskClient
) -> None:
    store = real_store
    store.add("r", [Item("a", {"note": SCRIPT}), Item("b")])
    dead_item(store, "r", "a", f"provider said {SCRIPT}")
    record_job_failure(store, "r", 0, f"ImportError {SCRIPT}")
    Runs(store).record_decision("r", "created", f"because {SCRIPT}")
    run_page = client.get("/runs/r").get_data(as_text=True)
    item_page = client.get("/runs/r/items/a").get_data(as_text=True)
    for text in (run_page, item_page):
        assert "alert(1)" in text and SCRIPT not in text and "<script>alert" not in text
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert run_page.count(escaped) == 3  # the dead item's error, the job failure, the reason
    assert escaped in item_page  # the error
    view = parse(item_page)
    assert SCRIPT in view.one("table", id="errors").text  # shown, as text
    assert "alert(1)" in view.one("table", id="record").text  # the payload, as JSON
