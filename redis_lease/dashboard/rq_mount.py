"""rq-dashboard mounted under ``/rq``, reading this project's JSON jobs.

rq-dashboard 0.9 keeps its serializer in a module global (set here to RQ's
JSON serializer), but some of its views ignore it: the workers views call
``Worker.all()`` without a serializer, so a busy worker's current job was read
with pickle and the page failed (DeserializationError); the job view, delete and
requeue fetch jobs the same way. Its module's ``Worker``, ``Job`` and
``requeue_job`` names are replaced here by JSON-reading ones: a change to the
``rq_dashboard.web`` module, so process-wide (every app in the process that mounts
rq-dashboard reads jobs as JSON), made once under a lock, the same for every app.
It also opens a new Redis connection from a URL on every request; here it uses the
store's client, and the URL it shows is the store's with its password masked.

Its state-changing views (delete, requeue, requeue all, empty, compact) answer POST
only here (rq-dashboard's "requeue all" also answers GET, which neither CSRF nor a
read-only check would stop): any other method is a 405, and with ``read_only``
every one of them is a 403.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import flask
import rq
from flask import abort, request
from rq.serializers import JSONSerializer
from rq_dashboard import web

from ..dispatch import JsonJob
from ..store import LeaseStore
from ..urls import safe_url

#: Where rq-dashboard is mounted.
RQ_PREFIX = "/rq"
#: The cookie rq-dashboard's scripts read the CSRF token from (sent back as X-CSRFToken).
RQ_CSRF_COOKIE = "_csrf_token"
_patching = threading.Lock()


class JsonWorker(rq.Worker):
    """RQ's worker class, whose :meth:`all` reads workers' current jobs as JSON."""

    @classmethod
    def all(
        cls,
        connection: Any = None,
        job_class: Any = None,
        queue_class: Any = None,
        queue: Any = None,
        serializer: Any = None,
    ) -> list[Any]:
        """Every worker, with the JSON serializer and job class unless told otherwise."""
        return super().all(
            connection=connection,
            job_class=job_class or JsonJob,
            queue_class=queue_class,
            queue=queue,
            serializer=serializer or JSONSerializer,
        )


def requeue_json_job(job_id: str, connection: Any, serializer: Any = None) -> Any:
    """``rq.requeue_job`` reading the job as JSON."""
    return rq.requeue_job(job_id, connection=connection, serializer=serializer or JSONSerializer)


def _patch_rq_dashboard() -> None:
    """Points rq-dashboard's module at JSON-reading classes: process-wide, idempotent,
    under a lock (apps made in several threads patch it once)."""
    with _patching:
        web.config.serializer = JSONSerializer
        web.Worker = JsonWorker
        web.Job = JsonJob
        web.requeue_job = requeue_json_job


def mount_rq(app: flask.Flask, store: LeaseStore, *, read_only: bool) -> None:
    """Registers rq-dashboard under :data:`RQ_PREFIX` on ``app``, on the store's Redis."""
    _patch_rq_dashboard()
    # Shown on its pages, never connected to: rq-dashboard masks only a user:password@.
    app.config["RQ_DASHBOARD_REDIS_URL"] = (safe_url(store.url or "redis"),)
    app.config["RQ_DASHBOARD_DISABLE_DELETE"] = read_only
    app.register_blueprint(web.blueprint, url_prefix=RQ_PREFIX)
    # Its own before_request connects from the URL on every request: use the store's client.
    funcs = app.before_request_funcs.setdefault(web.blueprint.name, [])
    funcs[:] = [f for f in funcs if f is not web.push_rq_connection]
    funcs.append(_only_instance_zero)
    funcs.append(_writes_guard(state_changing_endpoints(app), read_only=read_only))
    app.redis_conn = store.rq  # type: ignore[attr-defined]  # where its views look

    @app.after_request
    def _csrf_cookie(response: flask.Response) -> flask.Response:
        """Gives rq-dashboard's pages the CSRF token its scripts send with their POSTs."""
        if read_only or request.blueprint != web.blueprint.name or request.method != "GET":
            return response
        if response.mimetype != "text/html":
            return response
        from flask_wtf.csrf import generate_csrf

        response.set_cookie(
            RQ_CSRF_COOKIE,
            generate_csrf(),
            path=flask.url_for("rq_dashboard.queues_overview"),
            samesite="Strict",
            secure=request.is_secure,
        )
        return response


def state_changing_endpoints(app: flask.Flask) -> frozenset[str]:
    """rq-dashboard's endpoints that change something: those that answer POST.

    Its other views only read (the counts and listings call RQ's own registry cleanup,
    as any RQ reader does).
    """
    prefix = f"{web.blueprint.name}."
    return frozenset(
        rule.endpoint
        for rule in app.url_map.iter_rules()
        if rule.endpoint.startswith(prefix) and "POST" in (rule.methods or ())
    )


def _writes_guard(endpoints: frozenset[str], *, read_only: bool) -> Callable[[], None]:
    """The before-request check of rq-dashboard's state-changing views: POST only (405),
    none at all when read-only (403)."""

    def check() -> None:
        if request.endpoint not in endpoints:
            return
        if read_only:
            abort(403, "the dashboard is read-only (started with --read-only)")
        if request.method != "POST":
            abort(405, valid_methods=["POST"])

    return check


def _only_instance_zero() -> None:
    """rq-dashboard can show several Redis instances; here there is one, number 0."""
    if (request.view_args or {}).get("instance_number") not in (None, 0):
        abort(404)
