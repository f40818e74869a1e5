"""PURE: which sshd settings keep the cluster's key logins out, and which line of sshd's configuration set one.

The keywords and their meaning are OpenSSH's (sshd_config(5)); `sshd -T` prints the effective value of each as a
lower-case keyword and its value, once Match blocks are applied for the connection `-C` describes.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

#: The settings that can keep a key login out (or, MaxStartups, drop the mesh's connections).
SSHD_KEYS = ("PubkeyAuthentication", "AuthorizedKeysFile", "AllowUsers", "DenyUsers", "AllowGroups", "DenyGroups",
             "MaxStartups", "AuthenticationMethods")
#: OpenSSH's MaxStartups default start (sshd_config(5)): unauthenticated connections beyond it are dropped at random.
MAXSTARTUPS_DEFAULT = 10


def keyword(word: str) -> str:
    """A keyword as sshd_config(5) spells it (sshd reads them case-insensitively)."""
    return next((k for k in SSHD_KEYS if k.lower() == word.lower()), word)


def _matches(patterns: str, names: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern.split("@", 1)[0]) for pattern in patterns.split()
               for name in names)


#: keywords `sshd -T` prints once per entry (one line each): their values are one list
LISTS = ("allowusers", "denyusers", "allowgroups", "denygroups")


def effective_settings(lines: list[tuple[str, str]]) -> dict[str, str]:
    """`sshd -T` lines (lower-case keyword, value) as keyword -> value, the list keywords' entries joined."""
    out: dict[str, str] = {}
    for key, value in lines:
        key = key.lower()
        out[key] = f"{out[key]} {value}" if key in LISTS and key in out else value
    return out


def sshd_problem(key: str, value: str, user: str, groups: list[str], nodes: int) -> str | None:
    """Why this setting keeps the cluster's key logins out, or None."""
    low = value.strip().lower()
    if key == "PubkeyAuthentication" and low == "no":
        return "public-key login is off: the mesh logs in with keys only"
    if key == "AuthenticationMethods" and low != "any" and "publickey" not in low.split():
        # each space-separated list is one way in; a key-only login meets only a list that is just `publickey`
        return f"AuthenticationMethods {value} leaves no login by a key alone"
    if key == "AllowUsers" and not _matches(value, [user]):
        return f"{user} is not among AllowUsers {value}"
    if key == "DenyUsers" and _matches(value, [user]):
        return f"{user} is in DenyUsers {value}"
    if key == "AllowGroups" and not _matches(value, groups):
        return f"none of {user}'s groups ({' '.join(groups)}) is in AllowGroups {value}"
    if key == "DenyGroups" and _matches(value, groups):
        return f"a group of {user} is in DenyGroups {value}"
    if key == "AuthorizedKeysFile" and ".ssh/authorized_keys" not in value:
        return f"AuthorizedKeysFile {value}: the keys sparkctl installs in ~/.ssh/authorized_keys are not read"
    if key == "MaxStartups":
        start = value.split(":")[0]
        if start.isdigit() and int(start) < max(MAXSTARTUPS_DEFAULT, nodes):
            return f"MaxStartups {value}: the mesh's {nodes} nodes connect at once and are dropped"
    return None


@dataclass(frozen=True)
class ConfigLine:
    """One line of sshd's configuration that sets a keyword, and the Match block it is in ('' when global)."""

    path: str
    line: int
    key: str
    value: str
    match: str = ""

    def __str__(self) -> str:
        where = f" (in `{self.match}`)" if self.match else ""
        return f"{self.path}:{self.line}: {self.key} {self.value}{where}"


_GREP = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+):\s*(?P<key>\S+?)(?:\s*=\s*|\s+)(?P<value>.*?)\s*$")


def parse_config_lines(grep_output: str) -> list[ConfigLine]:
    """`grep -n` over sshd's files (path:line:text), in the order sshd reads them: the keyword lines, each with the
    Match block it falls in (a Match lasts to the next Match or the end of its file)."""
    out: list[ConfigLine] = []
    match_in: dict[str, str] = {}
    for raw in grep_output.splitlines():
        m = _GREP.match(raw)
        if not m:
            continue
        key, value = m["key"], m["value"]
        if key.lower() == "match":
            match_in[m["path"]] = "" if value.lower() == "all" else f"Match {value}"
            continue
        out.append(ConfigLine(m["path"], int(m["line"]), keyword(key), value, match_in.get(m["path"], "")))
    return out


def blame(effective: dict[str, str], lines: list[ConfigLine]) -> dict[str, ConfigLine | None]:
    """For each effective keyword (sshd -T's lower-case key -> value), the line that set it: one with that value in a
    Match block first (sshd applies a matching block over the global value), else one with that value, else (a list
    spread over several lines) the first that sets the keyword; None when no file line does (sshd's default)."""
    out: dict[str, ConfigLine | None] = {}
    for key, value in effective.items():
        setting = [c for c in lines if c.key.lower() == key]
        same = [c for c in setting if " ".join(c.value.split()).lower() == " ".join(value.split()).lower()]
        out[key] = next((c for c in same if c.match), same[0] if same else setting[0] if setting else None)
    return out
