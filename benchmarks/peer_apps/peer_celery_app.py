"""The Celery app of ``benchmarks/peers.py``, imported by its workers as ``peer_celery_app``.

Redis broker (``PEER_CELERY_BROKER``), one queue (``PEER_CELERY_QUEUE``), late
acknowledgement and no result backend, as a production user would run Celery for
work that must not be lost. Each task bumps ``PEER_CELERY_COUNTER`` (one INCR,
which the harness subtracts from the command count) so that the harness knows
exactly how many tasks finished: with the results ignored, Redis holds no other
exact record of it.
"""

from __future__ import annotations

import os
import threading
import time

import redis
from celery import Celery  # type: ignore[import-untyped]

BROKER_ENV = "PEER_CELERY_BROKER"
QUEUE_ENV = "PEER_CELERY_QUEUE"
COUNTER_ENV = "PEER_CELERY_COUNTER"
TASK_NAME = "peer.work"

BROKER = os.environ.get(BROKER_ENV, "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get(QUEUE_ENV, "peer-celery")
COUNTER = os.environ.get(COUNTER_ENV, f"{QUEUE}:finished")

app = Celery("peer_celery_app", broker=BROKER)
app.conf.update(
    task_acks_late=True,
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

_client: redis.Redis | None = None
_client_lock = threading.Lock()


def _counter_client() -> redis.Redis:
    global _client
    with _client_lock:
        if _client is None:
            _client = redis.Redis.from_url(BROKER)
        return _client


@app.task(name=TASK_NAME, acks_late=True, ignore_result=True)  # type: ignore[untyped-decorator]
def work(sleep_ms: float) -> None:
    """Sleeps ``sleep_ms`` milliseconds (0: returns at once), then counts itself finished."""
    if sleep_ms > 0:
        time.sleep(sleep_ms / 1000)
    _counter_client().incr(COUNTER)
