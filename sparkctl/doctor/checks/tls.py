"""PURE: the certificate the gateway really serves (serve.tls), as a TLS client on the head is shown it: the one
serve.tls names on this machine, and not ending within EXPIRY_WARNING_DAYS (ended: clients refuse the endpoint)."""

from __future__ import annotations

from sparkctl.doctor.catalog import SERVE_TLS_ENDING, SERVE_TLS_STALE
from sparkctl.doctor.checks.serve import gateway_head
from sparkctl.doctor.findings import Finding, finding
from sparkctl.doctor.snapshot import Snapshot
from sparkctl.knowledge.certificates import (
    EXPIRY_WARNING_DAYS,
    CertificateProblem,
    certificate_info,
    leaf_fingerprint,
)


def check_tls(s: Snapshot) -> list[Finding]:
    tls = s.inventory.serve.tls
    if tls is None or (found := gateway_head(s)) is None or found[1].gateway != "running":
        return []  # no gateway: check_gateway says so
    head, probe = found
    served = probe.served_certificate
    if served is None:
        return []  # not read (no python3 on the head): nothing to say either way
    try:
        info = certificate_info(served.encode())
        same = s.tls_certificate is None or leaf_fingerprint(served.encode()) == leaf_fingerprint(
            s.tls_certificate.encode())
    except CertificateProblem:
        info, same = None, False
    if info is None or not same:
        shown = served if info is None else f"{info.subject}, until {info.ends()}"
        return [finding(SERVE_TLS_STALE, head, "the gateway serves another certificate than serve.tls names",
                        evidence=f"the gateway on {head} shows {shown}; serve.tls.certificate is {tls.certificate}",
                        fix=s.bootstrap("serve.gateway"))]
    days = info.days_left()
    if days > EXPIRY_WARNING_DAYS:
        return []
    ended = days <= 0
    return [finding(SERVE_TLS_ENDING, head,
                    f"the endpoint's certificate {'ended' if ended else 'ends'} on {info.ends()}"
                    + ("" if ended else f", in {days:.0f} days"),
                    severity="error" if ended else None,
                    evidence=f"{info.subject}, issued by {info.issuer}, served by the gateway on {head}"
                             + (": clients refuse the endpoint" if ended else ""),
                    fix=f"renew it, put it where serve.tls.certificate and key say ({tls.certificate}), then "
                        f"{s.bootstrap('serve.gateway')}")]


CHECKS = [check_tls]
