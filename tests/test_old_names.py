"""Names stored outside the code keep resolving after the modules moved into layer folders.

Enqueued shard jobs store ``redis_lease.worker.process_shard``; installed schedules store
``redis_lease.tick.tick_entry``; command lines name ``redis_lease.dispatch.JsonJob``;
logging configurations name the ``redis_lease.worker`` logger; the README's imports name
``redis_lease.effects``, ``.dispatch``, ``.metrics``, ``.scripts``, ``.limits``, ``.errors``
and ``.store``. A shard job and a tick entry, stored by those names, run on a worker of
this layout (in this process, as RQ runs them: by importing the stored name).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import warnings
from datetime import date
from pathlib import Path

import pytest
from rq.utils import import_attribute

from redis_lease import LeaseStore
from redis_lease.deprecation import KEPT_MODULES, MOVED_MODULES, SPLIT_MODULES
from redis_lease.fleet import shard_jobs
from redis_lease.fleet.runs import Runs
from redis_lease.fleet.tick import schedule, scheduler_tick
from redis_lease.fleet.worker import rq_worker, settlements, shard_job
from tests import fleet_jobs
from tests.fleet_helpers import FLEET_PATH, assert_json_job, fleet_env, purge_queue
from tests.rq_helpers import burst

PACKAGE = Path(__file__).resolve().parent.parent / "redis_lease"
#: Old module paths that moved and import with a warning (a module, a package's module).
OLD_PATHS = ["redis_lease.pool", "redis_lease.jobs", "redis_lease.dashboard.app"]
#: Where each old module's names live now (a module split by concept: each of its parts).
MOVED = {
    "redis_lease.worker": "redis_lease.fleet.worker.shard_job",
    "redis_lease.tick": (
        "redis_lease.fleet.tick.scheduler_tick",
        "redis_lease.fleet.tick.open_runs",
    ),
    "redis_lease.effects": "redis_lease.fleet.effects",
    "redis_lease.metrics": "redis_lease.operate.metrics.collector",
    "redis_lease.scripts": "redis_lease.protocol.scripts",
    "redis_lease.store": "redis_lease.protocol.store.lease_store",
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_hands_on_every_public_name_of_the_new_one(old: str) -> None:
    before = importlib.import_module(old)
    moved = MOVED[old]
    for new in (moved,) if isinstance(moved, str) else moved:
        now = importlib.import_module(new)
        public = [name for name in vars(now) if not name.startswith("_")]
        defined = [n for n in public if getattr(getattr(now, n), "__module__", "") == new]
        assert defined, f"{new} defines nothing public?"
        for name in defined:
            assert getattr(before, name) is getattr(now, name), f"{old}.{name}"


def test_the_readme_imports_and_the_stored_names_resolve() -> None:
    assert import_attribute("redis_lease.worker.process_shard") is shard_job.process_shard
    assert import_attribute("redis_lease.tick.tick_entry") is scheduler_tick.tick_entry
    assert import_attribute("redis_lease.dispatch.JsonJob") is shard_jobs.JsonJob
    assert import_attribute("redis_lease.dispatch.LeaseWorker") is rq_worker.LeaseWorker
    assert import_attribute("redis_lease.dispatch.json_cron_jobs") is shard_jobs.json_cron_jobs
    not_sent = import_attribute("redis_lease.effects.not_sent")
    assert not_sent.__module__ == "redis_lease.fleet.effects"
    assert import_attribute("redis_lease.limits.DEFAULT_TTL") > 0
    assert import_attribute("redis_lease.errors.NotFound").exit_code > 0
    # what this layout stores is still the old names, which every release reads
    assert shard_jobs.SHARD_FUNC == "redis_lease.worker.process_shard"
    assert schedule.TICK_FUNC == "redis_lease.tick.tick_entry"


def test_the_worker_logger_keeps_its_name() -> None:
    worker_logger = logging.getLogger("redis_lease.worker")
    assert shard_job.log is worker_logger
    assert shard_jobs.log is worker_logger


def test_a_shard_job_and_a_tick_entry_stored_by_old_names_run_on_this_layout(
    real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue_name = f"{real_store.prefix}-q"
    for name, value in fleet_env(queue_name, items=8, shards=2, ttl=5).items():
        monkeypatch.setenv(name, value)
    job = importlib.reload(fleet_jobs).fleet
    queue = shard_jobs.queue(real_store.client, queue_name)
    try:
        # the tick entry, as an installed schedule stores it: run by its stored name
        entry = queue.enqueue("redis_lease.tick.tick_entry", [FLEET_PATH], real_store.prefix)
        burst(real_store.client, queue_name, f"{real_store.prefix}-w1")
        assert entry.get_status(refresh=True) == "finished", entry.latest_result()
        # a run, and one shard job stored as redis_lease.worker.process_shard
        runs = Runs(real_store)
        run_id, _ = runs.ensure(job, date(2031, 7, 2), runs.server_now())
        runs.plan(job, run_id)
        rq_id = shard_jobs.enqueue_shard(real_store, FLEET_PATH, queue_name, run_id, 0, 30)
        assert assert_json_job(real_store.client, rq_id)[0] == "redis_lease.worker.process_shard"
        shard_jobs.enqueue_shard(real_store, FLEET_PATH, queue_name, run_id, 1, 30)
        burst(real_store.client, queue_name, f"{real_store.prefix}-w2")
        assert real_store.status(run_id).counts["done"] == 8
    finally:
        purge_queue(real_store.client, queue_name)


@pytest.mark.parametrize(
    "old", ["redis_lease.pool", "redis_lease.jobs", "redis_lease.dashboard.app"]
)
def test_an_old_module_path_imports_the_moved_module_with_a_warning(old: str) -> None:
    new = MOVED_MODULES[old]
    for name in [old, *(n for n in sys.modules if n.startswith(old + "."))]:
        sys.modules.pop(name, None)  # imported already by an earlier test: import it again
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exec(compile(f"import {old}", __file__, "exec"), {})  # an import statement of a user's
    [warned] = [w for w in seen if f"module {old} is deprecated" in str(w.message)]
    assert warned.category is DeprecationWarning and f"use {new}" in str(warned.message)
    moved = sys.modules[old]
    assert moved is importlib.import_module(new), "one module under two names"
    assert warned.filename == __file__, "the warning points at the import"


def test_every_old_module_path_leads_to_a_module_that_exists() -> None:
    for old, new in [
        *MOVED_MODULES.items(),
        *((o, n) for o, p in SPLIT_MODULES.items() for n in p),
    ]:
        assert importlib.util.find_spec(new) is not None, f"{old} -> {new}"
        assert old not in KEPT_MODULES, f"{old}: kept (no warning) or moved (a warning)"
        assert old not in MOVED_MODULES or old not in SPLIT_MODULES, f"{old}: moved or split"
    for old, parts in KEPT_MODULES.items():
        assert all(importlib.util.find_spec(new) is not None for new in parts), old
        assert not (PACKAGE / f"{old.rpartition('.')[2]}.py").exists(), f"{old}: served, no file"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_kept_module_path_imports_without_a_warning(old: str) -> None:
    sys.modules.pop(old, None)  # imported already by an earlier test: import it again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(compile(f"import {old}", __file__, "exec"), {})  # an import statement of a user's
    assert old in sys.modules


@pytest.mark.parametrize("old", sorted(SPLIT_MODULES))
def test_a_split_module_path_hands_on_the_names_of_each_part_with_a_warning(old: str) -> None:
    sys.modules.pop(old, None)  # imported already by an earlier test: import it again
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exec(compile(f"import {old}", __file__, "exec"), {})  # an import statement of a user's
    [warned] = [w for w in seen if f"module {old} is deprecated" in str(w.message)]
    assert warned.category is DeprecationWarning and warned.filename == __file__
    joined = sys.modules[old]
    for new in SPLIT_MODULES[old]:
        assert new in str(warned.message)
        part = importlib.import_module(new)
        defined = [n for n, v in vars(part).items() if getattr(v, "__module__", "") == new]
        assert defined, f"{new} defines nothing?"
        for name in defined:
            if not name.startswith("_"):
                assert getattr(joined, name) is getattr(part, name), f"{old}.{name}"
    with pytest.raises(AttributeError):
        joined.no_such_name  # noqa: B018


def test_a_split_module_path_answers_to_an_old_name_one_of_its_parts_renamed() -> None:
    sys.modules.pop("redis_lease.shard_loop", None)
    with pytest.warns(DeprecationWarning, match="module redis_lease.shard_loop is deprecated"):
        old = importlib.import_module("redis_lease.shard_loop")
    with pytest.warns(DeprecationWarning, match="Outcome is deprecated.*HandlerResult"):
        assert old.Outcome is settlements.HandlerResult
