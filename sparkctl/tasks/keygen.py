"""Generating an ssh key on a node as one step that is done or not done: made under a temp name, then renamed."""

from __future__ import annotations

from sparkctl.transport.base import q


def keygen_line(key: str, comment: str) -> str:
    """A shell line that leaves `key` and `key`.pub whole or as they were (never a truncated key: a full disk or
    a cut connection during ssh-keygen leaves only a temp name, removed on the way out).

    `key` is a shell word, already quoted (it may hold "$HOME"). The public half lands first: a check that wants
    both sees a key without its private half as missing and makes it again.
    """
    return (f"(k={key}; t=$(mktemp -u \"$k.sparkctl-XXXXXX\") && trap 'rm -f \"$t\" \"$t.pub\"' EXIT && "
            f"ssh-keygen -q -t ed25519 -N '' -C {q(comment)} -f \"$t\" && "
            "mv -f \"$t.pub\" \"$k.pub\" && mv -f \"$t\" \"$k\")")
