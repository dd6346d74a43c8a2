"""The shard job's path as RQ stores it: ``redis_lease.worker.process_shard``.

RQ keeps a job's function as a dotted path. Shard jobs enqueued by release 0.9.0 name
this path, and this release enqueues them under it too
(:data:`~redis_lease.fleet.transport.shard_jobs.SHARD_FUNC`), so that workers of both releases run
each other's shard jobs while a fleet is upgraded. The function itself is
:func:`redis_lease.fleet.worker.shard_job.process_shard`. docs/upgrading.md says which
release drops this module.
"""

from .fleet.worker.shard_job import process_shard

__all__ = ["process_shard"]
