"""Certificates made for a test: a CA of its own and a server certificate it signs (cryptography's x509, as a site's
own CA or `openssl req` would make them), written as PEM files."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    certificate: Path
    key: Path
    ca: Path

    def key_lines(self) -> list[str]:
        """The key's body, line by line: what must appear nowhere sparkctl writes."""
        return [line for line in self.key.read_text().splitlines() if not line.startswith("-----")]


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _alt(names: list[str]) -> x509.SubjectAlternativeName:
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(out)


def issue(folder: Path, names: list[str], *, days: float = 90, started_days_ago: float = 1,
          encrypted: bool = False, prefix: str = "server", ca_days: float = 3650) -> Issued:
    """A CA (valid for `ca_days` from now) and a server certificate it signs for `names` (DNS names or addresses),
    valid for `days` from now."""
    now = datetime.now(timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name(f"{prefix} test CA")).issuer_name(_name(f"{prefix} test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - timedelta(days=400)).not_valid_after(now + timedelta(days=ca_days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder().subject_name(_name(names[0])).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=started_days_ago)).not_valid_after(now + timedelta(days=days))
            .add_extension(_alt(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    paths = Issued(folder / f"{prefix}.crt", folder / f"{prefix}.key", folder / f"{prefix}-ca.crt")
    paths.certificate.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    protection = (serialization.BestAvailableEncryption(b"a passphrase") if encrypted
                  else serialization.NoEncryption())
    paths.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            protection))
    paths.key.chmod(0o600)
    return paths
