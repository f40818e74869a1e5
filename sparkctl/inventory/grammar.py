"""What each kind of inventory value may be, checked by what it is. Every value here leaves the controller: into a
shell line, an argv position, a file on a node, a mount or a URL, as root on every node. A value is never repeated in
a message (it may be a secret pasted in the wrong place); the message says what the value must look like.

Sources: the OCI image reference grammar (github.com/distribution/reference, reference.go: name, tag, digest,
255 characters at most for the name); Hugging Face repo ids (huggingface_hub, utils/_validators.py validate_repo_id:
"repo_name" or "namespace/repo_name", [A-Za-z0-9_.-], no "--" or "..", no leading or trailing "-" or ".", at most
96 characters); revisions as git check-ref-format(1) accepts a branch or tag, narrowed to a plain character
set; user names as useradd(8) accepts them by default; host names per RFC 1123.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re

# --- OCI image reference ---------------------------------------------------------------------------------------
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-*)[a-z0-9]+)*"
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?\Z")

_REPO_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"(?:{_REPO_PART}/)?{_REPO_PART}\Z")
#: A git revision as the Hub takes one in a URL path: a branch or tag (git check-ref-format's rules, narrowed to a
#: plain character set) or a commit's 40 hex digits.
_REVISION = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_./-]{0,126}[A-Za-z0-9_])?\Z")
_SERVED_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.:/-]{0,126}[A-Za-z0-9_])?\Z")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z")
_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\Z")
_NETPLAN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\.yaml\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Where a node's HF cache may not be mounted from: the system's own directories (docker would mount them into a
#: root container that downloads into them), and so neither from a directory that holds one of them.
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc", "/root",
               "/run", "/sbin", "/snap", "/sys", "/tmp", "/usr", "/var/lib", "/var/run", "/var/log", "/var/tmp")
#: Directories that hold every user's home: a mount of one hands every user's files (keys included) to the container.
HOME_ROOTS = ("/home",)
#: What in a home directory holds credentials or configuration a root container must not write into.
SENSITIVE_IN_HOME = (".ssh", ".gnupg", ".aws", ".docker", ".kube", ".config", ".local", ".sparkctl")
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._/~-]+\Z")


def image_reference(value: str) -> str:
    match = _REFERENCE.match(value)
    if match is None or len(match["name"]) > 255:
        raise ValueError("not an image reference (registry/repository:tag or @sha256:digest, lowercase repository, "
                         "e.g. nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12)")
    return value


def repo_id(value: str) -> str:
    if len(value) > 96 or "--" in value or ".." in value or value.endswith(".git") or not _REPO_ID.match(value):
        raise ValueError("not a Hugging Face repo id (namespace/name of letters, digits, '_', '.', '-', no '--' or "
                         "'..', at most 96 characters, e.g. nvidia/Qwen3-235B-A22B-FP4)")
    return value


def revision(value: str) -> str:
    if (not _REVISION.match(value) or ".." in value or "//" in value or "/." in value or "./" in value
            or value.endswith(".lock")):
        raise ValueError("not a revision of a Hugging Face repo (a branch or tag of letters, digits, '_', '.', '-', "
                         "'/', no '..', at most 128 characters, or a commit's 40 hex digits, e.g. main)")
    return value


def served_name(value: str) -> str:
    """The name clients put in a request's `model` field: it becomes a key of the gateway's routing and a server
    flag's value, so it is a plain word (a repo id fits)."""
    if not _SERVED_NAME.match(value):
        raise ValueError("not a model name clients can ask for (letters, digits, '_', '.', ':', '/', '-', at most "
                         "128 characters, e.g. qwen3-235b or openai/gpt-oss-120b)")
    return value


#: Longer than any real setting; Linux caps one argument (a `-e NAME=value` of docker run) at 128 KiB.
MAX_ENV_VALUE = 4096


def env_value(value: str) -> str:
    if len(value) > MAX_ENV_VALUE:
        raise ValueError(f"longer than {MAX_ENV_VALUE} characters (an environment setting is a word, a number or a "
                         "list: shorten it)")
    # sshd's SetEnv carries each value to the ranks mpirun starts: one line, inside double quotes
    if _CONTROL.search(value) or '"' in value or "\\" in value:
        raise ValueError("must be one line without '\"' or '\\' (sshd's SetEnv carries it to the MPI ranks)")
    return value


def argument(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("contains a control character (a newline, tab or NUL)")
    return value


def user_name(value: str) -> str:
    if not _USER.match(value):
        raise ValueError("not a user name (letters, digits, '_', '.', '-', at most 32, not starting with '-' or a "
                         "digit)")
    return value


def host(value: str) -> str:
    """An IPv4 or IPv6 address, an RFC 1123 host name, or an ~/.ssh/config alias of the same characters."""
    if "@" in value:
        raise ValueError("contains '@' (put the user in `user:` and only the address here)")
    if value.startswith("-"):
        raise ValueError("must not start with '-' (it would be read as an ssh option)")
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if len(value) > 253 or not all(_HOST_LABEL.match(label) for label in value.rstrip(".").split(".")):
        raise ValueError("not a host name or address (letters, digits, '-', '.', at most 253; or an IPv4/IPv6 "
                         "address)")
    return value


def local_path(value: str) -> str:
    """A file on this machine (an ssh key, known_hosts): any path, but one line, and not an option."""
    if not value or _CONTROL.search(value):
        raise ValueError("must be a path on one line (e.g. ~/.ssh/id_ed25519)")
    if value.startswith("-"):
        raise ValueError("must not start with '-' (write ./ in front of a relative path)")
    return value


def node_dir(value: str) -> str:
    """A directory on every node that a container mounts: ~/... or absolute, normalised, plain characters (it is
    put in docker's -v and in printed fix commands), never a system directory, a home or a home's key store."""
    if ":" in value or "," in value:
        raise ValueError("must be one path without ':' or ',' (docker's -v would read them as more than one mount)")
    if not _PLAIN_PATH.match(value):
        raise ValueError("must be a path of letters, digits, '.', '_', '-', '/' and a leading '~' only (no spaces, "
                         "'$', quotes or backticks: it is mounted and printed in shell commands)")
    if not (value.startswith("/") or value == "~" or value.startswith("~/")):
        # docker reads a relative `-v` source as a volume name, and `~user` is not expanded on the node
        raise ValueError("must be an absolute path or start with ~/ (e.g. ~/.cache/huggingface)")
    if "~" in value[1:]:
        raise ValueError("may hold '~' only at the start (e.g. ~/.cache/huggingface)")
    bare = value[1:] if value.startswith("~") else value
    if bare and posixpath.normpath(bare) != (bare.rstrip("/") or "/") or "//" in bare:
        raise ValueError("must be a plain path (no '.', '..' or '//' in it)")
    data_dir = "(use a data directory, e.g. ~/.cache/huggingface or /data/huggingface)"
    if value.startswith("~"):
        parts = [p for p in bare.split("/") if p]
        if not parts:
            raise ValueError("~ is the whole home directory: the root container would write into it, keys and all "
                             + data_dir)
        if parts[0] in SENSITIVE_IN_HOME:
            raise ValueError(f"~/{parts[0]} holds keys or configuration: the root container would write into it "
                             + data_dir)
        return value
    clean = posixpath.normpath(value)
    if clean == "/" or any(clean == d or clean.startswith(d + "/") or d.startswith(clean + "/")
                           for d in SYSTEM_DIRS):
        raise ValueError(f"{clean} is a system directory or holds one: docker would mount it into a root container "
                         "that writes there " + data_dir)
    for root in HOME_ROOTS:
        inside = clean[len(root) + 1:].split("/") if clean.startswith(root + "/") else None
        if clean == root or (inside is not None and len(inside) == 1):
            raise ValueError(f"{clean} is a home directory or holds them: the root container would write into "
                             "every file there, keys and all " + data_dir)
        if inside is not None and inside[1] in SENSITIVE_IN_HOME:
            raise ValueError(f"{clean} is in a home's {inside[1]}, which holds keys or configuration " + data_dir)
    return value


def netplan_path(value: str) -> str:
    directory, name = posixpath.split(value)
    if directory != "/etc/netplan" or not _NETPLAN_NAME.match(name):
        raise ValueError("must be a .yaml file directly in /etc/netplan/, named with letters, digits, '.', '_', "
                         "'-' (e.g. /etc/netplan/40-cx7.yaml)")
    return value
