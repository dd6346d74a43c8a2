"""A job's options: one typed, frozen dataclass whose fields say what each option changes.

Each field's ``metadata["doc"]`` is the option's one description: the table in
``docs/jobs.md`` is :func:`options_table`'s output (a test keeps the two equal), and
:class:`~redis_lease.fleet.jobs.job.Job` takes each field as a keyword of the same name.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, dataclass, field, fields
from datetime import timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from ...errors import InvalidInput
from ...limits import (
    ATTEMPTS_MAX,
    BATCH_MAX,
    CATCH_UP_DAYS_MAX,
    CONCURRENCY_MAX,
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETENTION_DAYS,
    DEFAULT_TTL,
    MAX_SHARD_JOBS_MAX,
    RETENTION_DAYS_MAX,
    SHARD_COUNT_MAX,
    SPARE_NODES_MAX,
    WORKERS_PER_NODE_MAX,
    WORKERS_PER_SHARD_MAX,
)
from ...protocol.validation import check_id, check_positive, ttl_to_ms

CATCH_UP_POLICIES = ("all", "latest", "none")
#: The deadline when a job names none: this long after the run starts.
DEFAULT_DEADLINE_AFTER = timedelta(hours=6)
_CLOCK_TIME = re.compile(r"\d\d:\d\d")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def check_concurrency(value: int) -> int:
    """Returns ``value`` when it is a valid concurrency (1 to CONCURRENCY_MAX), else raises."""
    return check_positive(value, "concurrency", CONCURRENCY_MAX)


def parse_duration(text: str) -> timedelta:
    """Parses ``90s``, ``45m``, ``2h`` or ``1d``."""
    match = _DURATION.match(text.strip())
    if not match:
        raise InvalidInput(f"invalid duration {text!r}: use a number and s, m, h or d, e.g. 2h")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def _in_largest_unit(span: timedelta) -> tuple[str, str]:
    """A duration's amount in its largest whole unit, and that unit (``("6", "h")``)."""
    seconds = span.total_seconds()
    for unit, size in sorted(_UNIT_SECONDS.items(), key=lambda pair: -pair[1]):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}", unit
    return f"{seconds:g}", "s"


def duration_text(span: timedelta) -> str:
    """A duration as :func:`parse_duration` reads it, in its largest whole unit (``6h``)."""
    return "".join(_in_largest_unit(span))


@dataclass(frozen=True)
class JobOptions:
    """The options of a job's runs (recorded in Redis so ``status`` can show them).

    Each option's meaning is its field's ``metadata["doc"]``, tabled in ``docs/jobs.md``.
    The deadline has two forms, exactly one given: ``deadline_at`` (a clock time) or
    ``deadline_after`` (a duration); with neither, ``deadline_after`` is 6 hours.
    """

    shards: int = field(
        default=8,
        metadata={"doc": "Shards per run; a shard is the unit of work of one shard job."},
    )
    lease_ttl_seconds: float = field(
        default=DEFAULT_TTL,
        metadata={
            "doc": (
                "How long a claim lasts unless renewed (renewed every third of it). A stopped "
                "worker is taken over by its heartbeat within seconds; this is the bound where no "
                "`redis-lease worker` watches, and the most a paused or cut-off holder keeps it."
            )
        },
    )
    max_attempts: int = field(
        default=DEFAULT_MAX_ATTEMPTS, metadata={"doc": "Claims of an item before it goes dead."}
    )
    backoff_base_seconds: float = field(
        default=DEFAULT_BACKOFF_BASE,
        metadata={"doc": "The delay before an item's first retry; doubles per attempt."},
    )
    backoff_cap_seconds: float = field(
        default=DEFAULT_BACKOFF_CAP, metadata={"doc": "The longest retry delay."}
    )
    deadline_at: str | None = field(
        default=None,
        metadata={
            "doc": (
                'A clock time `"HH:MM"` in the job\'s timezone: the run must finish by the '
                "first such time after its scheduled start. Not with `deadline_after`."
            )
        },
    )
    deadline_after: timedelta | None = field(
        default=None,
        metadata={
            "doc": (
                "How long after the run starts it must finish (6 hours when no deadline is given). "
                "Not with `deadline_at`."
            )
        },
    )
    schedule: str = field(
        default="0 2 * * *", metadata={"doc": "A cron expression in the job's timezone."}
    )
    timezone: str = field(
        default="UTC",
        metadata={"doc": "An IANA zone name; business dates are dates in this zone."},
    )
    catch_up: str = field(
        default="latest",
        metadata={
            "doc": (
                "For dates missed while nothing ticked: `all` (within `catch_up_days`), `latest` "
                "or `none`."
            )
        },
    )
    catch_up_days: int = field(
        default=7, metadata={"doc": 'How far back `catch_up="all"` looks, in days.'}
    )
    catch_up_grace_seconds: float = field(
        default=900.0,
        metadata={"doc": "How long after a scheduled time a run still counts as on time."},
    )
    workers_per_shard: int = field(
        default=1, metadata={"doc": "Shard jobs normally working one shard."}
    )
    max_shard_jobs: int = field(
        default=16,
        metadata={
            "doc": (
                "The most shard jobs working one run at once (burst capacity included). It bounds "
                "the shard jobs the tick enqueues, not the worker processes: below "
                "`shards * workers_per_shard` some shards wait for a later tick."
            )
        },
    )
    shard_budget_seconds: float = field(
        default=300.0,
        metadata={"doc": "How long one shard job works a shard before it re-enqueues itself."},
    )
    batch_size: int = field(
        default=400,
        metadata={
            "doc": (
                "The most items one claim takes. Each claim takes about 0.2 s of handler work for "
                "the slots (by the recent mean handler time; 20 items at first), within this."
            )
        },
    )
    commit_interval_seconds: float = field(
        default=0.05,
        metadata={
            "doc": (
                "How long a finished item's commit may wait to be sent with others (one round trip "
                "per batch); 0 commits each item at once."
            )
        },
    )
    queue: str = field(
        default="redis-lease", metadata={"doc": "The RQ queue of the job's shard jobs."}
    )
    concurrency: int = field(
        default=1,
        metadata={
            "doc": (
                "Handlers one shard job runs at once (threads for plain handlers, one event loop "
                "for `async def` ones); each holds its own lease."
            )
        },
    )
    spare_nodes: int = field(
        default=0,
        metadata={
            "doc": (
                "Nodes that may disappear; the tick's `workers_needed` adds "
                "`spare_nodes * workers_per_node` workers for them."
            )
        },
    )
    workers_per_node: int = field(default=1, metadata={"doc": "Worker processes one node runs."})
    retention_days: int = field(
        default=DEFAULT_RETENTION_DAYS, metadata={"doc": "Days a finished run's keys are kept."}
    )

    def __post_init__(self) -> None:
        check_positive(self.shards, "shards", SHARD_COUNT_MAX)
        check_positive(self.max_attempts, "max_attempts", ATTEMPTS_MAX)
        check_positive(self.catch_up_days, "catch_up_days", CATCH_UP_DAYS_MAX)
        check_positive(self.workers_per_shard, "workers_per_shard", WORKERS_PER_SHARD_MAX)
        check_positive(self.max_shard_jobs, "max_shard_jobs", MAX_SHARD_JOBS_MAX)
        check_positive(self.batch_size, "batch_size", BATCH_MAX)
        check_positive(self.retention_days, "retention_days", RETENTION_DAYS_MAX)
        check_concurrency(self.concurrency)
        if self.spare_nodes != 0:  # none spare is allowed
            check_positive(self.spare_nodes, "spare_nodes (0 for none)", SPARE_NODES_MAX)
        check_positive(self.workers_per_node, "workers_per_node", WORKERS_PER_NODE_MAX)
        if self.catch_up not in CATCH_UP_POLICIES:
            raise InvalidInput(f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}")
        if not croniter.is_valid(self.schedule):
            raise InvalidInput(f"schedule {self.schedule!r} is not a valid cron expression")
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidInput(f"unknown timezone {self.timezone!r}; use an IANA name") from None
        self._check_deadline()
        ttl_to_ms(self.lease_ttl_seconds, "lease_ttl_seconds")  # before what is bound by it
        if not 0 <= self.commit_interval_seconds < self.lease_ttl_seconds / 2:
            raise InvalidInput(
                "commit_interval_seconds must be from 0 to under half the lease_ttl_seconds"
            )
        ttl_to_ms(self.backoff_base_seconds, "backoff_base_seconds")
        ttl_to_ms(self.backoff_cap_seconds, "backoff_cap_seconds")
        if not 0 < self.shard_budget_seconds < math.inf:
            raise InvalidInput("shard_budget_seconds must be a positive number of seconds")
        check_id(self.queue, "queue")

    def _check_deadline(self) -> None:
        """At most one deadline form, each well formed."""
        if self.deadline_at is not None and self.deadline_after is not None:
            raise InvalidInput("give deadline_at (a clock time) or deadline_after, not both")
        if self.deadline_at is not None:
            if not _CLOCK_TIME.fullmatch(self.deadline_at):
                raise InvalidInput(
                    f'deadline_at {self.deadline_at!r} must be a clock time "HH:MM"; '
                    "for a duration use deadline_after=timedelta(...)"
                )
            hour, minute = (int(part) for part in self.deadline_at.split(":"))
            if hour > 23 or minute > 59:
                raise InvalidInput(f"deadline_at {self.deadline_at!r} is not a time of day")
            return
        after = self.deadline_after
        if after is not None and (not isinstance(after, timedelta) or after <= timedelta(0)):
            raise InvalidInput("deadline_after must be a positive timedelta")

    @property
    def deadline_window(self) -> timedelta | None:
        """How long after its start a run must finish: ``deadline_after`` (6 hours when
        no deadline is given); None when the deadline is the clock time ``deadline_at``."""
        if self.deadline_at is not None:
            return None
        return self.deadline_after or DEFAULT_DEADLINE_AFTER

    def settings(self) -> dict[str, str]:
        """The options as text, for the job's record in Redis (no unset deadline form)."""
        texts: dict[str, str] = {}
        for option in fields(self):
            value = getattr(self, option.name)
            if option.name == "deadline_after":
                value = self.deadline_window
            if value is not None:
                texts[option.name] = (
                    duration_text(value) if isinstance(value, timedelta) else str(value)
                )
        return texts


def options_table() -> str:
    """The Markdown table of every option: its name, type, default and what it changes."""
    rows = ["| option | type | default | what it changes |", "| --- | --- | --- | --- |"]
    for option in fields(JobOptions):
        default = "" if option.default is MISSING else repr(option.default).replace("'", '"')
        kind = str(option.type).replace("|", "\\|")
        doc = str(option.metadata["doc"]).replace("|", "\\|")
        rows.append(f"| `{option.name}` | `{kind}` | `{default}` | {doc} |")
    return "\n".join(rows) + "\n"


__all__ = [
    "CATCH_UP_POLICIES",
    "DEFAULT_DEADLINE_AFTER",
    "JobOptions",
    "check_concurrency",
    "duration_text",
    "options_table",
    "parse_duration",
]
