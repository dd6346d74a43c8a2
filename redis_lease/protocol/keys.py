"""Every Redis key name, in one place.

Per-shard keys carry the hash tag ``{<run_id>#<shard>}`` so that one script
touches one Cluster slot; run-level keys carry ``{<run_id>}``.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from ..limits import DEFAULT_PREFIX

#: The order in which every shard script receives its keys (see lua/include/shard_keys.lua).
SHARD_KEY_NAMES = ("meta", "counts", "items", "due", "leases", "held", "dead")
#: The shard's attempt log (stream), the eighth key of the scripts that end attempts.
ATTEMPTS_KEY_NAME = "attempts"
#: Hash tag of the records of ad-hoc runs (runs of no job), in place of a job's name.
ADHOC_TAG = "adhoc"
#: The :class:`Keys` members whose keys outlive runs: a job's, a provider's, a worker's or
#: the fleet's, never one run's. Every other key a run creates expires with it: a final
#: run's keys (:func:`redis_lease.fleet.runs.run_states.run_keys`) when its retention ends, a
#: lock or a heartbeat sooner. :meth:`Keys.outliving_runs` names them.
OUTLIVE_RUNS = (
    "job",
    "job_dates",
    "job_open_runs",
    "job_lost",
    "job_tallies",
    "job_counted_runs",
    "job_tick_lock",
    "job_tick_fence",
    "provider",
    "jobs",
    "runs",
    "data_set",
    "data_set_remembered",
    "protocol",
    "shard_job_registry",
    "takeovers",
    "workers",
    "bad_jobs",
    "tick_leader",
    "tick_declared",
)


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

    @property
    def providers_pattern(self) -> str:
        """A SCAN pattern matching the cap state (hash) of every provider."""
        return f"{self.prefix}:provider:{{*}}:state"

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
        """What a shard job's last beat said (string with a TTL: JSON, its process and the
        leases it holds), for the views and for a tick of 0.9.0; whether the job is dead is
        judged from :attr:`shard_job_registry` only."""
        return f"{self.prefix}:run:{{{run_id}}}:beat:{rq_job_id}"

    def run_capacity(self, run_id: str) -> str:
        """The run's measured capacity (hash, :mod:`redis_lease.fleet.capacity.run_capacity`)."""
        return f"{self.prefix}:run:{{{run_id}}}:capacity"

    def run_ages(self, run_id: str) -> str:
        """The run's oldest-eligible-age series (stream, :mod:`redis_lease.fleet.runs.run_ages`)."""
        return f"{self.prefix}:run:{{{run_id}}}:ages"

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

    def job_tick_lock(self, name: str) -> str:
        """The lock of one tick of the job (string with a TTL)."""
        return f"{self.prefix}:job:{{{name}}}:tick"

    def job_tick_fence(self, name: str) -> str:
        """The newest tick leader's token that took the job's tick lock (string: a decimal
        number, ``tick_lock.lua``)."""
        return f"{self.job_tick_lock(name)}:fence"

    def _job_records(self, name: str) -> str:
        """Where a job's records of its runs start; ad-hoc runs' (``name`` "") have theirs."""
        return self.job(name) if name else f"{self.prefix}:{ADHOC_TAG}:{{{ADHOC_TAG}}}"

    def job_lost(self, name: str) -> str:
        """The job's lost runs (hash: run id -> its record,
        :mod:`redis_lease.fleet.loss.lost_records`); ``name`` "" for ad-hoc runs."""
        return f"{self._job_records(name)}:lost"

    def job_tallies(self, name: str) -> str:
        """The job's counters (hash, :mod:`redis_lease.fleet.runs.job_tallies`); ``name`` ""
        for ad-hoc runs."""
        return f"{self._job_records(name)}:tallies"

    def job_counted_runs(self, name: str) -> str:
        """The job's counted ends (sorted set: ``<run>@<state_at>`` -> ms the entry may go);
        ``name`` "" for ad-hoc runs."""
        return f"{self._job_records(name)}:finished_runs"

    @property
    def data_set(self) -> str:
        """The data set's mark (hash: id, epoch, seq, losses; see
        :mod:`redis_lease.fleet.loss.data_set_mark`)."""
        return f"{self.prefix}:dataset"

    @property
    def data_set_remembered(self) -> str:
        """The data set's mark as remembered on the Redis of RQ's queues (string: JSON,
        :mod:`redis_lease.fleet.loss.tick_memory`)."""
        return f"{self.data_set}:remembered"

    @property
    def protocol(self) -> str:
        """The protocol the data under the prefix is in (string: a decimal number), set by
        the first worker (:mod:`redis_lease.protocol.store.stamp`)."""
        return f"{self.prefix}:protocol"

    @property
    def shard_job_registry(self) -> list[str]:
        """The shard jobs at work, one hash tag: their entries (hash: RQ job id -> JSON: run,
        shard, worker, owner, host, pid, path, queue, budget), their beats (sorted set: RQ
        job id -> server ms of its last beat), the takeovers begun (sorted set: RQ job id ->
        server ms) and the fleet's clock (hash: last_ms, stall_end_ms, stall_ms, stalls;
        ``lua/include/fleet_clock.lua``)."""
        base = f"{self.prefix}:{{shard_jobs}}"
        return [base, f"{base}:beats", f"{base}:taking", f"{base}:clock"]

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
    def tick_leader(self) -> str:
        """The tick leader's lease (hash: holder, token, expires ms, and what the holder says
        of the declared jobs it does not tick; ``tick_leader.lua``): the one worker of the
        fleet that ticks."""
        return f"{self.prefix}:{{tick_leader}}"

    @property
    def tick_declared(self) -> list[str]:
        """The jobs each worker process given jobs declared (hash: process id -> JSON:
        worker, jobs) and when each last declared them (sorted set: process id -> server
        ms), beside the tick leader's lease in its hash tag (``declare_jobs.lua``)."""
        return [f"{self.tick_leader}:declared", f"{self.tick_leader}:declared:seen"]

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

    @property
    def everything(self) -> str:
        """A SCAN pattern matching every key under the prefix."""
        return f"{self.prefix}:*"

    def outliving_runs(self, jobs: Sequence[str], providers: Sequence[str] = ()) -> set[str]:
        """The keys of :data:`OUTLIVE_RUNS` for these jobs (and ad-hoc runs) and providers."""
        names: set[str] = set()
        for member in OUTLIVE_RUNS:
            built = getattr(self, member)
            if not callable(built):
                names.update([built] if isinstance(built, str) else built)
                continue
            for arg in providers if member == "provider" else [*jobs, ""]:
                value = built(arg)
                names.update([value] if isinstance(value, str) else value)
        return names
