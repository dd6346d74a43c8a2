"""A griffe extension for the API reference (docs/reference/api.md, rendered by mkdocstrings):
the docstrings' Sphinx roles become Markdown code, and defaults show their values.

The docstrings keep Sphinx's roles (``:meth:`claim_next```, ``:data:`~.limits.HEARTBEAT```);
here each becomes code with Sphinx's title (``~`` keeps the last part; a method or a
function gets ``()``), linked to the named entry when the page documents it (an
optional cross-reference: one the page lacks stays plain code, without a warning). A
default written as a constant's name (``ttl=DEFAULT_TTL``) shows the constant's value
(``ttl=60.0``), read from the imported package.

mkdocs.yml lists this file after griffe's ``dataclasses`` extension, so that the
``__init__`` griffe makes for a dataclass is there when the package is walked.
"""

from __future__ import annotations

import html
import inspect
import pkgutil
import re
from collections.abc import Iterator
from typing import Any

import griffe

#: A Sphinx role: ``:meth:`target```, ``:py:func:`~a.b```, ``:class:`title <target>```.
ROLE = re.compile(r":(?:py:)?(?P<role>[a-z]+):`(?P<body>[^`]+)`")
#: What is left of a role that was not rendered, in Markdown or in HTML text.
UNRENDERED_ROLE = re.compile(r":(?:py:)?(?:attr|meth|func|class|mod|data|exc|obj|const|ref):`?")
#: The roles naming something called: Sphinx adds ``()`` to their titles.
CALLED = frozenset(("meth", "func"))
#: The values a default may show as written: anything else keeps its expression.
PLAIN = (str, int, float, bool, type(None))


def role_title(role: str, body: str) -> tuple[str, str]:
    """The title a role shows and the name it targets, as Sphinx makes them."""
    explicit = re.fullmatch(r"(?s)(.*\S)\s*<([^<>]+)>", body)
    if explicit:
        return explicit[1], explicit[2].lstrip("~!")
    target = body.lstrip("~!")
    title = target.lstrip(".")
    if body.lstrip("!").startswith("~"):
        title = title.rsplit(".", 1)[-1]
    if role in CALLED:
        title += "()"
    return title, target


def render_roles(text: str, link: Any = None) -> str:
    """``text`` with each role as Markdown code; ``link(target)`` gives the identifier
    to link it to (None: plain code)."""

    def one(match: re.Match[str]) -> str:
        title, target = role_title(match["role"], match["body"])
        identifier = link(target) if link is not None else None
        code = f"`{title}`"
        if identifier is None:
            return code
        return (
            f'<autoref identifier="{html.escape(identifier)}" optional>'
            f"<code>{html.escape(title)}</code></autoref>"
        )

    return ROLE.sub(one, text)


def _found(collection: Any, path: str) -> Any:
    try:
        return collection.get_member(path)
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None


def resolve(obj: Any, target: str, collection: Any) -> str | None:
    """The path of what ``target`` names in ``obj``'s docstring: relative to ``obj``'s
    class and module, or (``.name``, ``..name``) to its package; None when not found."""
    dots = len(target) - len(target.lstrip("."))
    name = target[dots:]
    candidates = []
    if dots:
        module = obj.module
        base = module.path if module.is_init_module else module.parent.path
        parts = base.split(".")
        base = ".".join(parts[: len(parts) - (dots - 1)])
        candidates.append(f"{base}.{name}")
    else:
        scope = obj
        while scope is not None:
            if scope.is_class or scope.is_module:
                candidates.append(f"{scope.path}.{name}")
            scope = scope.parent
        candidates.append(name)
    for path in candidates:
        found = _found(collection, path)
        if found is not None:
            try:
                return str(found.final_target.path if found.is_alias else found.path)
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):  # not loaded
                return str(found.path)
    return None


def objects(obj: Any) -> Iterator[Any]:
    """``obj`` and every member under it, aliases left out."""
    yield obj
    for member in list(obj.members.values()):
        if not member.is_alias:
            yield from objects(member)


def _names_something(expression: Any) -> bool:
    return isinstance(expression, griffe.Expr) and any(
        isinstance(part, griffe.ExprName) for part in expression.iterate(flat=False)
    )


def shown(value: Any) -> str | None:
    """``value`` as a default shows it (strings in double quotes, tuples of plain values),
    or None when it is not plain."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, PLAIN):
        return repr(value)
    if isinstance(value, tuple) and all(isinstance(one, PLAIN) for one in value):
        items = [shown(one) for one in value]
        return "(" + ", ".join(str(item) for item in items) + ("," if len(items) == 1 else "") + ")"
    return None


def show_default_values(func: Any) -> None:
    """Replaces each default of ``func`` that names a constant by the constant's value."""
    named = [p for p in func.parameters if _names_something(p.default)]
    if not named:
        return
    try:
        real = pkgutil.resolve_name(func.path)
        if func.name == "__init__" and func.parent is not None and func.parent.is_class:
            real = pkgutil.resolve_name(func.parent.path)
        parameters = inspect.signature(real).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return
    for parameter in named:
        if parameter.name in parameters:
            value = shown(parameters[parameter.name].default)
            if value is not None:
                parameter.default = value


def show_attribute_value(attribute: Any) -> None:
    """Replaces an attribute's value that names a constant by the constant's value."""
    if not _names_something(attribute.value):
        return
    try:
        value = shown(pkgutil.resolve_name(attribute.path))
    except (ImportError, AttributeError, ValueError):
        return
    if value is not None:
        attribute.value = value


class ApiReference(griffe.Extension):
    """Roles as code or links, defaults as values: for every object of ``redis_lease``."""

    def on_package(self, *, pkg: Any, loader: Any, **_: Any) -> None:
        """Rewrites the package's docstrings and defaults once it is loaded."""
        if pkg.name != "redis_lease":
            return
        collection = loader.modules_collection
        for obj in objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = render_roles(
                    obj.docstring.value,
                    lambda target, obj=obj: resolve(obj, target, collection),
                )
            if obj.is_function:
                show_default_values(obj)
            elif obj.is_attribute:
                show_attribute_value(obj)
