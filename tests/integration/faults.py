"""A TCP relay between workers and a server, to make that server slow to fail.

Stopping a server makes every call fail at once (connection refused). Some
double faults need a call that fails *slowly* (a store call that hangs for a
few seconds before it errors), so that the test can break a second server in
the meantime. :class:`StallingRelay` forwards bytes both ways; in "stall"
mode it cuts the connections it carries and holds every new one for a while
before closing it, as an unreachable host whose packets are dropped does.
Everything runs on loopback, in this process's threads.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class StallingRelay:
    """Forwards ``127.0.0.1:<port>`` to ``127.0.0.1:<upstream_port>`` until told to stall."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._stall: float | None = None
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()

    def stall(self, seconds: float) -> None:
        """Cut every open connection; hold each new one ``seconds``, then close it."""
        with self._lock:
            self._stall = seconds
            open_now, self._open = self._open, set()
        for sock in open_now:
            _close(sock)

    def forward(self) -> None:
        """Relay again."""
        with self._lock:
            self._stall = None

    def close(self) -> None:
        self._closed.set()
        _close(self._listener)
        self.stall(0)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            stall = self._stall
        if stall is not None:
            time.sleep(stall)
            _close(client)
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
        except OSError:
            _close(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._open.update((client, upstream))
        threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
        _pump(upstream, client)


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        _close(source)
        _close(target)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
