"""Bearer-key authentication: a key → its tenant. With no keys configured, one anonymous
tenant.

A tenant is who owns stored responses, so its identity must survive the key list being
reordered, a key being removed, and a key being rotated. It never depends on a key's
position:

* ``name:secret`` (``name`` matching ``[A-Za-z0-9_.-]{1,64}``): the tenant is ``name``.
  Several secrets may share one name; that is how a key is rotated (add ``alice:new``,
  move clients over, remove ``alice:old``). The client sends the secret; the whole entry
  ``name:secret`` is accepted too, so a key that held a ``:`` before names existed keeps
  working unchanged.
* Anything else (no ``:``, or text before the first ``:`` that is not a name) is a secret
  of its own, whose tenant is ``key-`` + the first 16 hex digits of
  HMAC-SHA256(:data:`TENANT_DOMAIN`, secret). The HMAC key is a constant for domain
  separation, not the server's secret key: ``ORS_SECRET_KEY`` can be rotated and the
  generated one lives in each replica's data directory, and either would move tenants.
  Only a digest of the secret is ever stored, never the secret.

A secret that itself contains ``:`` after a name-like prefix (``ab:cd``) is read as
named; to keep it whole, give it a name (``team:ab:cd`` is the secret ``ab:cd`` of
``team``). Names beginning with ``key-`` are reserved for derived tenants; a name may be
``anonymous``, which keeps the anonymous tenant's responses when keys are turned on.

Every key is compared in constant time, and all keys are compared whatever the outcome,
so timing tells nothing about which key came close.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.errors import Unauthorized

ANONYMOUS = "anonymous"
TENANT_DOMAIN = b"ors/tenant-of-unnamed-key/v1"
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
RESERVED_PREFIX = "key-"


@dataclass(frozen=True)
class ApiKey:
    """One ``ORS_API_KEYS`` entry, parsed."""

    tenant: str
    secret: str = field(repr=False)
    named: bool
    entry: str = field(repr=False)

    def tokens(self) -> list[str]:
        """What a client may present for this key."""
        return [self.secret, self.entry] if self.named else [self.secret]


def derived_tenant(secret: str) -> str:
    """The tenant of a key that has no name: a keyed digest of the secret."""
    digest = hmac.new(TENANT_DOMAIN, secret.encode(), hashlib.sha256).hexdigest()
    return f"{RESERVED_PREFIX}{digest[:16]}"


def parse_key(entry: str) -> ApiKey:
    """``name:secret`` or a bare secret (see the module docstring). Raises ``ValueError``
    for an empty secret or a reserved name (never quoting a secret)."""
    name, sep, secret = entry.partition(":")
    if sep and NAME.fullmatch(name):
        if not secret:
            raise ValueError(f"the API key named {name!r} has an empty secret")
        if name.startswith(RESERVED_PREFIX):
            raise ValueError(f"API key names beginning with {RESERVED_PREFIX!r} are reserved (got {name!r})")
        return ApiKey(tenant=name, secret=secret, named=True, entry=entry)
    if not entry:
        raise ValueError("an API key must not be empty")
    return ApiKey(tenant=derived_tenant(entry), secret=entry, named=False, entry=entry)


class KeyAuthenticator:
    """Checks ``Authorization: Bearer <key>`` against the configured keys (the entries
    of ``ORS_API_KEYS``, in their configured order)."""

    def __init__(self, entries: Sequence[str]) -> None:
        self.keys = [parse_key(entry) for entry in entries]
        owners: dict[str, str] = {}
        for key in self.keys:
            for token in key.tokens():
                if owners.setdefault(token, key.tenant) != key.tenant:
                    raise ValueError(f"one API key is configured for two tenants ({owners[token]!r}, {key.tenant!r})")
        self._tokens = [(token.encode(), tenant) for token, tenant in owners.items()]

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    @property
    def tenants(self) -> list[str]:
        """The distinct tenants, in configured order."""
        return list(dict.fromkeys(key.tenant for key in self.keys))

    def positional_tenants(self) -> dict[str, str]:
        """``key-<i>`` (the tenant that earlier versions gave the key at index ``i``) →
        that key's tenant now. The store's migration renames rows with it."""
        return {f"key-{index}": key.tenant for index, key in enumerate(self.keys)}

    @property
    def keyed(self) -> bool:
        """Whether requests must present a key (without keys, every request is anonymous)."""
        return bool(self._tokens)

    def tenant(self, authorization: str | None) -> str:
        if not self._tokens:
            return ANONYMOUS
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("Missing bearer token: send 'Authorization: Bearer <key>'.")
        presented = token.strip().encode()
        match: str | None = None
        for candidate, tenant in self._tokens:
            if hmac.compare_digest(presented, candidate) and match is None:
                match = tenant
        if match is None:
            raise Unauthorized("Incorrect API key provided.")
        return match
