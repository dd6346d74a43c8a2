"""A module of another package whose body runs when it is first used, not when imported.

``import redis`` imports redis-py's asyncio client too (``redis/__init__.py`` begins
with ``from redis import asyncio``): about 20 ms of every command line's start, for a
client no command uses. :func:`defer` puts ``redis.asyncio`` in ``sys.modules`` as an
empty module that runs its own file the first time one of its names is asked for
(``redis.asyncio.Redis``, ``from redis.asyncio import Redis``, a star import); its
submodules import as usual (``import redis.asyncio.client``), without running it. The
command line defers it for the commands that run no code but this package's
(:data:`.app.QUICK_COMMANDS`), before redis-py is imported.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

#: The module deferred by the command line.
REDIS_ASYNCIO = "redis.asyncio"

_LOCK = threading.RLock()


class DeferredModule(ModuleType):
    """A module whose file runs on the first use of one of its names."""

    def __getattr__(self, name: str) -> Any:
        if _is_submodule(self, name):  # ``from package import submodule``: not the body's
            raise AttributeError(name)  # the import system imports the submodule then
        with _LOCK:
            if type(self) is DeferredModule:  # not run yet (another thread may have)
                self.__class__ = ModuleType  # type: ignore[assignment]
                loader = self.__spec__.loader if self.__spec__ else None
                if loader is None:  # pragma: no cover - a spec from a path finder has one
                    raise AttributeError(name)
                loader.exec_module(self)
        return getattr(self, name)


def _is_submodule(module: ModuleType, name: str) -> bool:
    """Whether ``name`` is a submodule of the package ``module`` (a file in its folder)."""
    path = getattr(module, "__path__", None)
    if path is None or name.startswith("__"):
        return False
    return importlib.machinery.PathFinder.find_spec(f"{module.__name__}.{name}", path) is not None


def defer(name: str) -> bool:
    """Puts the submodule ``name`` (``package.module``) in ``sys.modules`` deferred, unless
    it or its package is imported already or cannot be found; whether it did."""
    package, _, _ = name.rpartition(".")
    if name in sys.modules or package in sys.modules:
        return False
    parent = importlib.util.find_spec(package)  # a top-level package: found, not imported
    where = parent.submodule_search_locations if parent else None
    spec = importlib.machinery.PathFinder.find_spec(name, where) if where else None
    if spec is None or spec.loader is None:
        return False
    module = DeferredModule(name)
    module.__spec__ = spec
    module.__loader__ = spec.loader
    module.__file__ = spec.origin
    module.__package__ = name if spec.submodule_search_locations is not None else package
    if spec.submodule_search_locations is not None:
        module.__path__ = list(spec.submodule_search_locations)
    sys.modules[name] = module
    return True
