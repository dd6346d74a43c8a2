"""The dashboard's pages: runs, one run, one item, the workers; and its two actions,
requeue and resume.

Every number comes from the same library reads and rows as the CLI's views
(:mod:`redis_lease.operate.views`, :mod:`redis_lease.operate.run_views`); the actions make the same
calls as ``redis-lease requeue`` and ``redis-lease resume``. Ids are in URLs as one
path segment each (:mod:`.ids`). A part of a page whose data cannot be read (bytes that
are not UTF-8, a record that does not parse) is a note (:mod:`.unreadable`), and a run id
listed in Redis that is not a valid id is a row saying so: the rest of the page shows.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flask import Blueprint, current_app, flash, redirect, render_template, request, url_for
from flask.blueprints import BlueprintSetupState
from werkzeug.wrappers import Response

from ...errors import InvalidInput, NotFound
from ...fleet.runs import run_ages
from ...fleet.runs.lifecycle import Runs
from ...fleet.runs.run_control import new_deadline, requeue_items
from ...fleet.runs.run_states import RESUMABLE_STATES
from ...fleet.transport.shard_job_failures import JobFailures, job_failures
from ...limits import PAGE_SIZE, RESUME_HOURS, RESUME_HOURS_MAX
from ...protocol.connection.clients import as_text
from ...protocol.leases import ItemRecord, RunStatus
from ...protocol.store.declared_jobs import declared_jobs
from ...protocol.store.lease_store import LeaseStore
from ...protocol.validation import check_id
from ..cli_printing import iso_time
from ..run_views import (
    attempt_rows,
    deadline_ms,
    decision_rows,
    effect_row,
    provider_rows,
    record_dict,
    run_row,
)
from ..views import Page, item_effects, items_page, providers, run_statuses
from ..worker_views import worker_rows
from .charts import age_chart
from .ids import CONVERTER, IdConverter
from .unreadable import Unreadable, is_unreadable, readable, unreadable

pages = Blueprint("pages", __name__)


@pages.record_once
def _setup(state: BlueprintSetupState) -> None:
    """Before the routes are added: the id converter, and ``iso_time`` for the templates."""
    state.app.url_map.converters[CONVERTER] = IdConverter
    state.app.add_template_filter(iso_time, "iso_time")
    state.app.jinja_env.tests["unreadable"] = is_unreadable


#: Runs per page of the runs page, dead items per page of a run page.
RUNS_PER_PAGE = PAGE_SIZE
DEAD_PER_PAGE = PAGE_SIZE
#: Attempts shown on an item page, newest first.
ATTEMPTS_SHOWN = PAGE_SIZE
#: Resume may set a new deadline RESUME_HOURS_MAX hours ahead at most; the form offers
#: the default when the run's own deadline has passed.
RESUME_HOURS_DEFAULT = RESUME_HOURS


def _store() -> LeaseStore:
    store: LeaseStore = current_app.extensions["redis_lease_store"]
    return store


def _read_only() -> bool:
    return bool(current_app.config["REDIS_LEASE_READ_ONLY"])


@pages.get("/")
def runs() -> str:
    """Every run, newest first, a page at a time."""
    page = request.args.get("page", "1")
    if not (page.isascii() and page.isdigit()) or int(page) < 1:
        raise InvalidInput(f"page {page!r} is not a page number (1, 2, ...)")
    number = int(page)
    run_ids = _run_ids(_store())
    start = (number - 1) * RUNS_PER_PAGE
    rows = [_run_row(_store(), run_id) for run_id in run_ids[start : start + RUNS_PER_PAGE]]
    return render_template(
        "runs.html",
        rows=[row for row in rows if row is not None],
        page=number,
        pages=max(1, -(-len(run_ids) // RUNS_PER_PAGE)),
        total=len(run_ids),
    )


def _run_ids(store: LeaseStore) -> list[str | Unreadable]:
    """Every run id, newest first (as :func:`redis_lease.operate.views.run_ids_since` reads
    them); an
    entry that is not a valid run id is :class:`Unreadable`, holding it as text."""
    with store.translating_errors():
        listed = store.client.zrevrangebyscore(store.keys.runs, "+inf", "-inf")
    found: list[str | Unreadable] = []
    for entry in listed:
        try:
            found.append(check_id(as_text(entry), "run id"))
        except UnicodeDecodeError as error:
            found.append(unreadable("a run id", error))
        except InvalidInput as error:
            found.append(Unreadable("a run id", str(error)[:300], as_text(entry)[:300]))
    return found


def _run_row(store: LeaseStore, run_id: str | Unreadable) -> dict[str, Any] | Unreadable | None:
    """The runs page's row of a run (None when its record has expired meanwhile)."""
    if isinstance(run_id, Unreadable):
        return run_id

    def row() -> dict[str, Any] | None:  # the CLI's rule: a lost run shows as lost
        statuses = list(run_statuses(store, [run_id]))
        return run_row(statuses[0]) if statuses else None

    return readable(f"run {run_id}", row)


def _status_by_shard(store: LeaseStore, run_id: str) -> tuple[RunStatus, list[dict[str, int]]]:
    """The run's status and its shards' counts; NotFound (saying when it is gone) otherwise."""
    check_id(run_id, "run id")
    try:
        return store.status_by_shard(run_id)
    except NotFound:
        raise no_run(store, run_id) from None


def no_run(store: LeaseStore, run_id: str) -> NotFound:
    """The 404 of a run with no record, in a page's words: gone or lost when something
    shows it existed (what to do then), else that there is no such run."""
    return Runs(store).gone(run_id) or NotFound(
        f"There is no run {run_id!r}. The runs page lists every run; a run is made when its "
        "job's schedule falls due, or when items are added to it.",
        run_id=run_id,
    )


@pages.get("/workers")
def workers() -> str:
    """The worker processes, as ``redis-lease workers`` lists them, the tick leader marked,
    and each declared job no leader ticks named with why."""
    store = _store()
    fleet = declared_jobs(store)
    return render_template("workers.html", rows=worker_rows(store, fleet), fleet=fleet)


@pages.get("/runs/<id:run_id>")
def run(run_id: str) -> str:
    """One run: counts by shard, the age chart, decisions, failures, dead items, providers."""
    store = _store()
    read = readable(f"run {run_id}'s record", lambda: _status_by_shard(store, run_id))
    status, shards = (None, []) if isinstance(read, Unreadable) else read
    cursor = request.args.get("dead_cursor")
    dead = readable(
        "its dead items", lambda: items_page(store, run_id, "dead", DEAD_PER_PAGE, cursor)
    )
    return render_template(
        "run.html",
        run_id=run_id,
        unreadable_record=read if isinstance(read, Unreadable) else None,
        row=None if status is None else run_row(status),
        status=status,
        shards=shards,
        chart=readable("its age history", lambda: age_chart(run_ages.read(store, run_id))),
        decisions=readable("its decision log", lambda: decision_rows(store, run_id)),
        failures=None if status is None else _failures(status),
        dead=dead if isinstance(dead, Unreadable) else _dead_rows(dead),
        dead_cursor=None if isinstance(dead, Unreadable) else dead.next_cursor,
        providers=readable("the provider gates", lambda: provider_rows(providers(store))),
        can_resume=bool(status and status.state in RESUMABLE_STATES) and not _read_only(),
        resume_hours="" if status is None else _resume_hours(status),
        read_only=_read_only(),
    )


def _failures(status: RunStatus) -> JobFailures | Unreadable:
    """The run's failed shard jobs, from its record."""
    return readable("its failed shard jobs", lambda: job_failures(status.info))


def _dead_rows(dead: Page) -> list[tuple[ItemRecord, int | None]]:
    """A page of dead items as (record, when it died) rows."""
    return list(zip(dead.records, dead.times_ms, strict=True))


def _resume_hours(status: RunStatus) -> str:
    """The resume form's new deadline: none while the run's own is ahead, else a few hours."""
    deadline = deadline_ms(status)
    return "" if deadline is not None and deadline > status.now_ms else str(RESUME_HOURS_DEFAULT)


@pages.get("/runs/<id:run_id>/items/<id:item_id>")
def item(run_id: str, item_id: str) -> str:
    """One item: its record and last errors, its effect records, its attempts."""
    store = _store()
    check_id(run_id, "run id")
    check_id(item_id, "item id")
    try:
        store.shard_count(run_id)
    except NotFound:
        raise no_run(store, run_id) from None
    record = readable(f"item {item_id}'s record", lambda: store.item(run_id, item_id))
    effects = readable(
        "its effect records",
        lambda: [(key, effect_row(rec)) for key, rec in item_effects(store, run_id, item_id)],
    )
    return render_template(
        "item.html",
        run_id=run_id,
        item_id=item_id,
        record=record,
        data=None if isinstance(record, Unreadable) else record_dict(record),
        effects=effects,
        attempts=readable(
            "its attempt log", lambda: attempt_rows(store, run_id, item_id, ATTEMPTS_SHOWN)
        ),
        read_only=_read_only(),
    )


@pages.post("/runs/<id:run_id>/items/<id:item_id>/requeue")
def requeue(run_id: str, item_id: str) -> Response:
    """Moves a dead item back to pending (``redis-lease requeue RUN ITEM``)."""
    if requeue_items(_store(), run_id, [item_id]):
        flash(f"item {item_id} requeued: pending again, with fresh attempts", "ok")
    else:
        flash(f"item {item_id} is not dead: left as it is", "error")
    return back()


def back() -> Response:
    """303 to the page an action's form was on: the item's page when the form says so,
    else the run's."""
    args = request.view_args or {}
    if request.form.get("back") == "item" and "item_id" in args:
        return redirect(url_for("pages.item", run_id=args["run_id"], item_id=args["item_id"]), 303)
    return redirect(url_for("pages.run", run_id=args["run_id"]), code=303)


@pages.post("/runs/<id:run_id>/resume")
def resume(run_id: str) -> Response:
    """Reopens a run in RESUMABLE_STATES (``redis-lease resume RUN [--deadline]``)."""
    store = _store()
    check_id(run_id, "run id")
    runs_ = Runs(store)
    hours_text = request.form.get("hours", "").strip()
    try:
        deadline = None
        if hours_text:
            hours = float(hours_text)
            if not 0 < hours <= RESUME_HOURS_MAX:
                raise ValueError(hours_text)
            deadline = new_deadline(timedelta(hours=hours), runs_.server_now())
        decision = runs_.resume(run_id, deadline)
    except InvalidInput as error:  # not resumable, or past its deadline
        flash(f"not resumed: {error}", "error")
    except ValueError:
        flash(f"new deadline {hours_text!r}: give hours from now, 0 to {RESUME_HOURS_MAX}", "error")
    else:
        flash(f"run {run_id} resumed: {decision.reason}", "ok")
    return back()
