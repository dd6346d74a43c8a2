"""Points a snippet's Redis connections at the test's Redis and key prefix.

The snippet runner puts this directory on ``PYTHONPATH``, so every Python process a page
starts (its python blocks, ``redis-lease`` commands, workers) imports it. A page writes
``redis://localhost:6379/0`` as a reader would; here any ``redis://`` URL on
localhost:6379 becomes ``REDIS_LEASE_URL``, and a store made with the default key
prefix gets ``REDIS_LEASE_PREFIX``, as the command line does. Nothing is imported
before the program imports redis or redis_lease itself.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

TARGET_URL = os.environ.get("REDIS_LEASE_URL", "")
TARGET_PREFIX = os.environ.get("REDIS_LEASE_PREFIX", "")
READER_HOSTS = {"localhost", "127.0.0.1", "::1"}


def reader_url(url: Any) -> bool:
    """Whether ``url`` is the reader's local Redis (``redis://localhost:6379/...``)."""
    if not isinstance(url, str) or not url.startswith("redis://") or url == TARGET_URL:
        return False
    parts = urlsplit(url)
    return parts.hostname in READER_HOSTS and (parts.port or 6379) == 6379


def patch_redis(module: ModuleType) -> None:
    """``ConnectionPool.from_url`` (under every redis-py client) takes the test's URL."""
    pool = module.ConnectionPool
    original = pool.from_url.__func__

    def from_url(cls: type, /, url: str, **kwargs: Any) -> Any:
        return original(cls, TARGET_URL if reader_url(url) else url, **kwargs)

    pool.from_url = classmethod(from_url)


def patch_store(module: ModuleType) -> None:
    """A store made with the default key prefix gets the test's prefix."""
    base = module.StoreBase
    original = base.__init__
    default = module.DEFAULT_PREFIX

    def __init__(self: Any, client: Any, prefix: str = default, *args: Any, **kwargs: Any) -> None:
        original(self, client, TARGET_PREFIX if prefix == default else prefix, *args, **kwargs)

    base.__init__ = __init__


PATCHES = {"redis.connection": patch_redis, "redis_lease.protocol.store.store_client": patch_store}


class PatchingFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of a patched module to patch it once loaded."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            PATCHES[name](module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


if TARGET_URL and TARGET_PREFIX:
    sys.meta_path.insert(0, PatchingFinder())
