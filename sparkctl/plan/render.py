"""The shipped templates rendered (sparkctl/shipped.py says where they live), and the guard every value rendered
into a shell script, an sshd/ssh config or a netplan file passes (`| word`)."""

from __future__ import annotations

import ipaddress
import re
import shlex
from functools import lru_cache
from typing import TYPE_CHECKING

from sparkctl.shipped import templates_dir

if TYPE_CHECKING:
    import jinja2

#: What a value rendered into a shell line, an sshd/ssh config line or a YAML scalar may hold: names, numbers,
#: addresses (v4, v6, /prefix), paths. No whitespace, quote, `$`, backtick, `;`, `#`, newline or NUL.
_WORD = re.compile(r"[A-Za-z0-9_.,:/@%+=~-]+\Z")


class UnsafeValue(ValueError):
    """A value a template would render that could change what the rendered file says (validation bypassed)."""


def word(value: object) -> str:
    """Defence in depth behind the inventory's grammar: a value that could not come from a valid inventory is
    refused here, never rendered."""
    text = str(value)
    if not _WORD.match(text) or text.startswith("-"):
        # the value is not repeated: it may be a secret pasted in the wrong place
        raise UnsafeValue("refusing to render a value that is not a plain word (letters, digits, ._,:/@%+=~-) "
                          "into a node file")
    return text


def option(value: object) -> str:
    """A word of a command's options as sparkctl builds them (`-p`, `BatchMode=yes`, `~/.ssh/<key>`: ssh expands the
    tilde of -i itself): a plain word that may start with `-`, never a value from the inventory as it was written."""
    text = str(value)
    if not _WORD.match(text):
        raise UnsafeValue("refusing to render an option that is not a plain word into a node file")
    return text


def unit_word(value: object) -> str:
    """A word in a systemd unit file, where `%` starts a specifier (systemd.unit(5), "Specifiers")."""
    return word(value).replace("%", "%%")


# Line breaks as bash, sshd and YAML (libyaml: NEL, LS, PS too) read them, and the other control characters.
_BREAK = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")


def one_line(value: object) -> str:
    """For a value in a comment (`# ... {{ x | one_line }}`): there only a line break could start a line of its own."""
    text = str(value)
    if _BREAK.search(text):
        raise UnsafeValue("refusing to render a value with a line break or control character into a node file")
    return text


def quoted(value: object) -> str:
    """Any one-line text as one shell word (single-quoted where it needs to be): a pattern, a command line."""
    return shlex.quote(one_line(value))


def quoted_script(value: object) -> str:
    """A script's whole text, lines and all, as one shell word (for `sh -c`): only what sparkctl ships."""
    return shlex.quote(str(value))


#: RFC 6750's b64token: what a Bearer credential may hold, and so all a rendered key may hold
BEARER_RE = re.compile(r"[A-Za-z0-9._~+/-]{16,512}=*\Z")


def bearer(value: object) -> str:
    """An API key inside a double-quoted config string: token characters only (no quote, `$`, `\\`, space)."""
    text = str(value)
    if not BEARER_RE.match(text):
        raise UnsafeValue("refusing to render an API key that is not a bearer token into a node file")
    return text


def listen_address(value: object) -> str:
    """An address NGINX listens on: IPv4 as it is, IPv6 in brackets."""
    address = ipaddress.ip_address(str(value))
    return f"[{address}]" if address.version == 6 else str(address)


@lru_cache(maxsize=1)
def template_env() -> jinja2.Environment:
    """The shipped templates' environment. Jinja is loaded here, where a template is first rendered: not before the
    run's first task (the run loads it while the nodes read their facts: runs/preload.py)."""
    import jinja2

    from sparkctl.plan.compiled_templates import compiled_templates

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.bytecode_cache = compiled_templates(env)
    env.filters["word"] = word
    env.filters["unit_word"] = unit_word
    env.filters["option"] = option
    env.filters["one_line"] = one_line
    env.filters["quoted"] = quoted
    env.filters["quoted_script"] = quoted_script
    env.filters["bearer"] = bearer
    env.filters["listen_address"] = listen_address
    return env


def render(name: str, **context) -> str:
    return template_env().get_template(name).render(**context)
