"""RQ's queues, jobs and workers under ``/rq``: pages rendered on the server, and their JSON.

Every value comes from :mod:`.rq_data`, :mod:`.rq_jobs` and :mod:`.rq_workers` (read
tolerantly, shown as text by the templates' autoescape; a job that cannot be read is a row
with a note). The URLs are those
rq-dashboard used: ``/rq/``, ``/rq/0/view/queues``, ``/rq/0/view/workers``,
``/rq/0/view/jobs/QUEUE/REGISTRY`` (``?page=N&per_page=N&order=asc|dsc``, or rq-dashboard's
``/PER_PAGE/ORDER/PAGE``), ``/rq/0/view/job/ID``, and under ``/rq/0/data/`` the same as
``.json``. Only instance 0 exists. A queue's name is one path segment, ``/`` written ``~``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import flask
import redis
from flask import Blueprint, render_template, request, url_for
from flask.blueprints import BlueprintSetupState

from ...errors import InvalidInput
from ...limits import RQ_PAGE_MAX, RQ_PAGE_SIZE
from . import rq_data, rq_jobs, rq_workers
from .ids import CONVERTER, IdConverter
from .rq_source import RQ_PREFIX, known_job, known_queue, known_registry, location, reading

rq_views = Blueprint("rq", __name__, url_prefix=RQ_PREFIX)

#: Jobs per page by default, and at most.
PER_PAGE = RQ_PAGE_SIZE
PER_PAGE_MAX = RQ_PAGE_MAX
#: The orders a jobs page takes: oldest first (``asc``) or newest first (rq-dashboard's ``dsc``).
ORDERS = {"asc": False, "dsc": True, "desc": True}


@rq_views.record_once
def _setup(state: BlueprintSetupState) -> None:
    """The id converter (a queue name as one path segment) and the templates' helpers."""
    state.app.url_map.converters[CONVERTER] = IdConverter
    state.app.add_template_global(linkable, "rq_linkable")
    state.app.add_template_global(rq_data.is_job_id, "rq_job_id")
    state.app.add_template_global(here, "rq_here")
    state.app.add_template_filter(rq_data.text, "rq_text")


def linkable(name: str, raw: bytes) -> bool:
    """Whether a URL can name this queue: UTF-8 text, and not a path's ``.`` or ``..``
    (its ``/`` are written ``~``, so it is one path segment).

    (A job is linked when its id is one RQ accepts: :func:`.rq_data.is_job_id`.)
    """
    return rq_data.is_text(raw) and name not in (".", "..")


def here() -> str:
    """This page's path (under the app's root, quoted) and query: a form's way back."""
    query = request.query_string.decode("latin-1")
    return quote(request.path) + (f"?{query}" if query else "")


# -- queues and workers ------------------------------------------------------------------


@rq_views.get("/0/view/queues", endpoint="queues")
@rq_views.get("/0/view", endpoint="queues")
@rq_views.get("/0/", endpoint="queues")
@rq_views.get("/", endpoint="queues")
def queues_page() -> str:
    """Every queue with its jobs by registry."""
    with reading() as conn:
        found = rq_data.queues(conn)
    return render_template(
        "rq/queues.html", queues=found, registries=rq_data.REGISTRIES, location=location()
    )


@rq_views.get("/0/data/queues.json")
def queues_json() -> flask.Response:
    """Every queue with its jobs by registry, as rq-dashboard's JSON named them."""
    with reading() as conn:
        found = rq_data.queues(conn)
    rows = []
    for queue in found:
        row: dict[str, Any] = {"name": queue.name, "count": queue.counts["queued"]}
        for registry in rq_data.REGISTRIES[1:]:
            row[f"{registry}_job_registry_count"] = queue.counts[registry]
        if linkable(queue.name, queue.raw_name):
            for registry in rq_data.REGISTRIES:
                row[f"{registry}_url"] = url_for(".jobs", queue=queue.name, registry=registry)
        rows.append(row)
    return _json({"queues": rows})


def _current_jobs(conn: redis.Redis, workers: list[rq_workers.RqWorker]) -> list[Any]:
    """Each worker's current job (None when idle or gone), read in one round trip."""
    ids = [w.current_job.encode() for w in workers]
    busy = [n for n, job_id in enumerate(ids) if job_id]
    read = rq_jobs.read_jobs(conn, [ids[n] for n in busy])
    current: list[Any] = [None] * len(workers)
    for n, job in zip(busy, read, strict=True):
        current[n] = job
    return current


@rq_views.get("/0/view/workers")
def workers_page() -> str:
    """Every RQ worker: its state, queues and current job."""
    with reading() as conn:
        found = rq_workers.workers(conn)
        current = _current_jobs(conn, found)
    return render_template(
        "rq/workers.html", workers=list(zip(found, current, strict=True)), location=location()
    )


@rq_views.get("/0/data/workers.json")
def workers_json() -> flask.Response:
    """Every RQ worker, as rq-dashboard's JSON named its fields."""
    with reading() as conn:
        found = rq_workers.workers(conn)
        current = _current_jobs(conn, found)
    return _json({"workers": [w.to_dict(j) for w, j in zip(found, current, strict=True)]})


# -- jobs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobsPage:
    """One page of a queue's list or registry: its rows, (job id, job or None when gone)."""

    queue: rq_data.QueueCounts
    registry: str
    page: int
    per_page: int
    order: str
    rows: list[tuple[bytes, rq_jobs.RqJob | None]]

    @property
    def total(self) -> int | None:
        """The jobs in this list or registry (None: not the type RQ writes there)."""
        return self.queue.counts[self.registry]

    @property
    def pages(self) -> int:
        """How many pages there are (at least 1)."""
        return max(1, -(-(self.total or 0) // self.per_page))


def _number(value: str | int, what: str, low: int, high: int) -> int:
    text = str(value)
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise InvalidInput(f"{what} {text[:40]!r} is not a number from {low} to {high}")
    return int(text)


def _jobs_page(queue: str, registry: str, **path: Any) -> JobsPage:
    """The page the path (rq-dashboard's ``/PER_PAGE/ORDER/PAGE``) or the query asks for."""
    known_registry(registry)
    args = {**request.args.to_dict(), **{k: v for k, v in path.items() if v is not None}}
    page = _number(args.get("page", 1), "page", 1, 10**9)
    per_page = _number(args.get("per_page", PER_PAGE), "per_page", 1, PER_PAGE_MAX)
    order = str(args.get("order", "asc"))
    if order not in ORDERS:
        raise InvalidInput(f"order {order[:40]!r} is not one of: asc, dsc")
    with reading() as conn:
        found = known_queue(conn, queue)
        start = (page - 1) * per_page
        found_members = rq_data.members(
            conn, queue.encode(), registry, start, per_page, ORDERS[order]
        )
        ids = [rq_data.job_id_of(member, registry) for member in found_members]
        jobs = rq_jobs.read_jobs(conn, ids)
    return JobsPage(found, registry, page, per_page, order, list(zip(ids, jobs, strict=True)))


_PAGED = "<int:per_page>/<order>/<int:page>"


@rq_views.get(f"/0/view/jobs/<{CONVERTER}:queue>/<registry>")
@rq_views.get(f"/0/view/jobs/<{CONVERTER}:queue>/<registry>/{_PAGED}")
def jobs(queue: str, registry: str, **paging: Any) -> str:
    """A page of one queue's list or registry, each job a row (a note where it cannot be
    read), with the registry's actions."""
    shown = _jobs_page(queue, registry, **paging)
    return render_template(
        "rq/jobs.html", view=shown, registries=rq_data.REGISTRIES, location=location()
    )


@rq_views.get(f"/0/data/jobs/<{CONVERTER}:queue>/<registry>.json")
@rq_views.get(f"/0/data/jobs/<{CONVERTER}:queue>/<registry>/{_PAGED}.json")
def jobs_json(queue: str, registry: str, **paging: Any) -> flask.Response:
    """A page of one queue's list or registry as JSON."""
    shown = _jobs_page(queue, registry, **paging)
    rows = [
        job.to_dict() if job else {"id": rq_data.text(raw), "problems": ["not in Redis"]}
        for raw, job in shown.rows
    ]
    pagination = {
        "current_page": shown.page,
        "num_pages": shown.pages,
        "per_page": shown.per_page,
        "order": shown.order,
        "total": shown.total,
    }
    body = {"name": shown.queue.name, "registry_name": registry, "jobs": rows}
    return _json({**body, "pagination": pagination})


@rq_views.get("/0/view/job/<path:job_id>")
def job(job_id: str) -> str:
    """One job: its fields, its call, its traceback (as text), its result, and its actions."""
    with reading() as conn:
        found = known_job(conn, job_id)
    return render_template("rq/job.html", job=found, location=location())


@rq_views.get("/0/data/job/<path:job_id>.json")
def job_json(job_id: str) -> flask.Response:
    """One job as JSON."""
    with reading() as conn:
        found = known_job(conn, job_id)
    return _json(found.to_dict())


def _json(body: dict[str, Any]) -> flask.Response:
    response = flask.jsonify(body)
    response.headers["Cache-Control"] = "no-store"
    return response
