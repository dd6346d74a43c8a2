"""Option and argument values of plain types read without pydantic, for a faster start.

Newer typer releases (0.2x) turn every value a command line gives (and every default)
into its parameter's type through a pydantic ``TypeAdapter``: the first value of a
command costs pydantic's import (about 100 ms, more than a view's work). Most of this
command line's values are plain: ``str``, ``bool`` (its flags), ``int`` and ``float``
(some with a ``min`` or ``max``), ``list[str]``. :func:`read_plainly` has typer give
each such parameter a reader that takes a well-formed value as it is, and hands
anything else (a malformed number, a value out of range, a file, a choice) to typer's
own reader, built only then: every error and every accepted value is typer's, only the
well-formed plain ones skip pydantic. A typer release without the hook is left as it is.
"""

from __future__ import annotations

import re
from typing import Any

_INT = re.compile(r"-?(0|[1-9][0-9]{0,17})")
_FLOAT = re.compile(r"-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,15})?")
#: Whether :func:`read_plainly` ran.
_installed = False
#: What :meth:`PlainReader.quick` returns for a value it leaves to typer.
_NOT_PLAIN = object()


class PlainReader:
    """A parameter's reader (typer's ``RuntimeParam`` protocol: ``coerce``): plain values
    read here, the rest by typer's reader (``typer._coercion.build_runtime_param``)."""

    def __init__(self, descriptor: Any) -> None:
        self.descriptor = descriptor
        self.info = descriptor.parameter_info
        self.annotation = descriptor.annotation
        self.full: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        """The parameter's value, as typer's reader returns it."""
        multiple = bool(param.multiple or param.nargs == -1)
        if value is None:
            return () if multiple else None
        quick = self.quick(value, multiple)
        if quick is not _NOT_PLAIN:
            return quick
        if self.full is None:
            from typer._coercion import build_runtime_param

            self.full = build_runtime_param(self.descriptor)
        return self.full.coerce(value, param=param, ctx=ctx)

    def quick(self, value: Any, multiple: bool) -> Any:
        """The value read without pydantic, or :data:`_NOT_PLAIN`."""
        if self.annotation == list[str]:
            plain = isinstance(value, (list, tuple)) and all(type(v) is str for v in value)
            return list(value) if multiple and plain else _NOT_PLAIN
        if multiple:
            return _NOT_PLAIN
        if self.annotation in (str, bool):
            return value if type(value) is self.annotation else _NOT_PLAIN
        if self.annotation is int:
            number = value if type(value) is int else _parsed(value, _INT, int)
        elif self.annotation is float:
            number = value if type(value) is float else _parsed(value, _FLOAT, float)
        else:
            return _NOT_PLAIN
        if number is _NOT_PLAIN or not self.in_range(number):
            return _NOT_PLAIN  # typer says why, or clamps it
        return number

    def in_range(self, number: Any) -> bool:
        """Whether ``number`` is within the parameter's ``min`` and ``max``."""
        low, high = self.info.min, self.info.max
        return (low is None or number >= low) and (high is None or number <= high)


def _parsed(value: Any, form: re.Pattern[str], kind: type) -> Any:
    """``kind(value)`` for text of the plain ``form``, else :data:`_NOT_PLAIN`."""
    if type(value) is not str or not form.fullmatch(value):
        return _NOT_PLAIN
    return kind(value)


def read_plainly() -> None:
    """Makes typer give every plain parameter a :class:`PlainReader` when it first reads
    one of its values (once per process; nothing with a typer release without the hook:
    ``typer.core._TyperParameter.get_runtime_param``, which builds a reader on first use)."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        from typer.core import _TyperParameter
    except ImportError:
        return
    typers = getattr(_TyperParameter, "get_runtime_param", None)
    if typers is None:
        return

    def get_runtime_param(param: Any) -> Any:
        descriptor = getattr(param, "type_descriptor", None)
        if getattr(param, "_runtime_param", False) is None and _is_plain(descriptor):
            param._runtime_param = PlainReader(descriptor)
        return typers(param)

    _TyperParameter.get_runtime_param = get_runtime_param  # type: ignore[method-assign,assignment]


def _is_plain(descriptor: Any) -> bool:
    """Whether the parameter (its typer descriptor) holds a plain ``str``, ``bool``,
    ``int``, ``float`` or ``list[str]``, read as given: no parser, file, path or choice."""
    if descriptor is None:
        return False
    try:
        special = descriptor.is_file or descriptor.is_path or descriptor.is_choice
        info = descriptor.parameter_info
        custom = getattr(info, "parser", None) is not None or getattr(info, "clamp", False)
    except AttributeError:  # a typer release this module does not know
        return False
    return not (special or custom) and descriptor.annotation in (str, bool, int, float, list[str])
