"""Sealing: content the server hands to clients and must be able to trust when it comes back.

A sealed token is ``ors1.`` followed by a Fernet token (AES-128-CBC, then HMAC-SHA256
over version, timestamp, IV and ciphertext; a random IV per token). The plaintext is the
JSON object ``{"v": 1, "p": <purpose>, "d": <payload>}``; clients see none of it and can
change none of it without the HMAC failing.

Why Fernet rather than AES-GCM: it is a complete, misuse-resistant recipe (fresh IV,
encrypt-then-MAC, constant-time check, one token format) that the ``cryptography``
library maintains, and ``MultiFernet`` gives key rotation for free. AES-GCM would need
our own nonce handling and key-id framing for the same guarantees.

**Purpose binding.** Each purpose (``"compaction"``, ``"reasoning"``) gets keys of its
own, derived with HKDF-SHA256 (``info`` = ``ors-seal-v1:<purpose>``), and the purpose is
repeated inside the authenticated plaintext. A token made for one purpose therefore fails
authentication under another, and is rejected even if it did not.

**Keys and rotation.** ``ORS_SECRET_KEY`` holds one or more keys separated by commas,
newest first: the first seals, every one of them unseals. To rotate, put the new key in
front and keep the old one until the tokens it sealed no longer matter. A key is either a
Fernet key (32 random bytes, url-safe base64) or any passphrase; a passphrase is
stretched with scrypt first, so a guessable one is still costly to attack offline.
Without ``ORS_SECRET_KEY``, a random key is generated once and kept in ``secret.key``
under the data directory (mode 0600, created atomically, reused on every later start).
Keys are never logged.

**Failure.** :meth:`Sealer.unseal` raises :class:`SealError` (400 ``invalid_request``,
code ``invalid_encrypted_content``) for anything it cannot vouch for: a foreign or
truncated token, a flipped bit, another server's key, another purpose. The caller sets
``param`` to where the token came from.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
from pydantic import SecretStr

from app.errors import InvalidRequest

log = logging.getLogger("ors.sealing")

PREFIX = "ors1."
"""Version prefix of every token this server seals."""
KEY_FILE = "secret.key"
ENVELOPE_VERSION = 1

_HKDF_INFO = b"ors-seal-v1:"
_SCRYPT_SALT = b"ors-sealer-passphrase-v1"
_SCRYPT_N = 2**14


class SealError(InvalidRequest):
    """A sealed token that this server cannot vouch for."""

    default_code = "invalid_encrypted_content"


class Sealer:
    """Seals and unseals JSON payloads for a purpose. Build it with :meth:`from_settings`
    (or from master keys directly); it is cheap to share and safe to use from any task."""

    def __init__(self, master_keys: list[bytes]) -> None:
        """``master_keys``: 32-byte secrets, newest first (see :func:`master_key`)."""
        if not master_keys:
            raise ValueError("a Sealer needs at least one key")
        self._masters = list(master_keys)
        self._by_purpose: dict[str, MultiFernet] = {}

    @classmethod
    def from_settings(cls, secret_key: str | SecretStr | None, data_dir: Path) -> Sealer:
        """Keys from ``secret_key`` (comma-separated, newest first) when set, else the
        generated key of ``data_dir``."""
        if isinstance(secret_key, SecretStr):
            secret_key = secret_key.get_secret_value()
        if secret_key is not None and secret_key.strip():
            keys = parse_keys(secret_key)
            if not keys:
                raise ValueError("ORS_SECRET_KEY holds no key")
            log.info("sealing with %d configured key(s)", len(keys))
            return cls([master_key(key) for key in keys])
        return cls([master_key(load_or_create_key_file(data_dir))])

    def seal(self, purpose: str, payload: dict[str, Any]) -> str:
        """An opaque, authenticated token holding ``payload`` (JSON-serializable) for
        ``purpose``, sealed with the newest key."""
        plaintext = json.dumps(
            {"v": ENVELOPE_VERSION, "p": purpose, "d": payload}, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")
        return PREFIX + self._fernet(purpose).encrypt(plaintext).decode("ascii")

    def unseal(self, purpose: str, token: str) -> dict[str, Any]:
        """The payload sealed in ``token`` for ``purpose``, by any of the keys; else
        :class:`SealError`."""
        if not isinstance(token, str) or not token.startswith(PREFIX):
            raise SealError("The encrypted content was not produced by this server.")
        try:
            plaintext = self._fernet(purpose).decrypt(token[len(PREFIX) :].encode("ascii"))
            envelope = json.loads(plaintext)
        except (InvalidToken, UnicodeError, ValueError):
            raise SealError(
                "The encrypted content could not be verified: it was altered, made by another "
                "server or with a retired key, or made for another use."
            ) from None
        if (
            not isinstance(envelope, dict)
            or envelope.get("v") != ENVELOPE_VERSION
            or envelope.get("p") != purpose
            or not isinstance(envelope.get("d"), dict)
        ):
            raise SealError("The encrypted content was made for another use.")
        return envelope["d"]

    def _fernet(self, purpose: str) -> MultiFernet:
        fernet = self._by_purpose.get(purpose)
        if fernet is None:
            fernet = MultiFernet([Fernet(_purpose_key(master, purpose)) for master in self._masters])
            self._by_purpose[purpose] = fernet
        return fernet


def parse_keys(value: str) -> list[str]:
    """The keys of an ``ORS_SECRET_KEY`` value, in order."""
    return [part.strip() for part in value.split(",") if part.strip()]


def master_key(key: str) -> bytes:
    """32 secret bytes from a configured key: a Fernet key's own bytes, or a passphrase
    stretched with scrypt."""
    raw = _fernet_key_bytes(key)
    if raw is not None:
        return raw
    return Scrypt(salt=_SCRYPT_SALT, length=32, n=_SCRYPT_N, r=8, p=1).derive(key.encode("utf-8"))


def _fernet_key_bytes(key: str) -> bytes | None:
    if len(key) != 44:
        return None
    try:
        raw = base64.urlsafe_b64decode(key.encode("ascii"))
    except (binascii.Error, UnicodeError, ValueError):
        return None
    return raw if len(raw) == 32 else None


def _purpose_key(master: bytes, purpose: str) -> bytes:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO + purpose.encode("utf-8"))
    return base64.urlsafe_b64encode(derived.derive(master))


def load_or_create_key_file(data_dir: Path) -> str:
    """The key kept in ``data_dir/secret.key``; generated on first use.

    Creation is atomic: the key is written to a private temporary file (mode 0600) and
    hard-linked into place, which fails if another process got there first; that
    process's key is then used. An existing file must hold a key (several, comma
    separated, are accepted: the first one seals)."""
    path = data_dir / KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        _create_key_file(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("%s is readable by other users (mode %o); restrict it to its owner", path, mode)
    keys = parse_keys(path.read_text(encoding="utf-8"))
    if not keys:
        raise ValueError(f"{path} holds no key; delete it to generate a new one")
    return keys[0]


def _create_key_file(path: Path) -> None:
    key = Fernet.generate_key()
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(key + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return
        _sync_directory(path.parent)
        log.info("generated a new secret key in %s", path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _sync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError):
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
