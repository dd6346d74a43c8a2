"""The recovery paths under random interleavings (tests/recovery_model.py), at a size that
fits the suite; ``make chaos`` runs it much longer (``MODEL_EXAMPLES``, ``MODEL_STEPS``)."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from redis_lease.fleet.loss.tick_memory import MARK_FILE_ENV
from tests.recovery_model import TALLY, RecoveryModel
from tests.test_run_accounting import Configure
from tests.test_run_accounting import nightly as nightly  # the fixture

#: Examples and steps per example (the suite's size; ``make chaos`` sets more).
EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "25"))
STEPS = int(os.environ.get("MODEL_STEPS", "50"))
#: Report the first failing case as found, not shrunk (a long run's first find).
NO_SHRINK = os.environ.get("MODEL_NO_SHRINK", "") == "1"


def model(
    redis_url: str,
    prefix: str,
    nightly: Configure,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    effects: str,
) -> type[RecoveryModel]:
    """The model's class for this test: the nightly job as the model runs it, the process's
    memory file in ``tmp_path``, its Redis, prefix and handler."""
    nightly(
        schedule="0 2 * * *",
        deadline_after=timedelta(hours=6),
        catch_up="all",
        catch_up_days=3,
        retention_days=1,
    )
    monkeypatch.setenv(MARK_FILE_ENV, str(tmp_path / "marks.json"))

    class Model(RecoveryModel):
        pass

    Model.redis_url, Model.base_prefix, Model.effects = redis_url, prefix, effects
    TALLY.clear()
    return Model


@pytest.mark.parametrize("effects", ["lookup", "nothing"])
def test_the_recovery_paths_keep_the_promise_whatever_the_order(
    redis_url: str,
    prefix: str,
    nightly: Configure,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    effects: str,
) -> None:
    """Ticks by three would-be leaders at advancing dates, leadership changes, workers that
    die or pause, keys deleted, the data set flushed, retention's end and failed Redis calls,
    in any order: no effect applied twice at a provider that does not dedupe, no ended run
    made again, every run lost while open made again or named, no dishonest success."""
    Model = model(redis_url, prefix, nightly, tmp_path, monkeypatch, effects)
    run_state_machine_as_test(
        Model,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            # no explain phase: its tracing makes every step many times slower
            phases=[Phase.explicit, Phase.generate] + ([] if NO_SHRINK else [Phase.shrink]),
        ),
    )
    if os.environ.get("MODEL_STATS"):
        print(f"\nmodel ({effects}):", ", ".join(f"{k} {v}" for k, v in sorted(TALLY.items())))


def test_a_run_a_leader_doubts_after_retaking_its_own_lease_is_named_after_a_wipe(
    redis_url: str,
    prefix: str,
    nightly: Configure,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by a long run (seed 7): the leader makes a run, takes its own lease again after
    a break (its memory now in doubt), no tick for longer than the job's retention (1 day,
    counted from the run's making on the server's clock, which the model's clock is well
    ahead of), the data set is wiped. The run, open when lost, was skipped as "made before
    the retention" and so neither made again nor named; a doubtful run is now named when
    made within a year."""
    state = model(redis_url, prefix, nightly, tmp_path, monkeypatch, "lookup")()
    state.first_leader()
    state.leadership_changes(side=0)
    state.tick(hours=22, side=1)
    state.loss(data=None, kind="whole data set")
    state.teardown()
