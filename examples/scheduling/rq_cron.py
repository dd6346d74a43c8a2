"""Ticks redis-lease from RQ's own cron scheduler (``rq cron``), every minute.

    rq cron -S json -u redis://127.0.0.1:6379/0 examples/scheduling/rq_cron.py

and an RQ worker on the ``redis-lease`` queue (``redis-lease worker``) runs the
ticks. Name your jobs' import paths in JOBS.
"""

from rq import cron

from redis_lease.tick import tick_entry

JOBS = ["redis_lease.demo.payments:reconcile"]

cron.register(tick_entry, queue_name="redis-lease", args=(JOBS, "rl"), cron="* * * * *")
