"""Real llama.cpp RPC workers for tests: ``specdeck worker`` processes on 127.0.0.1."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

from backends.engines.worker_probe import WorkerAddress, wait_for_worker

START_TIMEOUT = 30.0


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Worker:
    """One ``specdeck worker`` process (one thread), started and answering."""

    def __init__(self, port: int | None = None, threads: int = 1) -> None:
        self.port = port or free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "backends.service.worker_cli"]
            + ["--port", str(self.port), "--threads", str(threads)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        status = wait_for_worker(self.address, START_TIMEOUT)
        if not status.reachable:
            self.kill()
            raise RuntimeError(f"worker on {self.port} did not start: {status.problem}")

    @property
    def address(self) -> WorkerAddress:
        return WorkerAddress("127.0.0.1", self.port)

    def __str__(self) -> str:
        return str(self.address)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def freeze(self) -> None:
        """Stop the process without closing its socket: a worker that no longer answers."""
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.process.send_signal(signal.SIGCONT)
