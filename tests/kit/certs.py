"""Throwaway TLS material (ECDSA P-256) for gRPC mTLS tests.

``make_pki(tmp_path)`` writes a CA, a server certificate for localhost/127.0.0.1, one
client certificate per site id (CN = site id), plus an unrelated CA with a client
certificate of its own and an expired client certificate from the real CA, for the
"wrong certificate" cases. All files are PEM; keys are unencrypted PKCS#8.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertKey", "Pki", "make_pki"]

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_LOOPBACK_IPS = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))


@dataclass(frozen=True)
class CertKey:
    """Paths of one PEM certificate and its private key."""

    cert: Path
    key: Path

    def cert_pem(self) -> bytes:
        """The certificate, as PEM bytes."""
        return self.cert.read_bytes()

    def key_pem(self) -> bytes:
        """The private key, as PEM bytes."""
        return self.key.read_bytes()


@dataclass(frozen=True)
class Pki:
    """Everything ``make_pki`` wrote.

    ``clients`` maps each client name to its certificate signed by ``ca``;
    ``wrong_client`` is signed by the unrelated ``wrong_ca``; ``expired_client`` is
    signed by ``ca`` but already expired. Both impostors carry the first client name
    as CN, so only the signature or validity gives them away.
    """

    directory: Path
    ca: CertKey
    server: CertKey
    clients: Mapping[str, CertKey]
    wrong_ca: CertKey
    wrong_client: CertKey
    expired_client: CertKey

    def client(self, name: str) -> CertKey:
        """The valid client certificate for ``name``."""
        return self.clients[name]


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "lr test kit"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> CertKey:
    cert_path = directory / f"{stem}.pem"
    key_path = directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(key_path, 0o600)
    return CertKey(cert=cert_path, key=key_path)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Signatures; and, for a CA, certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _make_ca(
    common_name: str, now: dt.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _new_key()
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _make_leaf(
    common_name: str,
    sans: Sequence[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    not_before: dt.datetime,
    not_after: dt.datetime,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    issuer_cert, issuer_key = issuer
    key = _new_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(issuer_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        # Site certificates serve both roles: a site is a client of its
        # destinations and a server for its sources.
        .add_extension(
            x509.ExtendedKeyUsage(
                [usage, ExtendedKeyUsageOID.SERVER_AUTH]
                if usage == ExtendedKeyUsageOID.CLIENT_AUTH
                else [usage]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256()), key


def _client_sans(name: str) -> list[x509.GeneralName]:
    """DNS SAN equal to the CN, so gRPC's peer identity (SAN first) is the site id too."""
    return [x509.DNSName(name)]


def make_pki(
    directory: Path,
    server_names: Sequence[str] = ("localhost",),
    client_names: Sequence[str] = ("site-a", "site-b"),
) -> Pki:
    """Write a fresh throwaway PKI into ``directory`` (created if missing) and describe it.

    Server cert: CN = ``server_names[0]``, SAN = DNS ``server_names`` + IP 127.0.0.1, ::1.
    Client certs: CN (and DNS SAN) = the client name, written as ``client-<name>.pem/.key``.
    """
    if not server_names:
        raise ValueError("server_names must not be empty")
    for client_name in client_names:
        if not _SAFE_NAME.fullmatch(client_name):
            raise ValueError(f"client name not usable as a file name: {client_name!r}")
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    valid_from, valid_to = now - dt.timedelta(hours=1), now + dt.timedelta(days=1)

    ca = _make_ca("lr test kit CA", now)
    server_sans: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
    server_sans += [x509.IPAddress(ip) for ip in _LOOPBACK_IPS]
    server = _make_leaf(
        server_names[0], server_sans, ExtendedKeyUsageOID.SERVER_AUTH, ca, valid_from, valid_to
    )
    clients = {
        name: _write(
            directory,
            f"client-{name}",
            *_make_leaf(
                name, _client_sans(name), ExtendedKeyUsageOID.CLIENT_AUTH, ca, valid_from, valid_to
            ),
        )
        for name in client_names
    }

    impostor = client_names[0] if client_names else "site-a"
    wrong_ca = _make_ca("unrelated test CA", now)
    wrong_client = _make_leaf(
        impostor,
        _client_sans(impostor),
        ExtendedKeyUsageOID.CLIENT_AUTH,
        wrong_ca,
        valid_from,
        valid_to,
    )
    expired_client = _make_leaf(
        impostor,
        _client_sans(impostor),
        ExtendedKeyUsageOID.CLIENT_AUTH,
        ca,
        now - dt.timedelta(days=2),
        now - dt.timedelta(days=1),
    )
    return Pki(
        directory=directory,
        ca=_write(directory, "ca", *ca),
        server=_write(directory, "server", *server),
        clients=MappingProxyType(clients),
        wrong_ca=_write(directory, "wrong-ca", *wrong_ca),
        wrong_client=_write(directory, "wrong-client", *wrong_client),
        expired_client=_write(directory, "expired-client", *expired_client),
    )
