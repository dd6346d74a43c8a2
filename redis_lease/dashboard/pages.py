"""The dashboard's pages: runs, one run, one item; and its two actions, requeue and resume.

Every number comes from the same library reads and rows as the CLI's views
(:mod:`redis_lease.views`, :mod:`redis_lease.run_views`); the actions make the same
calls as ``redis-lease requeue`` and ``redis-lease resume``. Ids are in URLs as one
path segment each (:mod:`.ids`).
"""

from __future__ import annotations

from datetime import timedelta

from flask import Blueprint, current_app, flash, redirect, render_template, request, url_for
from flask.blueprints import BlueprintSetupState
from werkzeug.wrappers import Response

from .. import age_history
from ..errors import InvalidInput, NotFound
from ..job_failures import job_failures
from ..lease import RunStatus
from ..output import iso_time
from ..run_views import (
    attempt_rows,
    deadline_ms,
    decision_rows,
    effect_row,
    provider_rows,
    record_dict,
    run_row,
)
from ..runs import Runs
from ..store import LeaseStore
from ..validation import check_id
from ..views import item_effects, items_page, providers, run_ids_since, run_statuses, unknown_items
from .charts import age_chart
from .ids import CONVERTER, IdConverter

pages = Blueprint("pages", __name__)


@pages.record_once
def _setup(state: BlueprintSetupState) -> None:
    """Before the routes are added: the id converter, and ``iso_time`` for the templates."""
    state.app.url_map.converters[CONVERTER] = IdConverter
    state.app.add_template_filter(iso_time, "iso_time")


#: Runs per page of the runs page, dead items per page of a run page.
RUNS_PER_PAGE = 50
DEAD_PER_PAGE = 50
#: Attempts shown on an item page, newest first.
ATTEMPTS_SHOWN = 50
#: Resume may set a new deadline this many hours ahead at most; the form offers the
#: default when the run's own deadline has passed.
RESUME_HOURS_MAX = 24 * 14
RESUME_HOURS_DEFAULT = 2


def _store() -> LeaseStore:
    store: LeaseStore = current_app.extensions["redis_lease_store"]
    return store


def _read_only() -> bool:
    return bool(current_app.config["REDIS_LEASE_READ_ONLY"])


@pages.get("/")
def runs() -> str:
    """Every run, newest first, a page at a time."""
    page = request.args.get("page", "1")
    if not page.isdigit() or int(page) < 1:
        raise InvalidInput(f"page {page!r} is not a page number (1, 2, ...)")
    number = int(page)
    run_ids = run_ids_since(_store())
    start = (number - 1) * RUNS_PER_PAGE
    shown = run_ids[start : start + RUNS_PER_PAGE]
    rows = [run_row(status) for status in run_statuses(_store(), shown)]
    return render_template(
        "runs.html",
        rows=rows,
        page=number,
        pages=max(1, -(-len(run_ids) // RUNS_PER_PAGE)),
        total=len(run_ids),
    )


def _status_by_shard(store: LeaseStore, run_id: str) -> tuple[RunStatus, list[dict[str, int]]]:
    """The run's status and its shards' counts; NotFound (saying when it is gone) otherwise."""
    check_id(run_id, "run id")
    try:
        return store.status_by_shard(run_id)
    except NotFound as error:
        raise Runs(store).gone(run_id) or error from None


@pages.get("/runs/<id:run_id>")
def run(run_id: str) -> str:
    """One run: counts by shard, the age chart, decisions, failures, dead items, providers."""
    store = _store()
    status, shards = _status_by_shard(store, run_id)
    dead = items_page(store, run_id, "dead", DEAD_PER_PAGE, request.args.get("dead_cursor"))
    return render_template(
        "run.html",
        row=run_row(status),
        status=status,
        shards=shards,
        chart=age_chart(age_history.read(store, run_id)),
        decisions=decision_rows(store, run_id),
        failures=job_failures(status.info),
        dead=list(zip(dead.records, dead.times_ms, strict=True)),
        dead_cursor=dead.next_cursor,
        providers=provider_rows(providers(store)),
        can_resume=status.state in ("partial", "failed") and not _read_only(),
        resume_hours=_resume_hours(status),
        read_only=_read_only(),
    )


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
    except NotFound as error:
        raise Runs(store).gone(run_id) or error from None
    record = store.item(run_id, item_id)
    return render_template(
        "item.html",
        record=record,
        data=record_dict(record),
        effects=[(key, effect_row(rec)) for key, rec in item_effects(store, run_id, item_id)],
        attempts=attempt_rows(store, run_id, item_id, ATTEMPTS_SHOWN),
        read_only=_read_only(),
    )


@pages.post("/runs/<id:run_id>/items/<id:item_id>/requeue")
def requeue(run_id: str, item_id: str) -> Response:
    """Moves a dead item back to pending (``redis-lease requeue RUN ITEM``)."""
    store = _store()
    check_id(run_id, "run id")
    check_id(item_id, "item id")
    if unknown_items(store, run_id, [item_id]):
        raise NotFound(f"item {item_id!r} not found in run {run_id!r}", run_id=run_id)
    if store.requeue(run_id, [item_id]):
        flash(f"item {item_id} requeued: pending again, with fresh attempts", "ok")
    else:
        flash(f"item {item_id} is not dead: left as it is", "error")
    if request.form.get("back") == "item":
        return redirect(url_for("pages.item", run_id=run_id, item_id=item_id), code=303)
    return redirect(url_for("pages.run", run_id=run_id), code=303)


@pages.post("/runs/<id:run_id>/resume")
def resume(run_id: str) -> Response:
    """Reopens a partial or failed run (``redis-lease resume RUN [--deadline]``)."""
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
            deadline = runs_.server_now() + timedelta(hours=hours)
        decision = runs_.resume(run_id, deadline)
    except InvalidInput as error:  # not partial or failed, or past its deadline
        text = str(error).replace("pass --deadline", "give a new deadline")
        flash(f"not resumed: {text}", "error")
    except ValueError:
        flash(f"new deadline {hours_text!r}: give hours from now, 0 to {RESUME_HOURS_MAX}", "error")
    else:
        flash(f"run {run_id} resumed: {decision.reason}", "ok")
    return redirect(url_for("pages.run", run_id=run_id), code=303)
