"""Which worker went away: probes a load's llama.cpp RPC workers off the GUI thread.

When the engine process dies while its main model is on workers, llama.cpp has aborted it
(a worker closed the connection or stopped answering) or something else crashed; the
window asks each worker (with a timeout) and names the one that no longer answers, so that
the message says which and "Reload" can offer the pair without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from backends.engines.worker_probe import parse_worker, probe_worker
from gui.background import BackgroundTask

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

# llama.cpp's last words when a worker fails it (ggml-rpc.cpp's aborts).
RPC_ABORT_MARKERS = ("Remote RPC server crashed", "Failed to connect to", "RPC handshake failed")
PROBE_TIMEOUT_SECONDS = 2.0


def mentions_rpc_failure(log_lines: Sequence[str]) -> bool:
    """Whether a dead engine's log says llama.cpp lost a worker."""
    return any(marker in line for line in log_lines for marker in RPC_ABORT_MARKERS)


class WorkerProbe(QObject):
    """Probes workers in the background; ``finished(address, problem)`` ("" when all answer).

    Signals:
        finished(str, str): the first worker that does not answer and why, or ("", "").
    """

    finished = Signal(str, str)

    def __init__(self, workers: Sequence[str], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.workers = tuple(workers)
        self._task = BackgroundTask(self._probe, self)
        self._task.succeeded.connect(self._on_done)
        self._task.failed.connect(lambda _message: self.finished.emit("", ""))

    def start(self) -> None:
        """Start probing (once)."""
        self._task.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the probes end (tests, shutdown)."""
        return self._task.wait(timeout)

    def _probe(self, _report: Callable[[object], None]) -> tuple[str, str]:
        for worker in self.workers:
            status = probe_worker(parse_worker(worker), PROBE_TIMEOUT_SECONDS)
            if not status.reachable:
                return str(status.address), status.problem
        return "", ""

    def _on_done(self, result: object) -> None:
        assert isinstance(result, tuple)
        self.finished.emit(*result)
