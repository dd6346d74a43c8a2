"""The web dashboard: runs, one run, one item, requeue and resume; RQ's queues, jobs and
workers under ``/rq``. Every value is shown as text; no page runs an inline script.

Build it with :func:`create_app` (a Flask app); ``redis-lease dashboard`` serves it
with waitress (:func:`serve`).
"""

from __future__ import annotations

from .app import create_app
from .server import serve

__all__ = ["create_app", "serve"]
