"""serve.tls judged before anything connects: the files are readable and what they say they are (a certificate file
with no key in it, an unencrypted key), the key is the certificate's, and a client that trusts serve.tls.ca (or this
machine's roots) accepts the certificate for the name clients use. A server certificate that has only ended is a
warning: clients refuse it, but it must not stop `cluster down` or `doctor`, which says it too."""

from __future__ import annotations

import os
import stat

from sparkctl.inventory.checks import InventoryParts, Problem
from sparkctl.inventory.sections import TlsSettings
from sparkctl.inventory.tls_files import TlsUnreadable, tls_files
from sparkctl.knowledge.certificates import EXPIRY_WARNING_DAYS, client_handshake

TLS = ("serve", "tls")


def tls_name(tls: TlsSettings, head_host: str) -> str:
    """The name clients ask the endpoint for: serve.tls.name, else the head's host in the inventory."""
    return tls.name or head_host


def tls_checks(parts: InventoryParts) -> tuple[list[Problem], list[Problem]]:
    """(problems, warnings) of serve.tls."""
    tls = parts.serve.tls if parts.serve is not None else None
    if tls is None:
        return [], []
    try:
        files = tls_files(tls)
    except TlsUnreadable as exc:
        return [((*TLS, field), why) for field, why in exc.problems], []
    head = parts.nodes[0] if parts.nodes and parts.nodes[0] is not None else None
    if head is None:
        return [], []
    name = tls_name(tls, str(head.host))
    info = files.info
    handshake = client_handshake(os.path.expanduser(tls.certificate), os.path.expanduser(tls.key), files.ca, name)
    days = info.days_left()
    # only the server's own certificate being out of date is a warning; an ended CA or intermediate is not
    # something a rerun or doctor would explain
    if handshake.refused and not (handshake.expired and days <= 0):
        trusted_by = "serve.tls.ca" if tls.ca else "this machine's system roots"
        named = ", ".join(info.names) or "no subjectAltName"
        return [((*TLS, "certificate"), f"a client that trusts {trusted_by} and asks for {name} refuses it: "
                                        f"{handshake.refused} (it names {named}; issued by {info.issuer})")], []
    warnings: list[Problem] = []
    if days <= 0:
        warnings.append(((*TLS, "certificate"), f"{tls.certificate} ended on {info.ends()}: clients refuse the "
                                                "endpoint (renew it, then run bootstrap)"))
    elif days <= EXPIRY_WARNING_DAYS:
        warnings.append(((*TLS, "certificate"), f"{tls.certificate} ends on {info.ends()}, in {days:.0f} days "
                                                "(renew it, then run bootstrap)"))
    mode = os.stat(os.path.expanduser(tls.key)).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        warnings.append(((*TLS, "key"), f"{tls.key} can be read by others on this machine (mode "
                                        f"{stat.S_IMODE(mode):03o}): chmod 600 it"))
    return [], warnings
