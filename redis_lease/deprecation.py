"""Old public names kept for one release: each use warns with a DeprecationWarning
that names the new one, and then does what the new name does. Old module paths too:
the modules that moved into layer folders (0.10.0) import under their old names, and
those that names stored outside the code still use (:data:`KEPT_MODULES`) import without
a warning."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Mapping, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

#: Old module path -> where the module is now; each import of an old path warns.
MOVED_MODULES = {
    "redis_lease.adding": "redis_lease.protocol.store.add",
    "redis_lease.age_history": "redis_lease.fleet.run_ages",
    "redis_lease.attempt_log": "redis_lease.protocol.store.attempt_log",
    "redis_lease.backfill": "redis_lease.fleet.tick.backfill",
    "redis_lease.backoff": "redis_lease.fleet.shard_job_failures",
    "redis_lease.bad_jobs": "redis_lease.fleet.worker.bad_jobs",
    "redis_lease.cluster": "redis_lease.protocol.connection.cluster",
    "redis_lease.connection": "redis_lease.protocol.connection.clients",
    "redis_lease.dashboard": "redis_lease.operate.dashboard",
    "redis_lease.dashboard.app": "redis_lease.operate.dashboard.app",
    "redis_lease.dashboard.charts": "redis_lease.operate.dashboard.charts",
    "redis_lease.dashboard.ids": "redis_lease.operate.dashboard.ids",
    "redis_lease.dashboard.pages": "redis_lease.operate.dashboard.pages",
    "redis_lease.dashboard.rq_actions": "redis_lease.operate.dashboard.rq_actions",
    "redis_lease.dashboard.rq_data": "redis_lease.operate.dashboard.rq_data",
    "redis_lease.dashboard.rq_jobs": "redis_lease.operate.dashboard.rq_jobs",
    "redis_lease.dashboard.rq_source": "redis_lease.operate.dashboard.rq_source",
    "redis_lease.dashboard.rq_views": "redis_lease.operate.dashboard.rq_views",
    "redis_lease.dashboard.rq_workers": "redis_lease.operate.dashboard.rq_workers",
    "redis_lease.dashboard.security": "redis_lease.operate.dashboard.security",
    "redis_lease.dashboard.server": "redis_lease.operate.dashboard.server",
    "redis_lease.dashboard.unreadable": "redis_lease.operate.dashboard.unreadable",
    "redis_lease.data_set": "redis_lease.fleet.data_set",
    "redis_lease.due_runs": "redis_lease.fleet.tick.due_runs",
    "redis_lease.failures": "redis_lease.protocol.connection.translate",
    "redis_lease.gate": "redis_lease.fleet.gate",
    "redis_lease.guards": "redis_lease.protocol.guards",
    "redis_lease.job_failures": "redis_lease.fleet.shard_job_failures",
    "redis_lease.job_store": "redis_lease.fleet.shard_jobs",
    "redis_lease.job_tallies": "redis_lease.fleet.job_tallies",
    "redis_lease.jobs": "redis_lease.fleet.job",
    "redis_lease.keys": "redis_lease.protocol.keys",
    "redis_lease.lease": "redis_lease.protocol.values",
    "redis_lease.locks": "redis_lease.protocol.store.base",
    "redis_lease.lost_records": "redis_lease.fleet.lost_records",
    "redis_lease.lost_runs": "redis_lease.fleet.tick.lost_runs",
    "redis_lease.metrics_history": "redis_lease.operate.metrics.history",
    "redis_lease.metrics_jobs": "redis_lease.operate.metrics.per_job",
    "redis_lease.missed_runs": "redis_lease.fleet.tick.missed_runs",
    "redis_lease.output": "redis_lease.operate.output",
    "redis_lease.pool": "redis_lease.fleet.worker.pool",
    "redis_lease.protocol_version": "redis_lease.protocol.store.stamp",
    "redis_lease.remembered": "redis_lease.fleet.remembered",
    "redis_lease.replies": "redis_lease.protocol.replies",
    "redis_lease.run_states": "redis_lease.fleet.run_states",
    "redis_lease.run_views": "redis_lease.operate.run_views",
    "redis_lease.runs": "redis_lease.fleet.runs",
    "redis_lease.schedule": "redis_lease.fleet.tick.schedule",
    "redis_lease.server_checks": "redis_lease.protocol.connection.server_checks",
    "redis_lease.settlement": "redis_lease.protocol.store.settle",
    "redis_lease.shard_jobs": "redis_lease.fleet.shard_jobs",
    "redis_lease.snapshots": "redis_lease.protocol.store.run_status",
    "redis_lease.store_base": "redis_lease.protocol.store.base",
    "redis_lease.store_reads": "redis_lease.protocol.store.reads",
    "redis_lease.takeover": "redis_lease.fleet.takeover",
    "redis_lease.tls": "redis_lease.protocol.connection.tls",
    "redis_lease.tracing": "redis_lease.protocol.tracing",
    "redis_lease.urls": "redis_lease.protocol.connection.urls",
    "redis_lease.validation": "redis_lease.protocol.validation",
    "redis_lease.views": "redis_lease.operate.views",
    "redis_lease.watch": "redis_lease.fleet.worker.watch",
    "redis_lease.worker_views": "redis_lease.operate.worker_views",
}
#: Old module path -> the modules its names went to, when it was split by concept: the old
#: path imports as a module that hands on the names of each (with a warning).
SPLIT_MODULES = {
    "redis_lease.capacity": ("redis_lease.fleet.capacity", "redis_lease.fleet.run_capacity"),
    "redis_lease.keeper": ("redis_lease.fleet.live_lease", "redis_lease.fleet.worker.lease_keeper"),
    "redis_lease.shard_loop": (
        "redis_lease.fleet.worker.shard_loop",
        "redis_lease.fleet.worker.settlements",
    ),
}

#: Old module path -> where its names are now, imported WITHOUT a warning: stored RQ jobs
#: name ``redis_lease.worker.process_shard``, installed schedules
#: ``redis_lease.tick.tick_entry``, command lines ``redis_lease.dispatch.JsonJob``, and the
#: README's imports the others. One part: the old path is that module under a second name;
#: more: a module that hands on the names of each (the first part's where two share one).
KEPT_MODULES: dict[str, tuple[str, ...]] = {
    "redis_lease.worker": ("redis_lease.fleet.worker.shard_job",),
    "redis_lease.tick": (
        "redis_lease.fleet.tick.scheduler_tick",
        "redis_lease.fleet.tick.open_runs",
    ),
    "redis_lease.dispatch": (
        "redis_lease.fleet.transport.shard_jobs",
        "redis_lease.fleet.worker.rq_worker",
    ),
    "redis_lease.effects": ("redis_lease.fleet.effects.ledger",),
    "redis_lease.metrics": ("redis_lease.operate.metrics.collector",),
    "redis_lease.scripts": ("redis_lease.protocol.scripts",),
    "redis_lease.store": ("redis_lease.protocol.store.lease_store",),
}

#: Old ``module.name`` -> the module that holds the name now; each use warns.
MOVED_NAMES = {
    "redis_lease.errors.SCRIPT_CODES": "redis_lease.protocol.error_replies",
    "redis_lease.errors.from_reply": "redis_lease.protocol.error_replies",
    "redis_lease.errors.iso": "redis_lease.protocol.error_replies",
}


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warns that ``old`` is deprecated in favour of ``new``, at the caller's caller."""
    warnings.warn(
        f"{old} is deprecated and goes in the next release; use {new}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def renamed_attribute(
    module: str, name: str, renamed: Mapping[str, str], namespace: Mapping[str, Any]
) -> Any:
    """For a module's ``__getattr__``: the object an old ``name`` was renamed to (with a
    warning), found in the module's ``namespace``; AttributeError for any other name."""
    new = renamed.get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warn_renamed(f"{module}.{name}", f"{module}.{new}", stacklevel=4)
    return namespace[new]


def moved_name(module: str, name: str) -> Any:
    """For a module's ``__getattr__``: a ``name`` that moved to another module
    (:data:`MOVED_NAMES`), with a warning; AttributeError for any other name."""
    new = MOVED_NAMES.get(f"{module}.{name}")
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warn_renamed(f"{module}.{name}", f"{new}.{name}", stacklevel=4)
    return getattr(importlib.import_module(new), name)


def joined_module(name: str, parts: Sequence[ModuleType]) -> ModuleType:
    """A module ``name`` that hands on every public name of ``parts`` (the first part's
    where two share one), and the old names each part still answers to."""
    joined = ModuleType(name, f"Split into {', '.join(part.__name__ for part in parts)}.")
    for part in reversed(parts):
        public = {key: value for key, value in vars(part).items() if not key.startswith("_")}
        joined.__dict__.update(public)

    def __getattr__(attr: str) -> Any:  # an old name a part renamed warns as it does there
        for part in parts:
            try:
                return getattr(part, attr)
            except AttributeError:
                continue
        raise AttributeError(f"module {name!r} has no attribute {attr!r}")

    joined.__dict__["__getattr__"] = __getattr__
    return joined


class MovedModules:
    """Imports a moved module under its old path (:data:`MOVED_MODULES`), with a warning: the
    old name is bound to the moved module itself, so it is one module under two names. A
    module split by concept (:data:`SPLIT_MODULES`) imports as one that joins its parts. A
    kept path (:data:`KEPT_MODULES`) imports the same ways, without a warning.

    A finder and loader of the import system (``importlib.abc.MetaPathFinder`` and
    ``Loader`` in all but name: that module takes a while to import, at every start)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        """A spec for an old path, else None (the usual finders go first)."""
        moved = fullname in MOVED_MODULES or fullname in SPLIT_MODULES or fullname in KEPT_MODULES
        return ModuleSpec(fullname, cast("Loader", self)) if moved else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        """The moved module (or its parts joined), after a warning that names the new paths."""
        kept = KEPT_MODULES.get(spec.name)
        if kept is not None:
            if len(kept) == 1:
                return importlib.import_module(kept[0])
            return joined_module(spec.name, [importlib.import_module(p) for p in kept])
        new = MOVED_MODULES.get(spec.name)
        if new is None:
            parts = SPLIT_MODULES[spec.name]
            warn_renamed(f"module {spec.name}", f"{' and '.join(parts)} (or redis_lease)")
            return joined_module(spec.name, [importlib.import_module(p) for p in parts])
        warn_renamed(f"module {spec.name}", f"{new} (or import its names from redis_lease)")
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the moved module ran when it was imported under its new path."""


def find_moved_modules() -> None:
    """Lets old module paths import (once per process). First among the finders: an old
    submodule path (``redis_lease.dashboard.app``) must not load the file a second time."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules())
