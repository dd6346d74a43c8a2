"""Loaded at start-up only by worker processes on a skewed clock (see tests/faults/cluster.py).

libfaketime (0.9.10, as Debian ships it) with the monotonic clock left real
(``FAKETIME_DONT_FAKE_MONOTONIC=1``) makes Python's ``time.sleep`` fail with
EINVAL: Python sleeps with ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``,
which the library rewrites wrongly. A skewed worker would then die in the first
retry backoff, a fault no real host has. Waits on a condition are unaffected, so
``time.sleep`` waits on one here; everything else runs on the skewed wall clock.
"""

import threading
import time

_NEVER_SET = threading.Event()


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    _NEVER_SET.wait(seconds)


time.sleep = _sleep  # type: ignore[assignment]
