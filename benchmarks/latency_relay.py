"""A TCP relay on 127.0.0.1 that delays traffic: a slow network between the engine and workers.

    relay = LatencyRelay(("127.0.0.1", 50052), round_trip_ms=10)
    relay.start()          # relay.port: connect there instead of 50052
    ...
    relay.stop()

Every chunk is forwarded half the round trip after it arrived, in each direction, in
order; bandwidth is not limited. Used by ``benchmarks/rpc_latency.py`` (loopback workers
at 0, 2 and 10 ms round trip).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time

_CHUNK = 1 << 16


class LatencyRelay:
    """Listens on an ephemeral port of 127.0.0.1 and relays to ``target`` with a delay."""

    def __init__(self, target: tuple[str, int], round_trip_ms: float) -> None:
        self.target = target
        self.one_way_seconds = round_trip_ms / 2000.0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._sockets: list[socket.socket] = []

    def start(self) -> LatencyRelay:
        """Accept connections in the background; returns itself."""
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        """Close the listener and every relayed connection."""
        self._stopped.set()
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._sockets.append(sock)
            self._pipe(client, server)
            self._pipe(server, client)

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        """Forward source → sink, each chunk ``one_way_seconds`` after it arrived."""
        pending: queue.Queue[tuple[float, bytes]] = queue.Queue()

        def read() -> None:
            while True:
                try:
                    data = source.recv(_CHUNK)
                except OSError:
                    data = b""
                pending.put((time.perf_counter() + self.one_way_seconds, data))
                if not data:
                    return

        def write() -> None:
            while True:
                due, data = pending.get()
                delay = due - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                try:
                    if not data:
                        sink.shutdown(socket.SHUT_WR)
                        return
                    sink.sendall(data)
                except OSError:
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()
