"""The rows the CLI's views and the dashboard make of a run and its items.

One definition of each: a run's deadline and projected finish (server clock, ms, and as
text), its health, its row in a listing, its decisions, its job's recorded settings, its
effects by outcome and the providers' gates; an
item's record, effect records and attempts as JSON-ready rows (times ISO 8601 UTC).
The reads that page through a run are in :mod:`redis_lease.operate.views`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..fleet.effects.provider_gate import GateState
from ..fleet.runs.lifecycle import Runs
from ..fleet.runs.run_states import (
    CANCELED,
    FAILED,
    FINAL_STATES,
    LOST_STATE,
    PARTIAL,
    PLANNING,
    SUCCEEDED,
)
from ..messages import count_of
from ..protocol.connection.clients import as_text
from ..protocol.leases import ItemRecord, RunStatus
from ..protocol.store.lease_store import LeaseStore
from .cli_printing import iso_time, same_times

# -- runs ------------------------------------------------------------------------------

#: A run's health, as the dashboard colours it (see :func:`run_health`).
HEALTHS = ("ok", "at-risk", "late", "failed")


def deadline_ms(status: RunStatus) -> int | None:
    """The run's deadline (server clock, ms), or None when it has none."""
    text = status.info.get("deadline_at", "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def projected_finish_ms(status: RunStatus) -> int | None:
    """When the run should finish at its recent rate; None once it is final (or unknown)."""
    text = status.info.get("projected_finish_at", "")
    if status.state in FINAL_STATES or not text.isdigit():
        return None
    return int(text)


def run_rate(status: RunStatus) -> float | None:
    """The run's own rate: items finished (done or dead) per second from its making to its
    end (to now while it is open); None when its making time is not recorded. Not the
    tick's recent rate (``rate_per_s``), which a retry tail drags down at the end."""
    made = status.info.get("created_at", "")
    if not made.isdigit():
        return None
    ended = status.info.get("state_at", "")
    end = int(ended) if status.state in FINAL_STATES and ended.isdigit() else status.now_ms
    seconds = (end - int(made)) / 1000
    return status.finished / seconds if seconds > 0 else None


def deadline_text(status: RunStatus) -> str | None:
    """The run's deadline as ISO 8601 UTC (ms), or None when it has none."""
    return iso_time(deadline_ms(status))


def projected_finish_text(status: RunStatus) -> str | None:
    """The projected finish as ISO 8601 UTC (ms), or None (see :func:`projected_finish_ms`)."""
    return iso_time(projected_finish_ms(status))


#: A run planning this long (since it was made, or resumed) is at risk: its tick may be failing.
PLANNING_STUCK_MS = 10 * 60_000


def run_health(status: RunStatus) -> str:
    """The run's health: the first word of :func:`health_of`."""
    return health_of(status)[0]


def health_of(status: RunStatus) -> tuple[str, str]:
    """The run's health and why, from the facts the alerts use:

    - ``failed``: it ended partial, failed or lost; or it is open and can only end failed
      (every item dead or lost, none left to work, none done);
    - ``late``: open past its deadline;
    - ``at-risk``: it cannot succeed any more (dead or lost items), its planning failed
      and waits to try again, it has been planning for 10 minutes, or its projected finish
      is after its deadline;
    - ``ok``: none of these (a succeeded or canceled run: a cancel is an operator's
      decision, never late).
    """
    counts = status.counts
    if status.state in (PARTIAL, FAILED, LOST_STATE):
        return "failed", f"it ended {status.state}"
    if status.state in (SUCCEEDED, CANCELED):
        return "ok", ""
    gone = counts.get("dead", 0) + status.lost
    if gone and not status.unfinished and not counts.get("done", 0):
        return "failed", f"every item is dead or lost ({gone}): it can only end failed"
    deadline = deadline_ms(status)
    if deadline is not None and status.now_ms > deadline:
        return "late", "open past its deadline"
    if gone:
        dead = count_of(counts.get("dead", 0), "item")
        return "at-risk", f"{dead} dead, {status.lost} lost: it can end partial at best"
    if status.state == PLANNING:
        if status.info.get("planning_error"):
            return (
                "at-risk",
                f"planning failed and waits to try again: {status.info['planning_error']}",
            )
        since = status.info.get("state_at", "")
        if since.isdigit() and status.now_ms - int(since) >= PLANNING_STUCK_MS:
            minutes = (status.now_ms - int(since)) // 60_000
            return "at-risk", (
                f"planning for {minutes} minutes: a slow planner, or a tick that fails "
                "(see its decisions)"
            )
    projected = projected_finish_ms(status)
    if deadline is not None and projected is not None and projected > deadline:
        return "at-risk", "its projected finish is after its deadline"
    return "ok", ""


def is_past_deadline(status: RunStatus) -> bool:
    """Whether the run is past its deadline: open after it, or final (not canceled) with an
    end after it (a run the deadline closed is late as well as partial or failed)."""
    deadline = deadline_ms(status)
    if deadline is None or status.state in (CANCELED, LOST_STATE):
        return False
    if status.state not in FINAL_STATES:
        return status.now_ms > deadline
    ended = status.info.get("state_at", "")
    return ended.isdigit() and int(ended) > deadline


def state_text(status: RunStatus) -> str:
    """The run's state for people: ``partial (late)`` when :func:`is_past_deadline`."""
    return f"{status.state} (late)" if is_past_deadline(status) else status.state


def run_row(status: RunStatus) -> dict[str, Any]:
    """The run's row in a listing: job, state, deadline, projected finish, counts, health and
    why (:func:`health_of`), whether it is late (:func:`is_past_deadline`), and for a run lost
    or made again after a loss, why (``loss``)."""
    counts = status.counts
    health, why = health_of(status)
    return {
        "run": status.run_id,
        "job": status.info.get("job") or "",
        "state": status.state,
        "deadline": deadline_text(status),
        "projected_finish": projected_finish_text(status),
        "done": counts["done"],
        "planned": status.planned,
        "lost": status.lost,
        "dead": counts["dead"],
        "pending": counts["pending"],
        "leased": counts["leased"],
        "health": health,
        "health_reason": why,
        "past_deadline": is_past_deadline(status),
        "loss": loss_text(status),
    }


def loss_text(status: RunStatus) -> str | None:
    """What a loss did to the run: lost (with what to do), or made again or worked on after
    one (why, and the items planned again); None when no loss touched it."""
    info = status.info
    if status.state == LOST_STATE:
        return info.get("reason")
    if not info.get("after_loss"):
        return None
    text = f"after a loss: {info['after_loss']}"
    if info.get("replanned_items", "").isdigit():
        text += f"; re-run, {info['replanned_items']} items planned again"
    return text


def decision_rows(store: LeaseStore, run_id: str) -> list[dict[str, str | None]]:
    """The run's recorded decisions, times in one form (ISO 8601 UTC, ms)."""
    rows: list[dict[str, str | None]] = []
    for decision in Runs(store).decisions(run_id):
        at = decision.get("at", "")
        rows.append(
            {
                **decision,
                "at": iso_time(int(at)) if at.isdigit() else at,
                "reason": same_times(decision.get("reason", "")),
            }
        )
    return rows


def run_details(
    store: LeaseStore, status: RunStatus
) -> tuple[list[dict[str, str | None]], dict[str, str]]:
    """The run's recorded decisions and its job's recorded settings (empty for ad-hoc runs)."""
    decisions = decision_rows(store, status.run_id)
    job = status.info.get("job")
    settings: dict[str, str] = {}
    if job:
        with store.translating_errors(status.run_id):
            raw = store.client.hgetall(store.keys.job(job))
        settings = {as_text(k): as_text(v) for k, v in raw.items()}
    return decisions, settings


def effects_by_outcome(status: RunStatus) -> dict[str, int]:
    """The run's effect records by state (intended, applied, failed, unknown), and reconciled."""
    return {
        name.removeprefix("effects_"): value
        for name, value in sorted(status.counters.items())
        if name.startswith("effects_") and value
    }


def provider_rows(gates: Sequence[GateState]) -> list[dict[str, Any]]:
    """The providers' gates as JSON-ready rows (``paused_until`` in ISO 8601 UTC)."""
    return [
        {
            "provider": gate.name,
            "cap": gate.cap,
            "in_use": gate.in_use,
            "min_cap": gate.min_cap,
            "max_cap": gate.max_cap,
            "throttles": gate.throttles,
            "paused_until": iso_time(gate.paused_until_ms),
        }
        for gate in gates
    ]


# -- one item ---------------------------------------------------------------------------


def record_dict(record: ItemRecord) -> dict[str, Any]:
    """An item record as JSON-ready data (times in ISO 8601 UTC)."""
    return {
        "run": record.run_id,
        "item": record.item_id,
        "shard": record.shard,
        "state": record.state,
        "token": record.token,
        "attempts": record.attempts,
        "owner": record.owner,
        "lease_id": record.lease_id,
        "expires_at": iso_time(record.expires_at_ms),
        "payload": record.payload,
        "result": record.result,
        "error": record.error,
    }


def effect_row(record: dict[str, Any]) -> dict[str, Any]:
    """An effect record with its time in ISO 8601 UTC."""
    updated = record.get("updated_at")
    return {**record, "updated_at": iso_time(int(updated)) if isinstance(updated, int) else None}


def attempt_rows(store: LeaseStore, run_id: str, item_id: str, limit: int) -> list[dict[str, Any]]:
    """The item's attempts from the attempt log, newest first, as JSON-ready rows."""
    return [attempt.to_dict() for attempt in store.attempts(run_id, item_id, limit=limit)]
