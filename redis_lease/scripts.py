"""Kept where it was, because users' code imports it: the code lives in
:mod:`redis_lease.protocol.scripts`, whose public names this module hands on."""

from .protocol.scripts import (
    KEY_COUNTS,
    NOSCRIPT_RETRIES,
    Call,
    Command,
    Observer,
    Scripts,
    lua_dir,
    observe,
    source,
)

__all__ = [
    "KEY_COUNTS",
    "NOSCRIPT_RETRIES",
    "Call",
    "Command",
    "Observer",
    "Scripts",
    "lua_dir",
    "observe",
    "source",
]
