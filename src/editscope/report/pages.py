"""The Jinja2 environment of the HTML pages (the report and the edit cards): templates under ``templates/``,
shipped as package data, rendered with autoescape on, so every value a page shows is escaped by the template
engine and no code escapes by hand."""

from __future__ import annotations

import base64
from functools import cache
from typing import Any

import jinja2


@cache
def environment() -> jinja2.Environment:
    """The environment: autoescape, a missing variable is an error, block tags leave no blank lines."""
    return jinja2.Environment(loader=jinja2.PackageLoader("editscope.report", "templates"), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=True)


def render(name: str, **view: Any) -> str:
    """The template ``name`` rendered with ``view``."""
    return environment().get_template(name).render(**view)


def png_src(png: bytes) -> str:
    """A PNG as a ``data:`` URI (pages are self-contained)."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
