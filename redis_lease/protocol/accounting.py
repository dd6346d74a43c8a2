"""A run's accounting: its items counted by state over its shards, its counters and ages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: The states an item is counted in; a run's items are the sum over them.
COUNT_STATES = ("pending", "leased", "done", "dead")


@dataclass(frozen=True)
class RunStatus:
    """Counts and ages of a run, summed over its shards.

    The one definition of a run's accounting: :attr:`planned`, :attr:`unfinished`,
    :attr:`finished`, :attr:`lost` and :attr:`late`. Status, the tick (dispatch,
    burst, projected finish) and finalizing use only these.
    """

    run_id: str
    shards: int
    state: str
    counts: dict[str, int]
    #: The shards' counters summed (claims, commits, takeovers, ``outcome_<label>``, ...).
    counters: dict[str, int]
    oldest_eligible_age_seconds: float
    oldest_leased_age_seconds: float
    now_ms: int
    oldest_unknown_effect_age_seconds: float = 0.0
    info: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def unfinished_of(counts: Mapping[str, int]) -> int:
        """Items still to work in ``counts`` (a run's or one shard's): pending or leased."""
        return counts.get("pending", 0) + counts.get("leased", 0)

    @property
    def total(self) -> int:
        """The run's items now, in every state."""
        return sum(self.counts.values())

    @property
    def planned(self) -> int:
        """Items planned: the count recorded when planning ended, or the shards' ``added``
        counters when more were added since (or the run was never planned)."""
        recorded = int(self.info.get("planned_items") or 0)
        return max(recorded, self.counters.get("added", 0))

    @property
    def unfinished(self) -> int:
        """Items still to work: pending or leased."""
        return self.unfinished_of(self.counts)

    @property
    def finished(self) -> int:
        """Items no longer worked: done, or dead after their last attempt."""
        return self.counts["done"] + self.counts["dead"]

    @property
    def lost(self) -> int:
        """Items planned but in no state any more: their record or index entry vanished."""
        return max(0, self.planned - self.total)

    @property
    def late(self) -> int:
        """Commits accepted after the deadline (their lease was granted before it)."""
        return self.counters.get("late_commits", 0)

    @property
    def complete(self) -> bool:
        """Exactly the planned items, every one done before the deadline (none lost or late)."""
        return self.counts["done"] == self.planned == self.total and self.late == 0

    def to_dict(self) -> dict[str, Any]:
        """The status as JSON-ready data."""
        return {
            "run": self.run_id,
            "state": self.state,
            "shards": self.shards,
            "counts": dict(self.counts),
            "total": self.total,
            "planned": self.planned,
            "unfinished": self.unfinished,
            "finished": self.finished,
            "lost": self.lost,
            "late": self.late,
            "events": dict(self.counters),  # the JSON key stays
            "oldest_eligible_age_seconds": self.oldest_eligible_age_seconds,
            "oldest_leased_age_seconds": self.oldest_leased_age_seconds,
            "oldest_unknown_effect_age_seconds": self.oldest_unknown_effect_age_seconds,
            **({"info": dict(self.info)} if self.info else {}),
        }
