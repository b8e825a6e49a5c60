"""End-to-end encryption without a database: the keyring's sources and the envelope."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from lr_client.encryption import is_sealed, key_ids, open_sealed, seal
from lr_client.errors import ConfigError, DecryptionError, KeyUnavailableError
from lr_client.keys import Keyring, generate_key

K1, K2, K3 = generate_key(), generate_key(), generate_key()


def test_a_payload_opens_with_the_key_of_any_destination_it_was_sealed_for() -> None:
    source = Keyring({"k1": K1, "kc": K2}, destinations={"c": "kc"})
    envelope = seal(source, b"secret", ["b", "c", "d"], "a", "policy")
    assert is_sealed(envelope) and b"secret" not in envelope
    assert key_ids(envelope) == ["k1", "kc"]  # one wrap per distinct key
    assert open_sealed(Keyring({"k1": K1}), envelope, "a", "policy") == b"secret"
    assert open_sealed(Keyring({"kc": K2}), envelope, "a", "policy") == b"secret"
    assert seal(source, b"secret", ["b"], "a", "policy") != seal(
        source, b"secret", ["b"], "a", "policy"
    )


@pytest.mark.parametrize(("source", "client"), [("a", "other"), ("x", "policy")])
def test_an_envelope_moved_to_another_client_or_source_does_not_open(
    source: str, client: str
) -> None:
    ring = Keyring({"k1": K1})
    envelope = seal(ring, b"secret", ["b"], "a", "policy")
    with pytest.raises(DecryptionError, match="does not open with key 'k1'"):
        open_sealed(ring, envelope, source, client)


def test_a_wrong_key_an_unknown_key_and_an_altered_envelope_are_told_apart() -> None:
    envelope = seal(Keyring({"k1": K1}), b"secret", ["b"], "a", "policy")
    with pytest.raises(DecryptionError, match="a wrong key under that id"):
        open_sealed(Keyring({"k1": K2}), envelope, "a", "policy")
    with pytest.raises(KeyUnavailableError, match="sealed under k1; the keyring holds k2"):
        open_sealed(Keyring({"k2": K2}), envelope, "a", "policy")
    altered = envelope[:-1] + bytes([envelope[-1] ^ 1])
    with pytest.raises(DecryptionError):
        open_sealed(Keyring({"k1": K1}), altered, "a", "policy")
    for bad in (b"plain", envelope[:20], b"LRE\x09\x01"):
        with pytest.raises(DecryptionError):
            open_sealed(Keyring({"k1": K1}), bad, "a", "policy")


def test_keys_from_a_file_the_environment_and_a_config_table(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(f'current = "k2"\n[keys]\nk1 = "{K1}"\nk2 = "{K2}"\n[destinations]\nc = "k1"\n')
    ring = Keyring.from_file(path)
    assert (ring.ids, ring.current, ring.key_for("b"), ring.key_for("c")) == (
        ["k1", "k2"],
        "k2",
        "k2",
        "k1",
    )
    env = {"LR_KEYS": f"k3:{K3}, k1:{K1}"}
    ring = Keyring.from_env("LR_KEYS", environ=env)
    assert (ring.ids, ring.current) == (["k3", "k1"], "k3")
    monkey = Keyring.from_config({"file": "keys.toml", "current": "k1"}, base=tmp_path)
    assert (monkey.current, monkey.key_for("c")) == ("k1", "k1")
    assert "K1" not in repr(ring) and K1 not in repr(ring)


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        ({}, "no keys"),
        ({"k1": "not base64!"}, "not base64"),
        ({"k1": base64.b64encode(b"short").decode()}, "must be 32 bytes, not 5"),
        ({"bad id": K1}, "invalid key id"),
    ],
)
def test_bad_keys_are_config_errors(keys: dict[str, str], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        Keyring(keys)


def test_bad_key_sources_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="names key 'k9', which is not given"):
        Keyring({"k1": K1}, current="k9")
    with pytest.raises(ConfigError, match="cannot read the key file"):
        Keyring.from_file(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match="LR_KEYS holds no keys"):
        Keyring.from_env("LR_KEYS", environ={})
    with pytest.raises(ConfigError, match="expected id:base64 pairs"):
        Keyring.from_env("LR_KEYS", environ={"LR_KEYS": K1})
    with pytest.raises(ConfigError, match="give one of file or env"):
        Keyring.from_config({"file": "a", "env": "B"})
