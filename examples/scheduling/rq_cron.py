"""Ticks redis-lease from RQ's own cron scheduler (``rq cron``): at start, then every minute.

    rq cron -u redis://127.0.0.1:6379/0 examples/scheduling/rq_cron.py

and a ``redis-lease worker`` on the same queue runs the ticks. Name your jobs' import paths
in ``REDIS_LEASE_JOBS`` (space-separated) or in JOBS below; ``REDIS_LEASE_QUEUE`` and
``REDIS_LEASE_PREFIX`` (as for the CLI) set the queue and the key prefix.

RQ's cron (rq 3.0) has no serializer of its own: ``rq cron`` accepts ``-S json`` but
does not pass it on, and ``cron.register`` takes neither a serializer nor a job class,
so its jobs would be pickled and a redis-lease worker (JSON only) would fail each one.
``json_cron_jobs()`` makes the jobs this scheduler enqueues JSON.
"""

import os

from rq import cron

from redis_lease import json_cron_jobs, tick_entry

JOBS = os.environ.get("REDIS_LEASE_JOBS", "redis_lease.demo.payments:reconcile").split()
QUEUE = os.environ.get("REDIS_LEASE_QUEUE", "redis-lease")
PREFIX = os.environ.get("REDIS_LEASE_PREFIX", "rl")

json_cron_jobs()
# A tick is idempotent and takes a per-job lock: an extra or overlapping one changes nothing.
cron.register(
    tick_entry, queue_name=QUEUE, args=(JOBS, PREFIX), interval=60, name=f"redis-lease-tick:{QUEUE}"
)
