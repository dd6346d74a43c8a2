"""A history checker for fenced leases.

Every process of a test writes the events it saw (a claim it was granted, a
commit that was accepted, a commit refused with "lease lost") as JSON lines.
:func:`check` merges them and asserts the promise of DESIGN.md section 1:

* per item, every token is handed out once, and tokens increase in claim order
  (claims ordered by the server time at which they were granted);
* exactly one accepted commit per item (for the items the caller names);
* an accepted commit comes from the latest token of its item, was granted, and
  landed before that lease expired (server clock); no token is both accepted
  and refused.

Times are server milliseconds (``TIME`` inside the scripts), the only clock the
scripts use, so events from different processes can be compared.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from redis_lease.lease import CommitOutcome, Lease

CLAIM = "claim"
COMMIT = "commit"
LOST = "lost"
KINDS = (CLAIM, COMMIT, LOST)


@dataclass(frozen=True)
class Event:
    """One observed outcome: a granted claim, an accepted commit, a refused commit.

    ``at_ms`` is the server time of a claim or an accepted commit (0 when unknown,
    e.g. for a refusal); ``expires_ms`` is the lease expiry a claim handed out.
    """

    kind: str
    item: str
    token: int
    worker: str = ""
    at_ms: int = 0
    expires_ms: int = 0
    takeover: bool = False

    @classmethod
    def claimed(cls, lease: Lease, ttl_ms: int) -> Event:
        """The claim event of a lease granted with a TTL of ``ttl_ms``."""
        return cls(
            CLAIM,
            lease.item_id,
            lease.token,
            lease.worker,
            at_ms=lease.expires_at_ms - ttl_ms,
            expires_ms=lease.expires_at_ms,
            takeover=lease.takeover,
        )

    @classmethod
    def committed(cls, lease: Lease, outcome: CommitOutcome) -> Event:
        """The event of an accepted commit."""
        return cls(COMMIT, lease.item_id, outcome.token, lease.worker, at_ms=outcome.done_at_ms)

    @classmethod
    def lost(cls, lease: Lease) -> Event:
        """The event of a commit refused with LeaseLost."""
        return cls(LOST, lease.item_id, lease.token, lease.worker)

    def to_json(self) -> str:
        """One JSON line."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Event:
        """Parses a line written by :meth:`to_json`."""
        return cls(**json.loads(line))


class HistoryViolation(AssertionError):
    """The history breaks an invariant; ``problems`` lists each breach."""

    def __init__(self, problems: list[str]) -> None:
        shown = "\n  ".join(problems[:20])
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{len(problems)} invariant violation(s):\n  {shown}{more}")
        self.problems = problems


@dataclass
class Summary:
    """What a checked history contained."""

    claims: int = 0
    takeovers: int = 0
    accepted: int = 0
    lost: int = 0
    #: Items claimed more than once.
    reclaimed_items: int = 0
    #: The highest token seen per item.
    max_token: dict[str, int] = field(default_factory=dict)


def read(paths: Iterable[Path]) -> list[Event]:
    """Every event of the given JSON-lines files."""
    events: list[Event] = []
    for path in paths:
        with path.open() as lines:
            events.extend(Event.from_json(line) for line in lines if line.strip())
    return events


def check(
    events: Iterable[Event],
    *,
    items: Iterable[str] | None = None,
    contiguous: bool = False,
) -> Summary:
    """Asserts the lease invariants over a merged history; returns a summary.

    Args:
        events: every event of every process, in any order.
        items: the items that must each have exactly one accepted commit (None:
            only "at most one" is checked).
        contiguous: also require each item's tokens to be 1, 2, ... n with no gap
            (true when every claim's reply reached a recorder).

    Raises:
        HistoryViolation: listing every breach found.
    """
    claims: dict[str, list[Event]] = defaultdict(list)
    commits: dict[str, list[Event]] = defaultdict(list)
    refused: dict[str, set[int]] = defaultdict(set)
    summary = Summary()
    problems: list[str] = []
    for event in events:
        if event.kind == CLAIM:
            claims[event.item].append(event)
        elif event.kind == COMMIT:
            commits[event.item].append(event)
        elif event.kind == LOST:
            refused[event.item].add(event.token)
            summary.lost += 1
        else:
            problems.append(f"unknown event kind {event.kind!r}")
    for item, granted in claims.items():
        granted.sort(key=lambda e: (e.token, e.at_ms))
        summary.claims += len(granted)
        summary.takeovers += sum(e.takeover for e in granted)
        summary.reclaimed_items += len(granted) > 1
        summary.max_token[item] = granted[-1].token
        for before, after in itertools.pairwise(granted):
            if before.token == after.token:
                problems.append(
                    f"{item}: token {after.token} handed out twice "
                    f"({before.worker} and {after.worker})"
                )
            elif after.at_ms < before.at_ms:
                problems.append(
                    f"{item}: token {after.token} granted at {after.at_ms} ms, before token "
                    f"{before.token} at {before.at_ms} ms: tokens went back"
                )
        tokens = [e.token for e in granted]
        if contiguous and tokens != list(range(1, len(tokens) + 1)):
            problems.append(f"{item}: tokens {tokens} are not 1..{len(tokens)}")
    for item, accepted in commits.items():
        summary.accepted += len(accepted)
        if len(accepted) > 1:
            tokens = [e.token for e in accepted]
            problems.append(f"{item}: {len(accepted)} accepted commits (tokens {tokens})")
        by_token = {e.token: e for e in claims.get(item, [])}
        latest = summary.max_token.get(item, 0)
        for commit in accepted:
            claim = by_token.get(commit.token)
            if claim is None:
                problems.append(f"{item}: commit accepted from token {commit.token}, never granted")
                continue
            if commit.token != latest:
                problems.append(
                    f"{item}: commit accepted from token {commit.token} but token {latest} "
                    "was granted too (a stale commit won, or a done item was claimed)"
                )
            if not claim.at_ms <= commit.at_ms < claim.expires_ms:
                problems.append(
                    f"{item}: commit of token {commit.token} at {commit.at_ms} ms is outside its "
                    f"lease [{claim.at_ms}, {claim.expires_ms}) ms"
                )
            if commit.token in refused.get(item, set()):
                problems.append(f"{item}: token {commit.token} was both accepted and refused")
    for item in items if items is not None else ():
        if not commits.get(item):
            problems.append(f"{item}: no accepted commit")
    if problems:
        raise HistoryViolation(problems)
    return summary
