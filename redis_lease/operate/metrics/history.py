"""Histograms of processing duration and queue age by job, from the shards' attempt logs.

Each ended attempt has one entry in its shard's attempt log (``lua/include/attempt_log.lua``,
KEYS[8]) with ``queue_ms`` (eligible to claimed) and ``run_ms`` (claimed to the entry).
The exporter reads the entries it has not seen yet and adds them to buckets it keeps
in memory: a cursor per stream (the last entry id read) and the bucket counts live in
the exporter's process, so the histograms restart at zero with it. Prometheus takes
that as a counter reset (``rate()`` and ``increase()`` handle it).

Only attempts that end after the exporter started are counted: a stream that exists at
its first scrape starts at the stream's last entry (nothing old is counted, so a restart
is no burst of old attempts); a stream that appears later (a new run) is read from its
start. A final run's streams are not read again once read to their end while final.

Work per scrape is bounded: at most :data:`MAX_ENTRIES_PER_SCRAPE` entries over all
streams, read in pages of :data:`PAGE`; a stream not read to its end goes on at the
next scrape. An exporter that falls behind a log by more than its cap
(``limits.ATTEMPT_LOG_CAP`` entries per shard) finds the entries after its cursor
trimmed: they are counted in ``redis_lease_attempt_log_skipped_total`` (from the
stream's ``entries-added``, Redis 7 and later), not in the histograms.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from ...protocol.connection.clients import as_text
from ...protocol.store.lease_store import LeaseStore

PROCESSING = "redis_lease_processing_duration_seconds"
QUEUE_AGE = "redis_lease_queue_age_seconds"
SKIPPED = "redis_lease_attempt_log_skipped"
#: Upper bounds (seconds) of the processing-duration buckets.
PROCESSING_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
#: Upper bounds (seconds) of the queue-age buckets.
QUEUE_BUCKETS = (0.1, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
#: Attempts the holder ended (its handler ran to the end): their ``run_ms`` is processing.
HOLDER_EVENTS = frozenset({"committed", "retry", "dead", "released"})
#: Entries read per XRANGE.
PAGE = 1000
#: The most entries read in one scrape, over all streams.
MAX_ENTRIES_PER_SCRAPE = 50_000


@dataclass
class _Buckets:
    """One histogram series: counts per bucket (not cumulative), sum and count."""

    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        index = next((i for i, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[index] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        counts = self.counts or [0] * (len(self.bounds) + 1)
        running, out = 0, []
        for bound, count in zip([*map(str, self.bounds), "+Inf"], counts, strict=True):
            running += count
            out.append((bound, float(running)))
        return out


class LogStream(NamedTuple):
    """An attempt log to read: its key, its run's job, and whether the run is final."""

    key: str
    job: str
    final: bool = False


@dataclass
class _Cursor:
    """Where the exporter is in one stream."""

    #: The last entry id read ("0-0": none yet).
    last: str = "0-0"
    #: Entries the stream had received up to ``last`` (None: unknown, before Redis 7).
    added: int | None = 0
    #: Read to its end while its run was final: not read again while the run stays final.
    at_end: bool = False


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _seconds(text: str) -> float | None:
    try:
        return int(text) / 1000 if text else None
    except ValueError:
        return None


class AttemptHistograms:
    """Processing-duration and queue-age histograms by job, accumulated across scrapes.

    Not shared between processes: each exporter keeps its own cursors and buckets.
    Safe to call from the threads of one HTTP server (a lock guards it).
    """

    def __init__(self, max_entries: int = MAX_ENTRIES_PER_SCRAPE, page: int = PAGE) -> None:
        self.max_entries = max_entries
        self.page = page
        self._cursors: dict[str, _Cursor] = {}
        self._processing: dict[str, _Buckets] = {}
        self._queue: dict[str, _Buckets] = {}
        self._skipped: dict[str, int] = {}
        self._primed = False
        self._turn = 0
        self._lock = threading.Lock()

    def update(self, store: LeaseStore, streams: Iterable[LogStream]) -> int:
        """Reads the new entries of ``streams``; returns how many.

        The first call starts every stream it names at its last entry. Cursors of streams
        not named any more (runs no longer exported) are dropped.
        """
        wanted = {stream.key: stream for stream in streams}
        with self._lock:
            self._cursors = {k: v for k, v in self._cursors.items() if k in wanted}
            if not self._primed:
                self._prime(store, list(wanted))
            for key in wanted:
                self._cursors.setdefault(key, _Cursor())  # a stream new since: from its start
            keys = [k for k, s in wanted.items() if not (s.final and self._cursors[k].at_end)]
            # More streams than entries allowed: each scrape starts further on, so all get read.
            turn = self._turn % len(keys) if keys else 0
            behind = [*keys[turn:], *keys[:turn]]
            self._turn += self.max_entries
            read = 0
            while behind and read < self.max_entries:
                behind = behind[: self.max_entries - read]
                count = max(1, min(self.page, (self.max_entries - read) // len(behind)))
                pages = self._read(store, {key: wanted[key].job for key in behind}, count)
                still = []
                for key, entries in pages.items():
                    for entry_id, fields in entries:
                        self._observe(wanted[key].job, fields)
                        self._cursors[key].last = entry_id
                    read += len(entries)
                    if len(entries) >= count:
                        still.append(key)
                    else:
                        self._cursors[key].at_end = wanted[key].final
                behind = still
            return read

    def _prime(self, store: LeaseStore, keys: list[str]) -> None:
        """Starts each stream at its last entry: attempts before the exporter are not counted."""
        with store.translating_errors():
            pipe = store.client.pipeline(transaction=False)
            for key in keys:
                pipe.xinfo_stream(key)
            replies: list[Any] = pipe.execute(raise_on_error=False) if keys else []
        for key, info in zip(keys, replies, strict=True):
            if isinstance(info, dict):  # else no such stream yet: from its start
                added = info.get("entries-added")
                self._cursors[key] = _Cursor(
                    as_text(info["last-generated-id"]), None if added is None else int(added)
                )
        self._primed = True

    def _read(
        self, store: LeaseStore, jobs: dict[str, str], count: int
    ) -> dict[str, list[tuple[str, dict[str, str]]]]:
        """The next entries of each stream (key -> job; at most ``count`` new ones),
        counting the entries trimmed before they were read."""
        keys = list(jobs)
        with store.translating_errors():
            pipe = store.client.pipeline(transaction=False)
            for key in keys:  # from the cursor, inclusive: its presence says nothing was lost
                pipe.xrange(key, min=self._cursors[key].last, count=count + 1)
            replies: list[Any] = pipe.execute()
        pages: dict[str, list[tuple[str, dict[str, str]]]] = {}
        for key, reply in zip(keys, replies, strict=True):
            entries = [
                (as_text(i), {as_text(k): as_text(v) for k, v in fields.items()})
                for i, fields in reply or []
            ]
            cursor = self._cursors[key]
            if entries and entries[0][0] == cursor.last:
                entries = entries[1:]
                if cursor.added is not None:
                    cursor.added += len(entries)
            elif entries:
                entries = entries[:count]
                self._check_gap(store, jobs[key], key, entries)
            pages[key] = entries
        return pages

    def _check_gap(
        self, store: LeaseStore, job: str, key: str, entries: list[tuple[str, dict[str, str]]]
    ) -> None:
        """The cursor's entry is gone: counts the entries trimmed after it, unread.

        Entries trimmed in all = ``entries-added`` less the length; those up to the cursor
        were read (``added``), those of this page before the first entry left were read now.
        """
        cursor = self._cursors[key]
        try:
            with store.translating_errors():
                info: Any = store.client.xinfo_stream(key)
        except redis.ResponseError:  # the stream went meanwhile
            info = {}
        added, first = info.get("entries-added"), info.get("first-entry")
        if cursor.added is None or added is None or not first:
            cursor.added = None  # unknown from now on
            return
        first_id = _id(as_text(first[0]))
        read_before = sum(1 for entry_id, _ in entries if _id(entry_id) < first_id)
        skipped = max(0, int(added) - int(info["length"]) - cursor.added - read_before)
        if skipped:
            self._skipped[job] = self._skipped.get(job, 0) + skipped
        cursor.added += skipped + len(entries)

    def _observe(self, job: str, fields: dict[str, str]) -> None:
        event = fields.get("event", "")
        if event == "refused":
            return
        queued = _seconds(fields.get("queue_ms", ""))
        if queued is not None:
            self._queue.setdefault(job, _Buckets(QUEUE_BUCKETS)).observe(queued)
        ran = _seconds(fields.get("run_ms", ""))
        if ran is not None and event in HOLDER_EVENTS:
            self._processing.setdefault(job, _Buckets(PROCESSING_BUCKETS)).observe(ran)

    def families(self) -> list[Metric]:
        """The two histograms and the skipped entries, one series per job seen so far."""
        processing = HistogramMetricFamily(
            PROCESSING,
            "Handler time of attempts the holder ended (claimed to committed, failed or "
            "released), from the attempt logs; kept by this exporter since it started.",
            labels=["job"],
        )
        queue = HistogramMetricFamily(
            QUEUE_AGE,
            "Wait of each attempt from eligible to claimed, from the attempt logs; kept by "
            "this exporter since it started.",
            labels=["job"],
        )
        skipped = CounterMetricFamily(
            SKIPPED,
            "Attempt-log entries trimmed before this exporter read them (not in the "
            "histograms): it fell behind a log by more than its cap.",
            labels=["job"],
        )
        with self._lock:
            for family, series in ((processing, self._processing), (queue, self._queue)):
                for job, buckets in sorted(series.items()):
                    family.add_metric([job], buckets.cumulative(), buckets.total)
            for job in sorted({*self._processing, *self._queue, *self._skipped}):
                skipped.add_metric([job], self._skipped.get(job, 0))
        return [processing, queue, skipped]


__all__ = ["PROCESSING", "QUEUE_AGE", "SKIPPED", "AttemptHistograms", "LogStream"]
