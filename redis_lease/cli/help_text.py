"""How ``--help`` (and the CLI reference made from it) shows the commands.

The commands are listed in groups (:data:`COMMAND_GROUPS`), each command's summary is
the first sentence of its help, whole. A value is named by a word in capitals: an
argument by its name (``RUN``, ``ITEMS...``), an option by its metavar when it has one
(``SECONDS``, ``FILE``), else by its type (``TEXT``, ``INTEGER``, ``NUMBER``); a flag
takes no value and shows none. Typer's own names (``<str>``, ``<list[str]>``,
``<bool>``, ``{run}``) are not shown.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.models import CommandFunctionType

#: The command groups of ``redis-lease --help``, in order, each with its commands in the
#: order they are listed: a run's life first, then watching it, then items by hand.
COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "Jobs and runs": (
        "worker",
        "tick",
        "start",
        "backfill",
        "schedule",
        "resume",
        "finalize",
        "cancel",
    ),
    "Watching runs": ("status", "wait", "runs", "items", "dead", "inspect", "workers"),
    "Items and leases": (
        "add",
        "claim",
        "renew",
        "commit",
        "fail",
        "release",
        "reap",
        "requeue",
        "resolve-effect",
    ),
    "Serving and planning": ("demo", "dashboard", "metrics", "plan-capacity", "protocol"),
}
#: Each command's group.
GROUP_OF = {name: group for group, names in COMMAND_GROUPS.items() for name in names}
#: Each command's place in ``--help``.
PLACE = {name: index for index, name in enumerate(GROUP_OF)}
#: The word for a value of each type, when the option names none.
TYPE_WORDS = {int: "INTEGER", float: "NUMBER", str: "TEXT"}


def summary(help_text: str | None) -> str:
    """The first sentence of ``help_text``, whole, on one line."""
    paragraph = (help_text or "").strip().split("\n\n", 1)[0]
    text = " ".join(paragraph.split())
    end = re.search(r"(?<!\be\.g)(?<!\bi\.e)[.!?](\s|$)", text)
    return text[: end.start() + 1] if end else text


class ReadableArgument(TyperArgument):
    """An argument named by its metavar alone: ``RUN``, ``[ITEM]``, ``[ITEMS]...``."""

    def display_type_rich(self, ctx: Any) -> str | None:
        """No type beside the name: the name says what to give."""
        return None

    def get_help_record(self, ctx: Any) -> tuple[str, str] | None:
        """The row of the arguments' list: the name, then the help."""
        record = super().get_help_record(ctx)
        if record is None:
            return None
        return self._rich_display_name(), record[1]

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")


def _type_word(param: Any) -> str:
    """``TEXT``, ``INTEGER`` or ``NUMBER`` for a value of ``param``'s type (of one item
    for a list)."""
    annotation = param.type_descriptor.annotation
    args = getattr(annotation, "__args__", None)
    if getattr(annotation, "__origin__", None) in (list, tuple) and args:
        annotation = args[0]
    return TYPE_WORDS.get(annotation, "VALUE")


def make_readable(param: Any) -> None:
    """Gives ``param`` the metavar ``--help`` shows (nothing for a flag)."""
    if isinstance(param, TyperOption):
        if param.is_flag:
            param.metavar = ""
        elif param.metavar is None:
            param.metavar = _type_word(param)
    elif isinstance(param, TyperArgument):
        if param.metavar is None:
            param.metavar = (param.name or "value").upper()
        param.__class__ = ReadableArgument


def readable_params(params: list[Any]) -> list[Any]:
    """``params``, each given its readable metavar (:func:`make_readable`)."""
    for param in params:
        make_readable(param)
    return params


class ReadableCommand(TyperCommand):
    """A command whose ``--help`` shows readable metavars and whose summary is whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.short_help = self.short_help or summary(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        """The parameters (``--help`` with them), each with its readable metavar."""
        return readable_params(super().get_params(ctx))


class ReadableGroup(TyperGroup):
    """A group whose ``--help`` shows readable metavars and whose summary is whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.short_help = self.short_help or summary(self.help)

    def get_params(self, ctx: Any) -> list[Any]:
        """The parameters (``--help`` with them), each with its readable metavar."""
        return readable_params(super().get_params(ctx))


class ReadableTyper(typer.Typer):
    """A typer app whose commands and groups are, unless told otherwise, readable ones."""

    def command(
        self, name: str | None = None, **kwargs: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        """``Typer.command`` with :class:`ReadableCommand` as the default class."""
        kwargs.setdefault("cls", ReadableCommand)
        return super().command(name, **kwargs)

    def add_typer(self, typer_instance: typer.Typer, **kwargs: Any) -> None:
        """``Typer.add_typer`` with :class:`ReadableGroup` as the default class."""
        kwargs.setdefault("cls", ReadableGroup)
        super().add_typer(typer_instance, **kwargs)
