"""A small TCP proxy the test controls, in front of a redis-server the test started.

Modes (:meth:`Proxy.set_mode`):

* ``pass``: forward both ways;
* ``refuse``: Redis is unreachable: every open connection is closed, and new ones are closed as
  soon as they are accepted;
* ``cut``: each reply from the server is, with probability ``p``, never delivered: both sides
  of that connection are closed instead.  The server has run the command; the client sees a
  dropped connection and (redis-py) sends it again;
* ``scripts``: a connection that sends a script call (EVAL, EVALSHA) is closed before the
  call reaches Redis (counted in ``cuts``); every other command passes.  A partial failure:
  the gate's scripts fail while its blocking pops, the broker and other clients work.
"""

from __future__ import annotations

import random
import socket
import threading
from contextlib import suppress

__all__ = ["Proxy"]

#: how a script call starts on the wire (redis-py sends the command name in upper case)
_SCRIPT_CALLS = (b"\r\nEVALSHA\r\n", b"\r\nEVAL\r\n")


class Proxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(128)
        self.port: int = self._server.getsockname()[1]
        self.mode = "pass"
        self.p = 0.0
        self.cuts = 0  #: replies withheld in mode ``cut``, script calls dropped in ``scripts``
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._stop = threading.Event()
        self._rng = random.Random(7)
        self._thread = threading.Thread(target=self._accept, name="chaos-proxy", daemon=True)
        self._thread.start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def set_mode(self, mode: str, p: float = 0.0) -> None:
        if mode not in ("pass", "refuse", "cut", "scripts"):
            raise ValueError(f"mode={mode!r}: use 'pass', 'refuse', 'cut' or 'scripts'")
        with self._lock:
            self.mode, self.p = mode, p
            doomed = list(self._conns) if mode == "refuse" else []
        for sock in doomed:
            self._close(sock)

    def close(self) -> None:
        self._stop.set()
        with suppress(OSError):
            self._server.close()
        with self._lock:
            doomed = list(self._conns)
        for sock in doomed:
            self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        with self._lock:
            self._conns.discard(sock)
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with suppress(OSError):
            sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.mode == "refuse":
                self._close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                self._close(client)
                continue
            with self._lock:
                # set_mode("refuse") may have come while the upstream connection was made:
                # checked under the lock it takes, so no connection outlives a refusal
                refused = self.mode == "refuse"
                if not refused:
                    self._conns.update((client, upstream))
            if refused:
                self._close(client)
                self._close(upstream)
                continue
            for src, dst, replies in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(
                    target=self._pump, args=(src, dst, replies), daemon=True, name="chaos-pump"
                ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if replies and self.mode == "cut" and self._rng.random() < self.p:
                    with self._lock:
                        self.cuts += 1
                    break
                if not replies and self.mode == "scripts" and _script_call(data):
                    with self._lock:
                        self.cuts += 1
                    break
                dst.sendall(data)
        except OSError:
            pass
        self._close(src)
        self._close(dst)


def _script_call(data: bytes) -> bool:
    upper = data.upper()
    return any(call in upper for call in _SCRIPT_CALLS)
