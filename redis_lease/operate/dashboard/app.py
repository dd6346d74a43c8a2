"""The dashboard's Flask app: pages, RQ's views under ``/rq``, ``/metrics``, ``/healthz``.

Every request is for a Host the dashboard answers to (:mod:`.security`); every
request but ``/healthz`` passes basic auth when it is set; with ``read_only`` every
POST is refused (403) and no page shows a button; every form carries a CSRF token
(Flask-WTF), checked on every POST. An error is a page with one line, or for a
``.json`` URL a JSON object ``{"error": ..., "message": ...}``, with its status. On a
full Redis (:mod:`.fullness`) every page shows a banner saying so, an action it refuses
goes back to its page with a line saying why, and ``/healthz`` says ``redis full``.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import secrets
from collections.abc import Callable, Collection

import flask
from flask import flash, render_template, request
from flask_wtf.csrf import CSRFError, CSRFProtect
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response

from ...errors import InvalidInput, NotFound, RedisFull, RedisLeaseError, RedisUnavailable
from ...protocol.store.lease_store import LeaseStore
from ..metrics.collector import LeaseCollector
from . import fullness
from .pages import back as pages_back
from .pages import pages
from .rq_actions import back_to as rq_back
from .rq_actions import rq_actions
from .rq_views import rq_views
from .security import LOOPBACK_HOSTS, HttpsAwareSessions, host_check, security_headers
from .times import short_time
from .unreadable import Unreadable, unreadable

#: Methods that change nothing: allowed when read-only, and without a CSRF token.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: The blueprints whose forms change something, and the page each action goes back to.
ACTION_PAGES: dict[str, Callable[[], Response]] = {
    "pages": pages_back,
    "rq_actions": rq_back,
}
REALM = "redis-lease dashboard"
log = logging.getLogger("redis_lease.dashboard.app")  # the name logging configs know


def create_app(
    store: LeaseStore,
    *,
    read_only: bool = False,
    auth: tuple[str, str] | None = None,
    secret_key: str | None = None,
    hosts: Collection[str] | None = LOOPBACK_HOSTS,
) -> flask.Flask:
    """The dashboard of ``store``'s runs, and of its RQ queues, jobs and workers.

    Args:
        store: where the runs are (and, through ``store.rq``, RQ's data).
        read_only: no buttons (requeue, resume, the RQ pages' actions); every POST is
            refused (403).
        auth: (user, password) asked of every request but ``/healthz``; None for none.
        secret_key: signs the session (flash messages, CSRF tokens); random when None,
            so tokens last as long as the process.
        hosts: the Host names (and addresses) it answers to, any other is a 400; None
            for any (behind a proxy, or served beyond loopback with a login).
    """
    app = flask.Flask(__name__)
    app.config.update(
        SECRET_KEY=secret_key or secrets.token_hex(32),
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_NAME="redis_lease_dashboard",
        REDIS_LEASE_READ_ONLY=read_only,
        # A CSRF token is bound to the signed session, which is the real limit: with
        # Flask-WTF's default of an hour, a page left open overnight would have its next
        # requeue or resume refused.
        WTF_CSRF_TIME_LIMIT=None,
    )
    app.session_interface = HttpsAwareSessions()
    app.extensions["redis_lease_store"] = store
    # Host first, then auth, then read-only, then CSRF (registered by init_app): a page
    # asked for under a stranger's name gets 400, a stranger 401.
    app.before_request(host_check(hosts))
    app.before_request(_authenticator(auth))
    if read_only:
        app.before_request(_refuse_writes)
    CSRFProtect(app)
    app.after_request(security_headers)
    app.add_template_filter(json_text, "json_text")
    app.add_template_filter(sample_value, "sample_value")
    app.add_template_filter(short_time, "short_time")
    app.context_processor(lambda: {"redis_full": fullness.full_now(store)})
    app.register_blueprint(pages)
    app.register_blueprint(rq_views)
    app.register_blueprint(rq_actions)
    _add_probes(app, store)
    _add_error_pages(app)
    return app


def json_text(value: object) -> str:
    """A JSON value as text for a page (autoescape makes it safe): readable, not escaped
    for a script as ``tojson`` is (which would show ``<`` as ``\\u003c``)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def sample_value(value: float) -> str:
    """A metric's value as Prometheus's text writes it, a whole number without ``.0``."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value.is_integer() else repr(value)


def _authenticator(auth: tuple[str, str] | None) -> Callable[[], flask.Response | None]:
    """The before-request check of basic auth (a no-op without ``auth``)."""

    def check() -> flask.Response | None:
        if auth is None or request.endpoint == "healthz":
            return None
        given = request.authorization
        if (
            given is not None
            and given.type == "basic"
            and _same(given.username or "", auth[0])
            and _same(given.password or "", auth[1])
        ):
            return None
        return flask.Response(
            "authentication required\n",
            401,
            {"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
            mimetype="text/plain",
        )

    return check


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _refuse_writes() -> None:
    if request.method not in SAFE_METHODS:
        flask.abort(403, "the dashboard is read-only (started with --read-only)")


def _add_probes(app: flask.Flask, store: LeaseStore) -> None:
    """``/healthz`` (Redis answers), ``/metrics`` (the store's Prometheus metrics) and
    ``/metrics/view`` (the same, as a page).

    ``/healthz`` needs no login, so it says ``ok``, ``redis unavailable`` or ``redis full``
    (a 503 for either: see docs/how-to/alerts-and-dashboards.md) and no more: which Redis,
    and why, goes to the log. ``/metrics`` is a 503 with one line when a value in Redis
    cannot be read (bytes that are not UTF-8 where a run id should be).
    """
    registry = CollectorRegistry()
    registry.register(LeaseCollector(store))

    @app.get("/healthz")
    def healthz() -> flask.Response:
        try:
            with store.translating_errors():
                store.client.ping()
        except RedisLeaseError as error:
            log.warning("healthz: %s", error)
            return flask.Response("redis unavailable\n", 503, mimetype="text/plain")
        if fullness.redis_full(store):
            log.warning("healthz: Redis is full: %s", fullness.FULL_ADVICE)
            return flask.Response("redis full\n", 503, mimetype="text/plain")
        return flask.Response("ok\n", 200, mimetype="text/plain")

    @app.get("/metrics")
    def metrics() -> flask.Response:
        try:
            body = generate_latest(registry)
        except ValueError as error:  # a value in Redis the collector cannot read
            reason = unreadable("the metrics", error).reason
            log.warning("metrics: a value in Redis cannot be read: %s", reason)
            text = f"metrics cannot be read: a value in Redis: {reason}\n"
            return flask.Response(text, 503, mimetype="text/plain")
        return flask.Response(body, 200, content_type=CONTENT_TYPE_LATEST)

    @app.get("/metrics/view")
    def metrics_page() -> str:
        """The same metrics as a page of the dashboard: each family with its help and its
        samples, and a link to the text Prometheus scrapes."""
        try:
            families: list[Metric] | Unreadable = list(registry.collect())
        except ValueError as error:
            families = unreadable("the metrics", error)
        return render_template("metrics.html", families=families)


def _add_error_pages(app: flask.Flask) -> None:
    """Errors as a page with one clear line (JSON for a ``.json`` URL): 404 for what is not
    there, 400 for bad input, 503 when Redis does not answer or is full; an action a full
    Redis refuses goes back to its page, which says why."""

    def page(status: int, title: str, message: str) -> tuple[str | flask.Response, int]:
        if request.path.endswith(".json"):
            return flask.jsonify({"error": title, "message": message}), status
        return render_template("error.html", title=title, message=message), status

    @app.errorhandler(NotFound)
    def not_found(error: NotFound) -> tuple[str | flask.Response, int]:
        return page(404, "not found", str(error))

    @app.errorhandler(InvalidInput)
    def invalid(error: InvalidInput) -> tuple[str | flask.Response, int]:
        return page(400, "bad request", str(error))

    @app.errorhandler(RedisFull)
    def full(error: RedisFull) -> Response | tuple[str | flask.Response, int]:
        fullness.met_full()
        back = ACTION_PAGES.get(request.blueprint or "")
        if request.method not in SAFE_METHODS and back is not None:
            flash(f"Not done: {error}", "error")
            return back()
        return page(503, "Redis is full", str(error))

    @app.errorhandler(RedisUnavailable)
    def unavailable(error: RedisUnavailable) -> tuple[str | flask.Response, int]:
        fullness.not_asked()
        return page(503, "Redis unavailable", str(error))

    @app.errorhandler(CSRFError)
    def csrf(error: CSRFError) -> tuple[str | flask.Response, int]:
        text = f"{error.description} Reload the page and try again."
        return page(400, "form expired or sent from elsewhere", text)

    @app.errorhandler(HTTPException)
    def http(error: HTTPException) -> tuple[str | flask.Response, int]:
        return page(error.code or 500, error.name.lower(), str(error.description))
