"""The burst and its trials as data: the scaled scenario, the arrivals, one trial's record.

Nothing here starts a process or reads Redis (see ``benchmarks/burst.py``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Scenario:
    """The burst as measured: the seed's figures times ``scale`` (the rate r is kept)."""

    eligible_full: int
    window_full: float
    slo_full: float
    scale: float
    handler_ms: float
    retry_rate: float
    max_workers: int

    @property
    def eligible(self) -> int:
        """E on this machine."""
        return max(1, round(self.eligible_full * self.scale))

    @property
    def window(self) -> float:
        """W on this machine, in seconds."""
        return self.window_full * self.scale

    @property
    def slo(self) -> float:
        """The SLO on this machine, in seconds."""
        return self.slo_full * self.scale

    @property
    def per_worker(self) -> float:
        """r: items per second of one consumer (one handler at a time)."""
        return 1000.0 / self.handler_ms

    def to_dict(self) -> dict[str, Any]:
        """The scenario, full scale and scaled, as JSON-ready data."""
        return {
            **asdict(self),
            "eligible": self.eligible,
            "window": self.window,
            "slo": self.slo,
            "per_worker": self.per_worker,
        }


def arrivals(elapsed: float, eligible: int, window: float) -> int:
    """Items eligible ``elapsed`` seconds into the burst: E*t/W, all of them from W on."""
    if elapsed >= window:
        return eligible
    return max(0, min(eligible, math.floor(eligible * elapsed / window)))


@dataclass
class Trial:
    """One burst worked by ``workers`` consumers, and its sampled oldest eligible age."""

    workers: int
    drained: bool
    samples: list[tuple[float, float]]
    seconds: float = 0.0
    done: int = 0
    dead: int = 0
    claims: int = 0
    retries: int = 0
    state: str = ""
    drained_at: float | None = None
    timed_out: bool = False
    #: Shard jobs this process enqueued (the consumers re-enqueue their own after a budget).
    dispatched: int = 0
    #: The longest a shard job stayed taken off its queue but not started (seconds): the
    #: dispatcher counts such a job as live for ``dispatch.MISSING_GRACE_MS``.
    stalled_job_seconds: float = 0.0
    exit_codes: list[int] = field(default_factory=list)

    @property
    def peak(self) -> float:
        """The highest oldest-eligible age sampled, in seconds."""
        return max((age for _, age in self.samples), default=0.0)

    @property
    def label(self) -> str:
        """``K=3``, or ``K=3, 1 drained`` for a drained trial."""
        return f"K={self.workers}" + (", 1 drained" if self.drained else "")

    def holds(self, slo: float) -> bool:
        """True when the burst finished and the age never passed ``slo``."""
        return not self.timed_out and self.peak <= slo

    @property
    def attempt_rate(self) -> float:
        """Attempts per second of the whole fleet, burst start to last item done."""
        return self.claims / self.seconds if self.seconds > 0 else 0.0

    def attempts_per_item(self) -> float:
        """Claims per item done (1.0 without retries)."""
        return self.claims / self.done if self.done else 0.0

    def to_dict(self, slo: float) -> dict[str, Any]:
        """The trial as JSON-ready data (samples as [seconds, age] pairs)."""
        data = asdict(self)
        data["samples"] = [[round(t, 3), round(age, 3)] for t, age in self.samples]
        data["peak"] = round(self.peak, 3)
        data["holds"] = self.holds(slo)
        data["seconds"] = round(self.seconds, 3)
        data["stalled_job_seconds"] = round(self.stalled_job_seconds, 3)
        data["attempts_per_item"] = round(self.attempts_per_item(), 4)
        data["attempt_rate"] = round(self.attempt_rate, 3)
        return data
