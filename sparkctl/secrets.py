"""The one home of secrets: where they come from, how they are recognised, and the one mask on the way out.

Secrets (the Hugging Face token, the sudo password) are read from the environment, a file or a prompt, and
registered here; every surface that prints or writes (console, JSON lines, the run journal, the support bundle,
diffs, logs) passes its text through this module. Imports nothing of sparkctl but userfiles, so anything may import it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Iterable
from typing import Any

import yaml

from sparkctl.userfiles import UnreadableFile, read_limited

MASK = "********"
#: A secret at least this long is masked wherever it appears; a shorter one only where it stands as a whole
#: token (`HF_TOKEN=lab` must not turn `.sparkctl-lab/inventory.yaml` into `.sparkctl-********/...`).
SAFE_LENGTH = 8
# A short secret is part of a larger word when one of these touches it.
_WORD = r"[\w.\-/]"

#: Names that say their value is a secret: environment variables, YAML/JSON keys, `KEY=value` arguments.
_SECRET_WORDS = (r"token|password|passwd|passphrase|secret|api[_-]?key|access[_-]?key|credential|private[_-]?key|"
                 r"psk|wep-key")
_SECRET_NAME = re.compile(rf"(?i)^[\w.-]*(?:{_SECRET_WORDS})[\w.-]*$")
_SECRET_KEY = rf"[A-Za-z0-9_.-]*(?:{_SECRET_WORDS})[A-Za-z0-9_.-]*"
#: Shapes of credentials, masked and refused even when nobody registered them: Hugging Face, NGC, GitHub, GitLab,
#: AWS access key ids, OpenAI/Anthropic keys, Slack, Google API keys, PEM private keys, a bearer header (each
#: service documents its prefix).
CREDENTIAL_SHAPES = (
    re.compile(r"\bhf_[A-Za-z0-9]{16,}"),
    re.compile(r"\bnvapi-[A-Za-z0-9_-]{16,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{22,}"),
    re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}"),
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"),
    # a PEM private key: the whole block where its end is there (its lines as written, or JSON's escaped ones)
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:[A-Za-z0-9+/=\s\\]*?-----END [A-Z ]*PRIVATE KEY-----)?"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/-]{16,}=*"),
)
# All shapes in one pattern: one scan of a value instead of one per shape (the loader checks every value).
_ANY_SHAPE = re.compile("|".join(f"(?i:{p.pattern[4:]})" if p.pattern.startswith("(?i)") else f"(?:{p.pattern})"
                                 for p in CREDENTIAL_SHAPES))
# The value of any key whose name says it is secret: quoted ("x", 'x', JSON's \"x\") or bare (a JSON key's bare
# value is a number, true, false or null, so bare values only after a bare key).
_ASSIGNMENTS = (
    re.compile(rf"(?i)\b({_SECRET_KEY}(?:\\?[\"'])?\s*[=:]\s*(\\?[\"']))(?!{re.escape(MASK)}\2).*?(\2)"),
    re.compile(rf"(?i)\b({_SECRET_KEY}\s*[=:]\s*)(?![\\\"'])(?!{re.escape(MASK)})[^\s\"',}}\]]+"),
)
# One YAML line whose key is a secret (netplan's Wi-Fi and 802.1X keys), for diffs of config files.
_SECRET_LINE = re.compile(r"^(\s*-?\s*[\"']?(?:password|psk|private-key|private-key-password|ca-cert-password|"
                          r"client-key-password|pin|key)[\"']?\s*:\s*).+$", re.IGNORECASE | re.MULTILINE)

_known: set[str] = set()
_provided: dict[str, str] = {}
_lock = threading.Lock()


# --- recognising -----------------------------------------------------------------------------------------------

def is_secret_name(name: str) -> bool:
    """A variable or key name that says its value is a secret (HF_TOKEN, api_key, auth.password, psk ...)."""
    return bool(_SECRET_NAME.match(name))


def looks_like_credential(value: str) -> bool:
    """The value has the shape of a credential, or assigns one (`--env=HF_TOKEN=...`)."""
    if _ANY_SHAPE.search(value):
        return True
    # an assignment needs its `=` or `:`; most values have neither, and these patterns backtrack
    return ("=" in value or ":" in value) and any(p.search(value) for p in _ASSIGNMENTS)


#: Well-known variables of other services' credentials: one named as the HF token's variable is a mistake that
#: would copy that credential to every node.
OTHER_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "AWS", "AWS_SECRET_ACCESS_KEY": "AWS", "AWS_SESSION_TOKEN": "AWS",
    "GITHUB_TOKEN": "GitHub", "GH_TOKEN": "GitHub", "GITLAB_TOKEN": "GitLab", "OPENAI_API_KEY": "OpenAI",
    "ANTHROPIC_API_KEY": "Anthropic", "NGC_API_KEY": "NVIDIA NGC", "NVIDIA_API_KEY": "NVIDIA",
    "GOOGLE_API_KEY": "Google", "GOOGLE_APPLICATION_CREDENTIALS": "Google", "AZURE_OPENAI_API_KEY": "Azure",
    "AZURE_CLIENT_SECRET": "Azure", "SLACK_TOKEN": "Slack", "DOCKER_PASSWORD": "Docker", "NPM_TOKEN": "npm",
    "PYPI_TOKEN": "PyPI", "WANDB_API_KEY": "Weights & Biases", "DATABASE_URL": "a database",
}


def credential_service(env_name: str) -> str | None:
    """The service whose credential a well-known variable name holds (None: not one of them)."""
    return OTHER_CREDENTIALS.get(env_name.upper())


# --- masking ---------------------------------------------------------------------------------------------------

def redact(text: str, secrets: Iterable[str]) -> str:
    """Every occurrence of each secret masked; a secret shorter than SAFE_LENGTH only as a whole token."""
    # Longest first, so a secret that contains another is masked whole.
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        if len(secret) >= SAFE_LENGTH:
            text = text.replace(secret, MASK)
        elif secret in text:
            text = re.sub(rf"(?<!{_WORD}){re.escape(secret)}(?!{_WORD})", MASK, text)
    return text


def redact_known(text: str) -> str:
    """Every registered secret masked."""
    with _lock:
        known = tuple(_known)
    return redact(text, known) if known else text


def redacted(value: Any) -> Any:
    """Every string in `value` (nested in dicts and lists) with registered secrets and credential shapes masked:
    the one redaction of everything sparkctl prints or writes (views, JSON, journal, doctor, status, plan)."""
    if isinstance(value, str):
        return mask_credentials(redact_known(value))
    if isinstance(value, dict):
        return {k: redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v) for v in value]
    return value


def mask_credentials(text: str) -> str:
    """Credential shapes masked (for messages that repeat what a user wrote, e.g. inventory errors)."""
    for pattern in CREDENTIAL_SHAPES:
        text = pattern.sub(_keep_prefix, text)
    return text


def scrub(text: str) -> str:
    """Registered secrets, credential shapes and the values of secret-named keys, all masked (support bundle)."""
    text = mask_credentials(redact_known(text))
    for pattern in _ASSIGNMENTS:
        text = pattern.sub(_keep_key, text)
    return text


def _keep_prefix(m: re.Match) -> str:
    return (m.group(1) if m.re.groups else "") + MASK


def _keep_key(m: re.Match) -> str:
    if m.re.groups == 3:  # quoted: keep the key and both quotes
        return m.group(1) + MASK + m.group(3)
    return m.group(1) + MASK


def mask_config_lines(text: str | None) -> str | None:
    """A YAML config (netplan) with the value of every secret-keyed line masked: for diffs and events."""
    return None if text is None else _SECRET_LINE.sub(rf"\g<1>{MASK}", text)


def mask_env(env: dict[str, str]) -> dict[str, str]:
    """Environment values of secret-named variables masked (a container's env read back from a node)."""
    return {k: MASK if is_secret_name(k) else v for k, v in env.items()}


#: Values shorter than this are not hunted down structurally (masking every "1" would wreck a bundle); the
#: key patterns of `scrub` still mask them where they stand.
MIN_STRUCTURAL = 4


def secrets_in_yaml(text: str | None) -> set[str]:
    """Values under secret keys of a YAML document (netplan's auth.password, a NetworkManager psk, ...), as
    they may be written in it or quoted in JSON: to be masked wherever they appear, whatever the layout."""
    try:
        document = yaml.safe_load(text or "")
    except yaml.YAMLError:
        return set()
    found: set[str] = set()

    def walk(value: Any, secret: bool) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, secret or is_secret_name(str(k)))
        elif isinstance(value, list):
            for v in value:
                walk(v, secret)
        elif secret and value is not None and not isinstance(value, bool):
            found.add(str(value))

    walk(document, False)
    out: set[str] = set()
    for value in found:
        if len(value) >= MIN_STRUCTURAL:
            quoted = _json_quoted(value)
            out |= {value, quoted, _json_quoted(quoted)}
    return out


def _json_quoted(value: str) -> str:
    return json.dumps(value)[1:-1]


# --- sources ---------------------------------------------------------------------------------------------------

#: A token or password file holds one line.
SECRET_FILE_LIMIT = 4096


class SecretUnreadable(OSError):
    """A file named as the source of a secret cannot be read."""


def register_secret(value: str | None) -> None:
    """Remember a secret for the whole process: every later redact_known masks it."""
    if value:
        with _lock:
            _known.add(value)
            # A trailing newline often follows a secret read from a file: mask the bare value too.
            stripped = value.strip()
            if stripped:
                _known.add(stripped)


def register_private_key(pem: str) -> None:
    """A PEM private key: the whole file and every line of its body are masked wherever they appear (a log that
    shows part of a file shows whole lines)."""
    register_secret(pem)
    for line in pem.splitlines():
        if not line.startswith("-----") and len(line.strip()) >= SAFE_LENGTH:
            register_secret(line)


def provide_secret(env_name: str, value: str) -> None:
    """A secret typed at a prompt, used as if the variable `env_name` held it (never put in os.environ:
    local subprocesses would inherit it)."""
    register_secret(value)
    with _lock:
        _provided[env_name] = value


def secret_from_env(env_name: str) -> str | None:
    """The secret in the variable `env_name`, else in the file named by `<env_name>_FILE`, else one typed at
    a prompt; registered for masking. None when there is none. Raises SecretUnreadable."""
    value = os.environ.get(env_name, "").strip()
    file_name = os.environ.get(f"{env_name}_FILE")
    if not value and file_name:
        try:
            value = read_limited(file_name, SECRET_FILE_LIMIT).decode().strip()
        except (UnreadableFile, UnicodeDecodeError) as exc:
            reason = exc.reason if isinstance(exc, UnreadableFile) else "not UTF-8 text"
            raise SecretUnreadable(f"cannot read the file named by {env_name}_FILE: {reason}") from None
    with _lock:
        value = value or _provided.get(env_name, "")
    if not value:
        return None
    register_secret(value)
    return value


def forget_secrets() -> None:
    """For tests: drop every registered and provided secret."""
    with _lock:
        _known.clear()
        _provided.clear()


# --- logging ---------------------------------------------------------------------------------------------------

class RedactingFilter(logging.Filter):
    """A logging filter that passes the formatted message through the one redaction (registered secrets and
    credential shapes)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redacted(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


class RedactingFormatter(logging.Formatter):
    """The whole formatted record redacted: an attached traceback (exc_info) is formatted after any filter ran."""

    def format(self, record: logging.LogRecord) -> str:
        return redacted(super().format(record))


def redacting_handler(stream: Any, level: int) -> logging.Handler:
    """A stream handler whose every record, traceback included, passes the one redaction (install it instead of
    a bare handler)."""
    handler = logging.StreamHandler(stream)
    handler.setLevel(level)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(RedactingFormatter("%(name)s: %(message)s"))
    return handler
