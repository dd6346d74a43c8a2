"""The web dashboard: runs, one run, one item, requeue and resume; RQ's queues, jobs and
workers under ``/rq``. Every value is shown as text; no page runs an inline script.

Build it with :func:`create_app` (a Flask app); ``redis-lease dashboard`` serves it
with waitress (:func:`serve`).
"""

from __future__ import annotations

from ...extras import require

require("dashboard", "the dashboard")  # one line naming the extra, before Flask is imported

from .app import create_app  # noqa: E402
from .server import serve  # noqa: E402

__all__ = ["create_app", "serve"]
