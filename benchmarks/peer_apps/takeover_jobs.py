"""The job of ``benchmarks/takeover.py``: every option at its default but the queue.

Worker processes import it as ``takeover_jobs:job`` (``benchmarks/peer_apps`` on the
path). ``TAKEOVER_QUEUE`` names the RQ queue; ``TAKEOVER_ITEMS`` the items the planner
yields; ``TAKEOVER_SLEEP_MS`` the handler's sleep.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import date
from typing import Any

from redis_lease import Item, Job

QUEUE_ENV = "TAKEOVER_QUEUE"
ITEMS_ENV = "TAKEOVER_ITEMS"
SLEEP_MS_ENV = "TAKEOVER_SLEEP_MS"
JOB_PATH = "takeover_jobs:job"


def make_job(queue: str) -> Job:
    """The job on ``queue``: a planner of ``TAKEOVER_ITEMS`` items, a sleeping handler."""
    made = Job("takeover", queue=queue)

    @made.planner
    def plan(business_date: date) -> Iterator[Item]:
        for number in range(int(os.environ.get(ITEMS_ENV, "800"))):
            yield Item(f"item-{number:05d}", {"n": number})

    @made.handler
    def handle(item: Item, lease: Any) -> None:
        time.sleep(float(os.environ.get(SLEEP_MS_ENV, "20")) / 1000)

    return made


job = make_job(os.environ.get(QUEUE_ENV, "redis-lease"))
