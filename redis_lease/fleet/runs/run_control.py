"""Operator actions on a run, shared by the command line and the dashboard.

It checks whether a run is open, reads a new deadline from what the operator typed,
finalizes an open run now, and requeues dead items.

The run's states are :mod:`.run_states`; the changes themselves are :class:`.lifecycle.Runs`'.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from ...errors import InvalidInput, NotFound
from ...limits import DEFAULT_SWEEP
from ...protocol.store.call_checks import check_sweep
from ...protocol.store.lease_store import LeaseStore
from ..jobs.job import parse_duration
from .lifecycle import Decision, Runs
from .run_states import OPEN_STATES, RESUMABLE_STATES

#: A deadline given as a duration from now (``90s``, ``30m``, ``2h``, ``1.5d``).
_DURATION = re.compile(r"\d+(\.\d+)?[smhd]")


def is_open(info: Mapping[str, str]) -> bool:
    """Whether the run whose record is ``info`` is still being worked (planning, running)."""
    return info.get("state") in OPEN_STATES


def new_deadline(when: str | timedelta, now: datetime) -> datetime:
    """A run's new deadline (``redis-lease resume --deadline``, the dashboard's resume form):
    ``when`` from ``now`` when it is a duration (``2h``, or a timedelta), else an ISO 8601
    time with its timezone, after ``now``.

    Raises:
        InvalidInput: the text is neither, has no timezone, is in the past, or is too far
            ahead.
    """
    if isinstance(when, timedelta) or _DURATION.fullmatch(when):
        try:
            return now + (when if isinstance(when, timedelta) else parse_duration(when))
        except OverflowError:
            raise InvalidInput(f"deadline {when!r} is too far ahead") from None
    try:
        moment = datetime.fromisoformat(when)
    except ValueError:
        raise InvalidInput(
            f"invalid deadline {when!r}: use ISO 8601 or a duration like 2h"
        ) from None
    if moment.tzinfo is None:
        raise InvalidInput(f"deadline {when!r} needs a timezone, e.g. {when}+00:00")
    if moment <= now:
        raise InvalidInput(f"deadline {when!r} is in the past")
    return moment


def finalize_if_open(runs: Runs, run_id: str, trigger: str) -> tuple[str, Decision | None]:
    """Closes the run now as succeeded, partial or failed (:meth:`.lifecycle.Runs.finalize`) when
    it is open; a run already final is left alone. Returns its state after, and the decision
    (None when nothing changed).

    Raises:
        NotFound: the run does not exist.
    """
    decision = runs.finalize(run_id, trigger) if is_open(runs.info(run_id)) else None
    return runs.info(run_id)["state"], decision


def requeue_items(
    store: LeaseStore, run_id: str, item_ids: Sequence[str] = (), limit: int = DEFAULT_SWEEP
) -> int:
    """Moves dead items (those named, or up to ``limit`` per shard) back to pending, with
    fresh attempts; returns how many. A named item that is not dead is left as it is.

    Raises:
        NotFound: no such run, or a named item is not in it (then nothing is requeued: the
            list has a typo, or names another run's items).
    """
    check_sweep(run_id, limit, item_ids)
    unknown = store.unknown_items(run_id, item_ids) if item_ids else []
    if unknown:
        shown = ", ".join(repr(item) for item in unknown[:5])
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise NotFound(
            f"item(s) {shown}{more} not found in run {run_id!r}; nothing requeued",
            run_id=run_id,
            item_id=unknown[0],
        )
    return store.requeue(run_id, item_ids, limit=limit)


def resume_needed(store: LeaseStore, run_id: str) -> str | None:
    """The run's state when it is final but resumable (partial, failed): its requeued items
    are not claimed until an operator resumes it. None for an open run or one with no record.
    """
    try:
        state = Runs(store).info(run_id).get("state", "")
    except NotFound:  # a run made by ``add`` or LeaseStore alone: claimable as it is
        return None
    return state if state in RESUMABLE_STATES else None


__all__ = ["finalize_if_open", "is_open", "new_deadline", "requeue_items", "resume_needed"]
