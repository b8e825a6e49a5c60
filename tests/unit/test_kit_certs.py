"""Tests of the throwaway PKI: files load, chains verify, impostors fail, TLS works."""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import ssl
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.kit.certs import CertKey, Pki, make_pki

CLIENTS = ["site-a", "site-b", "site-c"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"), client_names=CLIENTS)


def load_cert(pair: CertKey) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pair.cert_pem())


def load_key(pair: CertKey) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(pair.key_pem(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Verify ``cert``'s signature with ``issuer``'s public key."""
    public_key = issuer.public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    assert cert.signature_hash_algorithm is not None
    try:
        public_key.verify(
            cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
        )
    except InvalidSignature:
        return False
    return True


def common_name(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def all_pairs(pki: Pki) -> list[CertKey]:
    return [pki.ca, pki.server, *pki.clients.values(), pki.wrong_ca]


def test_every_file_loads_and_keys_match_certs(pki: Pki) -> None:
    pairs = [*all_pairs(pki), pki.wrong_client, pki.expired_client]
    for pair in pairs:
        assert pair.cert.parent == pki.directory
        cert, key = load_cert(pair), load_key(pair)
        assert isinstance(key.curve, ec.SECP256R1)
        assert cert.public_key() == key.public_key()
        assert pair.key.stat().st_mode & 0o077 == 0
    assert len({pair.cert for pair in pairs}) == len(pairs)


def test_ca_is_a_self_signed_ca(pki: Pki) -> None:
    ca = load_cert(pki.ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert signed_by(ca, ca)


def test_only_the_ca_signs_certificates(pki: Pki) -> None:
    for pair in all_pairs(pki):
        usage = load_cert(pair).extensions.get_extension_for_class(x509.KeyUsage)
        ca = pair in (pki.ca, pki.wrong_ca)
        assert usage.critical and usage.value.digital_signature
        assert (usage.value.key_cert_sign, usage.value.crl_sign) == (ca, ca), pair


def test_server_cert_names_localhost_and_loopback(pki: Pki) -> None:
    server = load_cert(pki.server)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku
    server.verify_directly_issued_by(load_cert(pki.ca))


def test_client_certs_chain_to_the_ca_with_site_id_as_cn(pki: Pki) -> None:
    ca = load_cert(pki.ca)
    now = dt.datetime.now(dt.UTC)
    assert list(pki.clients) == CLIENTS
    for name in CLIENTS:
        cert = load_cert(pki.client(name))
        assert common_name(cert) == name
        assert signed_by(cert, ca)
        cert.verify_directly_issued_by(ca)
        assert cert.not_valid_before_utc < now < cert.not_valid_after_utc
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert ExtendedKeyUsageOID.CLIENT_AUTH in eku


def test_expired_client_is_from_the_real_ca_but_expired(pki: Pki) -> None:
    cert = load_cert(pki.expired_client)
    assert cert.not_valid_after_utc < dt.datetime.now(dt.UTC)
    assert signed_by(cert, load_cert(pki.ca))
    assert common_name(cert) == CLIENTS[0]


def test_wrong_client_does_not_verify_against_the_real_ca(pki: Pki) -> None:
    cert = load_cert(pki.wrong_client)
    ca, wrong_ca = load_cert(pki.ca), load_cert(pki.wrong_ca)
    assert not signed_by(cert, ca)
    with pytest.raises((ValueError, InvalidSignature)):
        cert.verify_directly_issued_by(ca)
    assert signed_by(cert, wrong_ca)
    assert common_name(cert) == CLIENTS[0]


def test_defaults_and_bad_names(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "nested")
    assert list(pki.clients) == ["site-a", "site-b"]
    with pytest.raises(TypeError):
        pki.clients["x"] = pki.ca  # type: ignore[index]
    with pytest.raises(ValueError):
        make_pki(tmp_path / "bad", client_names=["../escape"])


# -- real TLS handshakes (stdlib ssl over memory BIOs, no sockets) ---------------------


def server_context(pki: Pki) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server.cert, pki.server.key)
    ctx.load_verify_locations(pki.ca.cert)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(pki: Pki, pair: CertKey) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(pki.ca.cert)
    ctx.load_cert_chain(pair.cert, pair.key)
    return ctx


def handshake(pki: Pki, pair: CertKey, server_hostname: str = "localhost") -> str:
    """Full mTLS handshake plus one record each way; returns the CN the server saw."""
    bios = [ssl.MemoryBIO() for _ in range(4)]
    client = client_context(pki, pair).wrap_bio(bios[0], bios[1], server_hostname=server_hostname)
    server = server_context(pki).wrap_bio(bios[2], bios[3], server_side=True)
    for _ in range(20):
        for obj in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                obj.do_handshake()
        bios[2].write(bios[1].read())  # client -> server
        bios[0].write(bios[3].read())  # server -> client
    # TLS 1.3 checks the client certificate after the client thinks it is done: exchange data.
    client.write(b"hello")
    bios[2].write(bios[1].read())
    assert server.read(5) == b"hello"
    peer = server.getpeercert(binary_form=True)
    assert peer is not None
    return common_name(x509.load_der_x509_certificate(peer))


def test_mtls_handshake_accepts_each_site(pki: Pki) -> None:
    for name in CLIENTS:
        assert handshake(pki, pki.client(name)) == name
    assert handshake(pki, pki.client("site-a"), server_hostname="127.0.0.1") == "site-a"


@pytest.mark.parametrize("impostor", ["wrong_client", "expired_client"])
def test_mtls_handshake_rejects_impostors(pki: Pki, impostor: str) -> None:
    with pytest.raises(ssl.SSLError):
        handshake(pki, getattr(pki, impostor))


# -- the same material with gRPC (BoringSSL), the real consumer -------------------------


def test_grpc_mtls_sees_site_id_and_rejects_impostors(pki: Pki) -> None:
    def whoami(request: bytes, context: grpc.ServicerContext) -> bytes:
        identities = context.peer_identities() or []
        return b",".join(identities)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(whoami)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("kit.Who", {"Ami": handler})]
    )
    server_creds = grpc.ssl_server_credentials(
        [(pki.server.key_pem(), pki.server.cert_pem())],
        root_certificates=pki.ca.cert_pem(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", server_creds)
    server.start()
    try:

        def call(pair: CertKey, host: str) -> bytes:
            creds = grpc.ssl_channel_credentials(pki.ca.cert_pem(), pair.key_pem(), pair.cert_pem())
            with grpc.secure_channel(f"{host}:{port}", creds) as channel:
                reply: bytes = channel.unary_unary("/kit.Who/Ami")(b"", timeout=30)
                return reply

        assert call(pki.client("site-b"), "localhost") == b"site-b"
        assert call(pki.client("site-a"), "127.0.0.1") == b"site-a"
        for impostor in (pki.wrong_client, pki.expired_client):
            with pytest.raises(grpc.RpcError) as failure:
                call(impostor, "localhost")
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(None).wait(10)
