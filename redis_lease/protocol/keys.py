"""Every Redis key name, in one place.

Per-shard keys carry the hash tag ``{<run_id>#<shard>}`` so that one script
touches one Cluster slot; run-level keys carry ``{<run_id>}``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from functools import lru_cache

from ..limits import DEFAULT_PREFIX

#: The order in which every shard script receives its keys (see lua/include/shard_keys.lua).
SHARD_KEY_NAMES = ("meta", "counts", "items", "due", "leases", "held", "dead")
#: The shard's attempt log (stream), the eighth key of the scripts that end attempts.
ATTEMPTS_KEY_NAME = "attempts"


@lru_cache(maxsize=4096)
def _shard_keys(prefix: str, run_id: str, shard: int) -> tuple[str, ...]:
    tag = f"{prefix}:{{{run_id}#{shard}}}"
    return tuple(f"{tag}:{name}" for name in (*SHARD_KEY_NAMES, ATTEMPTS_KEY_NAME))


def shard_of(item_id: str, shards: int) -> int:
    """The shard of an item: CRC-32 (zlib) of its UTF-8 id, modulo the shard count."""
    return zlib.crc32(item_id.encode()) % shards


@dataclass(frozen=True)
class Keys:
    """Builds key names under one prefix."""

    prefix: str = DEFAULT_PREFIX

    def shard(self, run_id: str, shard: int) -> list[str]:
        """The seven keys of one shard's state, in script order (a new list each call)."""
        return list(_shard_keys(self.prefix, run_id, shard)[:-1])

    def logged(self, run_id: str, shard: int) -> list[str]:
        """The eight keys of the scripts that end attempts: the seven and the attempt log."""
        return list(_shard_keys(self.prefix, run_id, shard))

    def attempts(self, run_id: str, shard: int) -> str:
        """The shard's attempt log (stream, capped at limits.json's ``attempt_log``)."""
        return _shard_keys(self.prefix, run_id, shard)[-1]

    def effects(self, run_id: str, shard: int) -> list[str]:
        """The shard's effect ledger (hash) and its unknown effects by age (sorted set)."""
        tag = f"{self.prefix}:{{{run_id}#{shard}}}"
        return [f"{tag}:effects", f"{tag}:effects_unknown"]

    def status(self, run_id: str, shard: int) -> list[str]:
        """The keys of ``shard_status``: the shard's seven and its unknown effects."""
        return [*self.shard(run_id, shard), self.effects(run_id, shard)[1]]

    def provider(self, name: str) -> list[str]:
        """A provider's concurrency slots (sorted set) and cap state (hash)."""
        tag = f"{self.prefix}:provider:{{{name}}}"
        return [f"{tag}:slots", f"{tag}:state"]

    def run(self, run_id: str) -> str:
        """The run's record (hash)."""
        return f"{self.prefix}:run:{{{run_id}}}"

    def run_events(self, run_id: str) -> str:
        """The run's decision log (stream)."""
        return f"{self.prefix}:run:{{{run_id}}}:events"

    def run_jobs(self, run_id: str) -> str:
        """The run's RQ shard jobs (hash: RQ job id -> shard)."""
        return f"{self.prefix}:run:{{{run_id}}}:rq"

    def run_jobs_missing(self, run_id: str) -> str:
        """When each shard job was first found neither waiting nor beating (hash: id -> ms)."""
        return f"{self.prefix}:run:{{{run_id}}}:rq:missing"

    def run_beat(self, run_id: str, rq_job_id: str) -> str:
        """A shard job's heartbeat (string with a TTL)."""
        return f"{self.prefix}:run:{{{run_id}}}:beat:{rq_job_id}"

    def run_planner(self, run_id: str) -> str:
        """The planning lock of a run (string with a TTL)."""
        return f"{self.prefix}:run:{{{run_id}}}:planner"

    def job(self, name: str) -> str:
        """A job's recorded settings (hash)."""
        return f"{self.prefix}:job:{{{name}}}"

    def job_dates(self, name: str) -> str:
        """Business dates a job has runs for (sorted set: date -> created ms)."""
        return f"{self.prefix}:job:{{{name}}}:dates"

    def job_open_runs(self, name: str) -> str:
        """The job's runs not yet finished (set)."""
        return f"{self.prefix}:job:{{{name}}}:open"

    def job_lost(self, name: str) -> str:
        """The job's lost runs (hash: run id -> its record,
        :mod:`redis_lease.fleet.lost_records`)."""
        return f"{self.prefix}:job:{{{name}}}:lost"

    @property
    def data_set(self) -> str:
        """The data set's mark (hash: id, epoch, seq, losses; see
        :mod:`redis_lease.fleet.data_set`)."""
        return f"{self.prefix}:dataset"

    @property
    def protocol(self) -> str:
        """The protocol the data under the prefix is in (string: a decimal number), set by
        the first worker (:mod:`redis_lease.protocol.store.stamp`)."""
        return f"{self.prefix}:protocol"

    @property
    def shard_jobs(self) -> str:
        """Every shard job at work, by RQ job id (hash: id -> JSON: run, shard, worker,
        owner, host, pid, path, queue, budget); its heartbeat is :meth:`run_beat`."""
        return f"{self.prefix}:shard_jobs"

    @property
    def takeovers(self) -> str:
        """The latest takeovers of stopped shard jobs, newest first (list of JSON)."""
        return f"{self.prefix}:takeovers"

    @property
    def workers(self) -> list[str]:
        """The worker processes' records (hash: name -> JSON) and beats (sorted set: name
        -> server ms), one hash tag for the script that writes both."""
        return [f"{self.prefix}:{{workers}}", f"{self.prefix}:{{workers}}:seen"]

    @property
    def jobs(self) -> str:
        """Every job name seen by a tick (set)."""
        return f"{self.prefix}:jobs"

    @property
    def runs(self) -> str:
        """Every run id, scored by creation time in ms (sorted set)."""
        return f"{self.prefix}:runs"

    @property
    def bad_jobs(self) -> str:
        """RQ jobs workers failed without running (hash: ``<reason>:<queue>`` -> count)."""
        return f"{self.prefix}:rq:bad_jobs"
