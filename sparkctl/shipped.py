"""Where the files sparkctl ships beside its code live (templates/: node scripts, configs), in a wheel and in a
source checkout alike. Imports nothing of sparkctl: what runs before the planners are loaded (the cluster lock,
taken while the nodes are still being connected) reads its files here."""

from __future__ import annotations

from functools import cache
from pathlib import Path


def templates_dir() -> Path:
    # A wheel carries them inside the package (force-include); an editable install
    # imports the package from the checkout, where they sit at the top level.
    package = Path(__file__).resolve().parent
    inside = package / "templates"
    if inside.is_dir():
        return inside
    return package.parent / "templates"


@cache
def shipped_text(name: str) -> str:
    """A shipped file's text, as it is (no rendering)."""
    return (templates_dir() / name).read_text()


def without_comments(script: str) -> str:
    """A shipped script's lines but its comments (the shebang too), for a script embedded in another or sent as
    one command line (sudo logs the whole line: past about 960 bytes, in two auth-log lines)."""
    return "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
