"""A griffe extension for the API reference: Sphinx roles in our docstrings become plain code.

The docstrings are written for reading in the source and in ``help()``, in
Sphinx's field-list style (``:param x:``, which mkdocstrings parses) with
cross-reference roles (``:class:`~loader.checkpoint.Source```), which it does
not: rendered as they are, they show up as literal ``:class:`` text. This turns
each role into the code span Sphinx would display (``~`` keeps the last
component, ``title <target>`` keeps the title). Registered in ``mkdocs.yml``
(``extensions:`` of the python handler).
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|data|attr|mod|exc|obj|const|term):`(?P<text>[^`]+)`")


def _display(match: re.Match[str]) -> str:
    text = match.group("text").strip()
    titled = re.fullmatch(r"(?P<title>.+?)\s*<[^>]+>", text)
    if titled:
        return f"`{titled.group('title')}`"
    if text.startswith("~"):
        text = text[1:].rsplit(".", 1)[-1]
    return f"`{text}`"


def plain_roles(text: str) -> str:
    """``text`` with every Sphinx cross-reference role replaced by the code span it displays."""
    return ROLE.sub(_display, text)


class SphinxRoles(Extension):
    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(obj.docstring.value)

    def on_package(self, *, pkg: Object, **kwargs: Any) -> None:
        self.on_object(obj=pkg)  # the package's own docstring is not among the objects on_object sees
