"""Bearer-key authentication. With no keys configured, one anonymous tenant."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from app.errors import Unauthorized

ANONYMOUS = "anonymous"


class KeyAuthenticator:
    """Checks ``Authorization: Bearer <key>`` against the configured keys.

    Every key is compared in constant time, and all keys are compared whatever the
    outcome, so timing tells nothing about which key came close. The tenant of a request
    is the index of its key (``key-0``, ``key-1``…), never the key itself.
    """

    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = [key.encode() for key in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def tenant(self, authorization: str | None) -> str:
        if not self._keys:
            return ANONYMOUS
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("Missing bearer token: send 'Authorization: Bearer <key>'.")
        presented = token.strip().encode()
        match = -1
        for index, key in enumerate(self._keys):
            if hmac.compare_digest(presented, key) and match < 0:
                match = index
        if match < 0:
            raise Unauthorized("Incorrect API key provided.")
        return f"key-{match}"
