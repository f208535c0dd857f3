"""Sealing: authenticated encryption under server keys, bound to a purpose, with rotation."""

from __future__ import annotations

import base64
import os
import stat
import threading
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from pydantic import SecretStr

from app.engine.sealing import PREFIX, Sealer, SealError, load_or_create_key_file

PAYLOAD = {"summary": "The launch is on Tuesday; notify support first.", "n": 3, "nested": {"ok": True}}


def _sealer(*keys: str) -> Sealer:
    return Sealer.from_settings(",".join(keys), Path("unused"))


def _key() -> str:
    return Fernet.generate_key().decode()


def test_round_trip() -> None:
    sealer = _sealer(_key())
    token = sealer.seal("compaction", PAYLOAD)
    assert token.startswith(PREFIX)
    assert sealer.unseal("compaction", token) == PAYLOAD


def test_tokens_are_not_plaintext_and_never_repeat() -> None:
    sealer = _sealer(_key())
    first, second = sealer.seal("compaction", PAYLOAD), sealer.seal("compaction", PAYLOAD)
    assert first != second
    body = base64.urlsafe_b64decode(first[len(PREFIX) :] + "==")
    assert b"Tuesday" not in body and "Tuesday" not in first


@pytest.mark.parametrize("position", [0, 9, 30, -33, -1])
def test_one_changed_byte_is_rejected(position: int) -> None:
    sealer = _sealer(_key())
    token = sealer.seal("compaction", PAYLOAD)
    raw = bytearray(base64.urlsafe_b64decode(token[len(PREFIX) :]))
    raw[position] ^= 0x01
    tampered = PREFIX + base64.urlsafe_b64encode(bytes(raw)).decode()
    with pytest.raises(SealError) as caught:
        sealer.unseal("compaction", tampered)
    assert caught.value.code == "invalid_encrypted_content"
    assert caught.value.status == 400 and caught.value.type == "invalid_request"
    assert caught.value.param is None


@pytest.mark.parametrize("token", ["", "gAAAAABpM0Yj-abc=", "ors1.", "ors1.not-a-token", "ors2." + "A" * 100])
def test_foreign_and_truncated_tokens_are_rejected(token: str) -> None:
    with pytest.raises(SealError):
        _sealer(_key()).unseal("compaction", token)


def test_another_servers_key_is_rejected() -> None:
    token = _sealer(_key()).seal("compaction", PAYLOAD)
    with pytest.raises(SealError):
        _sealer(_key()).unseal("compaction", token)


def test_rotation_new_key_seals_old_keys_still_unseal() -> None:
    old, new = _key(), _key()
    before = _sealer(old)
    during = _sealer(new, old)
    sealed_before = before.seal("compaction", PAYLOAD)
    assert during.unseal("compaction", sealed_before) == PAYLOAD
    sealed_during = during.seal("compaction", PAYLOAD)
    assert _sealer(new).unseal("compaction", sealed_during) == PAYLOAD
    with pytest.raises(SealError):
        before.unseal("compaction", sealed_during)
    with pytest.raises(SealError):
        _sealer(new).unseal("compaction", sealed_before)


def test_a_token_for_one_purpose_is_not_valid_for_another() -> None:
    sealer = _sealer(_key())
    token = sealer.seal("reasoning", {"text": "private thoughts"})
    with pytest.raises(SealError):
        sealer.unseal("compaction", token)
    assert sealer.unseal("reasoning", token) == {"text": "private thoughts"}


def test_passphrase_keys() -> None:
    token = _sealer("correct horse battery staple").seal("compaction", PAYLOAD)
    assert _sealer("correct horse battery staple").unseal("compaction", token) == PAYLOAD
    with pytest.raises(SealError):
        _sealer("correct horse battery stapler").unseal("compaction", token)


def test_settings_accept_a_secret_str_and_spaces_around_commas() -> None:
    key = _key()
    token = Sealer.from_settings(SecretStr(f" {key} , old passphrase "), Path("unused")).seal("compaction", PAYLOAD)
    assert _sealer(key).unseal("compaction", token) == PAYLOAD


def test_an_empty_key_list_is_refused() -> None:
    with pytest.raises(ValueError):
        Sealer.from_settings(" , ", Path("unused"))


def test_without_a_configured_key_one_is_generated_privately_and_reused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = Sealer.from_settings(None, data_dir)
    key_file = data_dir / "secret.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    content = key_file.read_text()
    token = first.seal("compaction", PAYLOAD)

    again = Sealer.from_settings(None, data_dir)
    assert again.unseal("compaction", token) == PAYLOAD
    assert key_file.read_text() == content
    assert [p.name for p in data_dir.iterdir()] == ["secret.key"]
    with pytest.raises(SealError):
        Sealer.from_settings(None, tmp_path / "elsewhere").unseal("compaction", token)


def test_a_configured_key_wins_over_the_key_file(tmp_path: Path) -> None:
    file_sealer = Sealer.from_settings(None, tmp_path)
    configured = Sealer.from_settings(_key(), tmp_path)
    with pytest.raises(SealError):
        configured.unseal("compaction", file_sealer.seal("compaction", PAYLOAD))


def test_concurrent_first_starts_agree_on_one_key(tmp_path: Path) -> None:
    keys: list[str] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        keys.append(load_or_create_key_file(tmp_path))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(keys)) == 1
    assert sorted(os.listdir(tmp_path)) == ["secret.key"]


def test_an_empty_key_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "secret.key").write_text("\n")
    with pytest.raises(ValueError):
        Sealer.from_settings(None, tmp_path)
