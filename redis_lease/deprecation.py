"""Old public names kept for one release: each use warns with a DeprecationWarning
that names the new one, and then does what the new name does."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any


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
