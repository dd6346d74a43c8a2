"""The RQ job of ``benchmarks/peers.py`` (one RQ job per item), imported as ``peer_rq_tasks``."""

from __future__ import annotations

import time

WORK_PATH = "peer_rq_tasks.work"


def work(sleep_ms: float) -> None:
    """Sleeps ``sleep_ms`` milliseconds (0: returns at once)."""
    if sleep_ms > 0:
        time.sleep(sleep_ms / 1000)
