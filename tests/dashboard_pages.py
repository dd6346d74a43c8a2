"""Reading the dashboard's pages in tests: a small HTML tree (stdlib's parser) looked up
by the ids and ``data-*`` attributes of the dashboard's contract, and a GET that checks the
status and parses the page."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from flask.testing import FlaskClient

VOID = {"input", "meta", "br", "link", "img", "hr", "rect", "polyline", "circle", "line"}


@dataclass
class Node:
    """An element of a parsed page: tag, attributes, children, text."""

    tag: str
    attrs: dict[str, str]
    children: list[Node] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)

    def walk(self) -> Iterator[Node]:
        """This node and every node under it, in document order."""
        yield self
        for child in self.children:
            yield from child.walk()

    def all(self, tag: str | None = None, **attrs: str) -> list[Node]:
        """The nodes under this one with ``tag`` and these attribute values (``_`` for ``-``)."""
        wanted = {name.replace("_", "-"): value for name, value in attrs.items()}
        return [
            node
            for node in self.walk()
            if (tag is None or node.tag == tag)
            and all(node.attrs.get(name) == value for name, value in wanted.items())
        ]

    def one(self, tag: str | None = None, **attrs: str) -> Node:
        """The single node with ``tag`` and these attributes."""
        found = self.all(tag, **attrs)
        assert len(found) == 1, f"{len(found)} <{tag} {attrs}> found"
        return found[0]

    def has(self, tag: str | None = None, **attrs: str) -> bool:
        """Whether a node with ``tag`` and these attributes is under this one."""
        return bool(self.all(tag, **attrs))

    @property
    def text(self) -> str:
        """The text of this node and its children, whitespace collapsed."""
        pieces = [*self.parts, *(child.text for child in self.children)]
        return " ".join(" ".join(pieces).split())

    def field(self, name: str) -> str:
        """The text of the ``data-field=name`` node under this one."""
        return self.one(data_field=name).text


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {name: value or "" for name, value in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {name: value or "" for name, value in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].parts.append(data)


def parse(html: bytes | str) -> Node:
    """The page as a tree of :class:`Node`."""
    builder = _TreeBuilder()
    builder.feed(html.decode() if isinstance(html, bytes) else html)
    builder.close()
    return builder.root


def page(client: FlaskClient, url: str, status: int = 200, **options: Any) -> Node:
    """GETs ``url``, checks the status, returns the parsed page."""
    response = client.get(url, **options)
    assert response.status_code == status, response.get_data(as_text=True)[-2000:]
    return parse(response.data)


def link(node: Node, text: str) -> str:
    """The href of the link whose text is ``text``."""
    (found,) = [a for a in node.all("a") if a.text == text]
    return found.attrs["href"]


def rows_with(node: Node, attribute: str) -> list[Node]:
    """The table rows under ``node`` that carry ``attribute``."""
    return [row for row in node.all("tr") if attribute in row.attrs]


def csrf_of(node: Node) -> str:
    """The CSRF token of the first form on the page."""
    return node.all("input", name="csrf_token")[0].attrs["value"]
