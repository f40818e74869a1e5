"""A server certificate the user hands sparkctl (serve.tls): what it names and until when, and whether a client
would accept it, judged by the handshake a client makes (Python's ssl, OpenSSL's verification, as curl and
sparkctl's own clients make it), done in memory between two ssl objects: what passes here is what passes there.

The parsing of what a certificate says (its names, its end) is cryptography's x509, the library paramiko already
brings; imported where a certificate is read (about 17 ms of every command's start, for an inventory without
serve.tls).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from sparkctl.userfiles import UnreadableFile, read_limited

if TYPE_CHECKING:
    from cryptography import x509

#: A certificate and its chain, or a CA bundle, in PEM: a system's whole bundle is about 200 KiB.
PEM_LIMIT = 1 << 20
#: A private key in PEM (an RSA 16384-bit key is under 13 KiB).
KEY_LIMIT = 64 << 10
#: doctor warns this long before the certificate ends (and every run says so)
EXPIRY_WARNING_DAYS = 14
# OpenSSL's X509_V_ERR_CERT_HAS_EXPIRED (x509_vfy.h): the one verification failure that is a warning, not a
# refusal (the certificate is right, only old: doctor and every run say so, and `cluster down` must still work)
_EXPIRED = 10


class CertificateProblem(ValueError):
    """The file cannot serve (not a certificate, an encrypted key, a key of another certificate...); the message
    says why in words, without the path (the caller names the field)."""


@dataclass(frozen=True)
class CertificateInfo:
    subject: str
    issuer: str
    #: the subjectAltName's DNS names and IP addresses (what clients check the name they asked for against)
    names: tuple[str, ...]
    not_after: datetime

    def days_left(self, now: datetime | None = None) -> float:
        return (self.not_after - (now or datetime.now(timezone.utc))).total_seconds() / 86400

    def ends(self) -> str:
        return self.not_after.strftime("%Y-%m-%d %H:%M UTC")


def read_pem(path: str, limit: int = PEM_LIMIT) -> bytes:
    try:
        return read_limited(path, limit)
    except UnreadableFile as exc:
        raise CertificateProblem(exc.reason) from None


def _chain(pem: bytes) -> list[x509.Certificate]:
    from cryptography import x509

    if b"PRIVATE KEY-----" in pem:
        # NGINX takes a certificate and its key in one file; sparkctl sends the key apart, as a secret
        raise CertificateProblem("holds a private key: give the certificate (and its chain) alone here, and the key "
                                 "in its own file (serve.tls.key)")
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise CertificateProblem("holds no PEM certificate (-----BEGIN CERTIFICATE-----)") from None


def certificates_pem(pem: bytes) -> str:
    """The certificates of a PEM file written again, and nothing else: no comments, no other text (a CA bundle's
    comments may not be ASCII, which ssl's cadata refuses)."""
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in _chain(pem))


def leaf_fingerprint(pem: bytes) -> str:
    """The sha256 of the first certificate (the server's own), as `openssl x509 -fingerprint -sha256` gives it."""
    return _chain(pem)[0].fingerprint(hashes.SHA256()).hex()


def certificate_info(pem: bytes) -> CertificateInfo:
    """What the first certificate of a PEM file (the server's own, its chain after it) says."""
    from cryptography import x509

    leaf = _chain(pem)[0]
    try:
        alt = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = (*alt.get_values_for_type(x509.DNSName), *(str(ip) for ip in alt.get_values_for_type(x509.IPAddress)))
    except x509.ExtensionNotFound:
        names = ()
    return CertificateInfo(subject=leaf.subject.rfc4514_string(), issuer=leaf.issuer.rfc4514_string(),
                           names=tuple(names), not_after=leaf.not_valid_after_utc)


def key_problem(pem: bytes) -> str | None:
    """Why a PEM private key cannot be NGINX's (which reads it at every start, with nobody to type a passphrase)."""
    try:
        load_pem_private_key(pem, password=None)
    except TypeError:
        return "is encrypted: NGINX reads it at every start with nobody to type the passphrase (write it " \
               "unencrypted, mode 600: `openssl pkey -in KEY -out KEY.plain`)"
    except ValueError:
        return "holds no PEM private key (-----BEGIN PRIVATE KEY-----)"
    except Exception as exc:  # noqa: BLE001 - cryptography's own errors for an unsupported key type
        return f"is not a private key NGINX can use ({type(exc).__name__})"
    return None


@dataclass(frozen=True)
class Handshake:
    """What a client said of the certificate: None when it accepted it; `expired`: the refusal was a certificate
    of the chain out of date (which one: the caller looks at the server's own)."""
    refused: str | None
    expired: bool = False


def client_handshake(certificate: str, key: str, ca: str | None, name: str) -> Handshake:
    """A TLS handshake, in memory, between a server holding `certificate` and `key` (paths) and a client that
    trusts `ca` (certificates_pem's; None: this machine's system roots) and asks for `name` (a host name or an
    address)."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # a password is given so that an encrypted key fails instead of prompting on the terminal
        server_context.load_cert_chain(certificate, key, password=b"")
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        if "KEY_VALUES_MISMATCH" in reason.upper():
            return Handshake("the key is not the certificate's (serve.tls.key belongs to another certificate)")
        return Handshake(f"OpenSSL cannot load the certificate and key: {reason}")
    client_context = client_context_for(ca)
    client_in, client_out, server_in, server_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_context.wrap_bio(client_in, client_out, server_hostname=name)
    server = server_context.wrap_bio(server_in, server_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(16):
        for side, end, out, peer in (("client", client, client_out, server_in), ("server", server, server_out,
                                                                                 client_in)):
            if not done[side]:
                try:
                    end.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLCertVerificationError as exc:
                    return Handshake(exc.verify_message or str(exc), expired=exc.verify_code == _EXPIRED)
                except ssl.SSLError as exc:
                    if side == "client":
                        return Handshake(f"the handshake fails: {exc.reason or exc}")
                    done[side] = True  # it refused the client: its alert goes over, the client's error says why
            data = out.read()
            if data:
                peer.write(data)
        if all(done.values()):
            try:
                client.do_handshake()
            except ssl.SSLCertVerificationError as exc:
                return Handshake(exc.verify_message or str(exc), expired=exc.verify_code == _EXPIRED)
            except ssl.SSLError as exc:
                return Handshake(f"the handshake fails: {exc.reason or exc}")
            return Handshake(None)
    return Handshake("the handshake did not finish")


def client_context_for(ca: str | None) -> ssl.SSLContext:
    """The context sparkctl's clients verify the endpoint with: `ca` (certificates_pem's), or the system's roots."""
    return ssl.create_default_context(cadata=ca) if ca else ssl.create_default_context()
