"""A stand-in for a pager or an HTTP target that answers too slowly to finish: each byte
arrives well within any per-read timeout, the answer never completes."""

from __future__ import annotations

import socket
import threading
from contextlib import suppress


class TricklingServer:
    """Accepts connections and sends each one byte every 0.3 s, never a whole answer."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/page"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.1)
        conns = []
        while not self._stop.is_set():
            with suppress(OSError):
                conns.append(self.sock.accept()[0])
            for conn in conns:
                with suppress(OSError):
                    conn.send(b"H")
            self._stop.wait(0.3)
        for conn in conns:
            conn.close()
        self.sock.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def __enter__(self) -> TricklingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
