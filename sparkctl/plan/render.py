"""Where the shipped templates live, in a wheel and in a source checkout alike."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import jinja2


def templates_dir() -> Path:
    # A wheel carries them inside the package (force-include); an editable install
    # imports the package from the checkout, where they sit at the top level.
    package = Path(__file__).resolve().parent.parent
    inside = package / "templates"
    if inside.is_dir():
        return inside
    return package.parent / "templates"


@lru_cache(maxsize=1)
def template_env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(name: str, **context) -> str:
    return template_env().get_template(name).render(**context)
