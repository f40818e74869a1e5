"""serve.tls's files as this machine has them, read and judged in one place: the inventory's check, the gateway
task, the clients, `serve status` and doctor all take what this gives, and each content is judged once. The key is
registered as a secret whenever it is given out, whoever asked for it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from sparkctl.errors import SparkctlError
from sparkctl.inventory.sections import TlsSettings
from sparkctl.knowledge.certificates import (
    KEY_LIMIT,
    PEM_LIMIT,
    CertificateInfo,
    CertificateProblem,
    certificate_info,
    certificates_pem,
    key_problem,
    read_pem,
)
from sparkctl.secrets import register_private_key


@dataclass(frozen=True)
class TlsFiles:
    """What the head is given and clients trust: the certificate and its chain written again (nothing else of the
    file), the key as given, what the certificate says, and the CA's certificates (None: this machine's roots)."""

    certificates: str
    key: str
    info: CertificateInfo
    ca: str | None


class TlsUnreadable(SparkctlError):
    """serve.tls's files cannot serve now; `problems` holds (field, what is wrong) for each, the path first."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("serve.tls: " + "; ".join(f"{field}: {why}" for field, why in problems),
                         hint="put the files back (`sparkctl inventory validate` checks them)")


#: what the files held -> what they were judged to be: each content is judged once per process (a renewed
#: certificate at the same path is new content)
_judged: dict[tuple[tuple[str, bytes], ...], TlsFiles] = {}


def tls_files(tls: TlsSettings) -> TlsFiles:
    """The files read and judged (PEM, ASCII, a certificate file with no key in it, an unencrypted key).
    TlsUnreadable names every field that cannot serve."""
    problems: list[tuple[str, str]] = []
    raw: list[tuple[str, bytes]] = []
    for field, given, limit in (("certificate", tls.certificate, PEM_LIMIT), ("key", tls.key, KEY_LIMIT),
                                ("ca", tls.ca, PEM_LIMIT)):
        if given is not None:
            try:
                raw.append((field, read_pem(os.path.expanduser(given), limit)))
            except CertificateProblem as exc:
                problems.append((field, f"{given} {exc}"))
    if problems:
        raise TlsUnreadable(problems)
    content = tuple(raw)
    if content not in _judged:
        _judged[content] = _judge(tls, dict(raw))
    files = _judged[content]
    register_private_key(files.key)
    return files


def _judge(tls: TlsSettings, raw: dict[str, bytes]) -> TlsFiles:
    problems: list[tuple[str, str]] = []
    texts: dict[str, str] = {}
    for field, given in (("certificate", tls.certificate), ("key", tls.key), ("ca", tls.ca)):
        if given is None:
            continue
        try:
            if field == "key":
                texts[field] = raw[field].decode("ascii")
                why = key_problem(raw[field])
                if why:
                    problems.append((field, f"{given} {why}"))
            else:
                texts[field] = certificates_pem(raw[field])
        except CertificateProblem as exc:
            problems.append((field, f"{given} {exc}"))
        except UnicodeDecodeError:
            problems.append((field, f"{given} is not ASCII PEM"))
    if problems:
        raise TlsUnreadable(problems)
    return TlsFiles(texts["certificate"], texts["key"], certificate_info(raw["certificate"]), texts.get("ca"))
