"""A job module the tick leader of tests/test_tick_leader_fleet.py never loads: a worker
started later declares :data:`weekly`, and the leader, which imports no module another
worker names, cannot tick it and names it (log, ``workers``, metric)."""

from __future__ import annotations

from redis_lease.fleet.jobs.job import Job
from tests.leader_jobs import handle, plan

weekly = Job("weekly", shards=1, schedule="0 0 29 2 *", timezone="UTC")
weekly.planner(plan)
weekly.handler(handle)
