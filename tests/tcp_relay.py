"""A TCP relay on loopback that a test cuts and restores: the network between a server
and its database, as a partition or a database restart breaks it."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from sqlalchemy.engine import make_url

from tests.live import free_port


class CuttableRelay:
    """A TCP relay on 127.0.0.1 to ``target_port``, a thread per direction of each
    connection; :meth:`cut` closes every connection and the listener (new connections
    are refused), :meth:`restore` listens again on the same port."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.database_ports: set[int] = set()
        """The local ports of the relay's connections to the database: the client ports
        the database sees for the server's sessions."""

    def restore(self) -> None:
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            _close(listener)  # the shutdown wakes the thread blocked in accept (close alone does not)
        with self._lock:
            sockets, self._open = self._open, set()
        for sock in sockets:
            _close(sock)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._open |= {client, server}
                self.database_ports.add(server.getsockname()[1])
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv on it
    except OSError:
        pass
    sock.close()


@contextlib.contextmanager
def relayed_database(database_url: str) -> Iterator[tuple[CuttableRelay, str]]:
    """A relay to the database of ``database_url``, open, and the URL that reaches the
    database through it; cut at the end."""
    url = make_url(database_url)
    relay = CuttableRelay(url.port or 5432)
    relay.restore()
    try:
        yield relay, url.set(port=relay.port).render_as_string(hide_password=False)
    finally:
        relay.cut()
