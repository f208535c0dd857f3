"""How this server's outbound HTTP clients are made: httpx, configured in one place.

Two kinds of client, one function each:

* :func:`upstream_client`: one per HTTP upstream (:mod:`app.backends.upstream_http`).
  It honours the environment as httpx does (``trust_env``): ``HTTP_PROXY``,
  ``HTTPS_PROXY``, ``ALL_PROXY`` and ``NO_PROXY`` choose a forward proxy per URL, and
  ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` replace the trusted certificates, unless the
  upstream names a CA bundle of its own (:class:`TlsFiles`). Its pool is bounded
  (:class:`Pool`); a request that finds every connection in use waits for one, at most
  ``Pool.wait`` seconds, then fails with ``httpx.PoolTimeout``.
* :func:`loopback_client`: one per embedded model's llama-server child, on 127.0.0.1.
  It never goes through a proxy and reads nothing of the environment (``trust_env``
  off), and its pool has no bound: the model's slots bound its requests.

Both keep idle connections :data:`KEEPALIVE_SECONDS` at most, less than the 5 s after
which uvicorn-, Node- and cpp-httplib-based servers close them; httpx also checks that an
idle connection is still open before it reuses one. Neither asks for a compressed answer
(``Accept-Encoding: identity``): a compressing server may hold back the pieces of a
stream. A response closed before its end closes its connection (httpx does not pool it),
which is how an upstream learns that its client went away.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

KEEPALIVE_SECONDS = 4.0
"""How long an idle connection is kept for reuse."""
USER_AGENT = "ors"

DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_MAX_KEEPALIVE = 256
DEFAULT_POOL_WAIT = 30.0


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long an upstream may take."""

    connect: float = 5.0
    """Seconds to open a connection (TCP, a proxy's tunnel and TLS): connect fast or fail."""
    read: float = 600.0
    """Seconds an answer may stay silent (and a request body may wait to be sent): a model
    may think for minutes."""


@dataclass(frozen=True, slots=True)
class Pool:
    """The bounds of one upstream's connection pool (the ``ORS_UPSTREAM_MAX_*`` settings)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Connections open at once, in use or idle. A stream holds one for its whole life."""
    max_keepalive: int = DEFAULT_MAX_KEEPALIVE
    """Idle connections kept for reuse."""
    wait: float = DEFAULT_POOL_WAIT
    """Seconds a request may wait for a connection when all of them are in use."""


class TlsFilesError(ValueError):
    """A CA bundle, client certificate or key that cannot be used; the message names the
    file, ``field`` which of the three it is."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """An upstream's own TLS files (PEM). ``ca_bundle`` replaces the trusted certificates
    for that upstream; ``client_cert`` (with ``client_key``, unless the key is in the same
    file) is presented to an upstream that asks for one (mutual TLS)."""

    ca_bundle: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None

    def context(self) -> ssl.SSLContext:
        """The TLS context of these files, on top of httpx's default (which honours
        ``SSL_CERT_FILE`` and ``SSL_CERT_DIR``). Raises :class:`TlsFilesError`."""
        if self.client_key is not None and self.client_cert is None:
            raise TlsFilesError(f"a client key ({self.client_key}) needs its client_cert", "client_key")
        if self.ca_bundle is not None:
            _readable(self.ca_bundle, "CA bundle", "ca_bundle")
            try:
                context = ssl.create_default_context(cafile=str(self.ca_bundle))
            except (ssl.SSLError, ValueError) as exc:
                raise TlsFilesError(f"the CA bundle {self.ca_bundle} holds no usable PEM certificate: {exc}",
                                    "ca_bundle") from None
        else:
            context = httpx.create_ssl_context(trust_env=True)
        if self.client_cert is not None:
            _readable(self.client_cert, "client certificate", "client_cert")
            if self.client_key is not None:
                _readable(self.client_key, "client key", "client_key")
            key = None if self.client_key is None else str(self.client_key)
            try:
                context.load_cert_chain(str(self.client_cert), key, password=_no_password)
            except (ssl.SSLError, _PasswordNeeded) as exc:
                files = f"{self.client_cert}" + (f" and {self.client_key}" if key is not None else "")
                raise TlsFilesError(f"the client certificate and key in {files} cannot be used (a PEM certificate "
                                    f"and its unencrypted private key are needed): {exc}", "client_cert") from None
        return context


class _PasswordNeeded(Exception):
    def __str__(self) -> str:
        return "the key is encrypted"


def _no_password() -> str:
    """Asked only for an encrypted key: refused, rather than OpenSSL prompting on a terminal."""
    raise _PasswordNeeded


def _readable(path: Path, what: str, field: str) -> None:
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise TlsFilesError(f"the {what} {path} cannot be read: {exc.strerror or exc}", field) from None


def check_headers(headers: Mapping[str, str]) -> None:
    """Refuse (``ValueError``) a header that could not be sent as it is (an empty name, a
    colon in the name, a line break or NUL anywhere), so no request is ever split."""
    for name, value in headers.items():
        if not name or ":" in name or any(c in f"{name}{value}" for c in "\r\n\0"):
            raise ValueError(f"a header that cannot be sent: {name!r}")


def upstream_client(base_url: str, *, headers: Mapping[str, str] | None = None, timeouts: Timeouts = Timeouts(),
                    pool: Pool = Pool(), verify: ssl.SSLContext | bool = True) -> httpx.AsyncClient:
    """The client of one upstream (see the module docstring); requests name paths below
    ``base_url``. ``headers`` go with every request (checked by :func:`check_headers`);
    ``verify``: the upstream's TLS context (:meth:`TlsFiles.context`), or ``True`` for
    httpx's default."""
    check_headers(headers or {})
    return httpx.AsyncClient(
        base_url=base_url,
        headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **(headers or {})},
        timeout=httpx.Timeout(connect=timeouts.connect, read=timeouts.read, write=timeouts.read, pool=pool.wait),
        limits=httpx.Limits(max_connections=pool.max_connections, max_keepalive_connections=pool.max_keepalive,
                            keepalive_expiry=KEEPALIVE_SECONDS),
        verify=verify,
        trust_env=True,
    )


def loopback_client(base_url: str, *, headers: Mapping[str, str] | None = None,
                    connect: float = 10.0) -> httpx.AsyncClient:
    """The client of a server this one started on 127.0.0.1 (see the module docstring).
    No read timeout: a generation may take as long as it takes; callers that expect a
    prompt answer bound it themselves."""
    return httpx.AsyncClient(
        base_url=base_url,
        headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **(headers or {})},
        timeout=httpx.Timeout(connect=connect, read=None, write=None, pool=None),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=KEEPALIVE_SECONDS),
        trust_env=False,
    )
