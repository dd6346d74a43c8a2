"""The JSON job class under the path command lines give: ``redis_lease.dispatch.JsonJob``.

``rqscheduler -j redis_lease.dispatch.JsonJob`` and ``rq worker --job-class
redis_lease.dispatch.JsonJob`` name this path, as release 0.9.0's docs told. The class
itself is :class:`redis_lease.fleet.transport.shard_jobs.JsonJob`. docs/upgrading.md says which
release drops this module.
"""

from .fleet.transport.shard_jobs import JsonJob

__all__ = ["JsonJob"]
