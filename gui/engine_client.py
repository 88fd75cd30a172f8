"""The window's side of the engine process: a QProcess speaking the JSON-lines protocol.

Nothing here blocks: commands are written to the child's stdin, events arrive through
``readyReadStandardOutput`` on the main thread and are turned into typed signals. When the
child dies without being asked to (a native abort in llama.cpp, the OOM killer, a kill),
``crashed`` says so in one line, with the load that was under way and the step it had
reached (the child announces each risky step before it runs it); the window stays.
"""

from __future__ import annotations

import collections
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, Signal

from backends.engines.hardware import ComputeDevice
from backends.engines.interface import LoadReport
from backends.engines.load_guard import signal_name
from backends.service.protocol import (
    decode,
    encode,
    generate_command,
    load_command,
    stats_from_wire,
    tokens_from_wire,
    worker_reports,
)
from backends.service.tuning_memory import RememberedTuning

if TYPE_CHECKING:
    from collections.abc import Iterable

    from backends.service.protocol import GenerateRequest, LoadRequest

log = logging.getLogger("gui.engine")

STDERR_LINES_KEPT = 40
QUIT_GRACE_MS = 3000  # how long a quitting engine may take to free its models
FATAL_ERROR_PREFIX = "Fatal Python error:"  # faulthandler's first line after a native crash


@dataclass(frozen=True)
class PairReport:
    """What the engine process reported about the pair it loaded (its ``loaded`` event).

    The pair itself lives in that process (backends.service.loaded_pair.LoadedPair); the
    window only has this report of it.
    """

    main: LoadReport
    draft: LoadReport | None
    exact_batch_limit: int | None
    n_ctx: int
    method: str
    gpus: tuple[ComputeDevice, ...] = ()
    load_seconds: float = 0.0  # the whole load: models, probes, calibration
    calibration: tuple[str, ...] = ()  # auto's: how sure its costs are, the best it allows
    # The main model's batch costs auto measured at load: (size, seconds), by size.
    main_batch_seconds: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class LoadInFlight:
    """A load the engine process was asked for and has not finished: how far it got."""

    request: LoadRequest
    stage: str = ""  # the last load step the process announced (backends.engines.load_guard)
    model: str = ""  # the model that step was for

    @property
    def model_path(self) -> str:
        """The model being loaded when the process died (the main one before any step)."""
        return self.model or self.request.main_path


@dataclass(frozen=True)
class EngineDeath:
    """How the engine process died, and the load it was in the middle of."""

    cause: str  # e.g. "SIGSEGV: Segmentation fault", "exit code 1"
    loading: LoadInFlight | None = None


def engine_command() -> list[str]:
    """How to start the engine process: the frozen app runs it with a flag, else a module."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "--engine-server"]
    return [sys.executable, "-m", "backends.service.engine_server"]


def _report(raw: dict[str, Any]) -> LoadReport:
    return LoadReport(
        **{
            **raw,
            "notes": tuple(raw.get("notes", ())),
            "weight_buffers": tuple(raw.get("weight_buffers", ())),
            "layer_placement": tuple(
                (str(where), int(count)) for where, count in raw.get("layer_placement", ())
            ),
        }
    )


class EngineClient(QObject):
    """Drives one engine process.

    Signals:
        ready(list): the process started; the engines it has ("llama.cpp", "mlx").
        load_progress(float, str): loading, as a fraction in [0, 1] and what is happening.
        loaded(PairReport): the models are in memory.
        unloaded(): the models were freed.
        run_started(int, str, int): request id, run ("speculative" or "plain"), prompt tokens.
        tokens_arrived(int, str, list, SpeculationStats): one round's tokens and the stats.
        run_finished(int, str, list, SpeculationStats): the last tokens and the final stats.
        compared(int, object, object): request id, speedup (float or None), identical
            (bool, or None above temperature 0).
        failed(str, object): a one-line error, and the request id it ends (or None).
        crashed(str, object): the process ended without being asked to; a one-line
            message, and an EngineDeath (the cause, and the load under way if any).
        serving(bool, str, str): the local API is listening or not; its URL; why it is
            not when it was asked to (empty otherwise).
        api_started(int, int, int): an API request began: its id, prompt tokens, requests
            waiting behind it.
        api_tokens(int, list, SpeculationStats): one round of an API answer.
        api_finished(int, list, SpeculationStats): an API answer's last tokens and stats.
        api_failed(int, str): an API request ended with an error (sent to its client).
        api_queue(int): API requests waiting or running, after one ended.
        tune_progress(float, str): "Find my fastest setup" is running: fraction, what now.
        tuned(object, bool, bool, list): its result (a RememberedTuning, or None when
            only recalling found none), whether it was recalled instead of measured,
            whether it was cancelled, and what changed on the machine since a recalled
            result was measured.
    """

    ready = Signal(list)
    load_progress = Signal(float, str)
    loaded = Signal(object)
    unloaded = Signal()
    run_started = Signal(int, str, int)
    tokens_arrived = Signal(int, str, list, object)
    run_finished = Signal(int, str, list, object)
    compared = Signal(int, object, object)
    failed = Signal(str, object)
    crashed = Signal(str, object)
    serving = Signal(bool, str, str)
    api_started = Signal(int, int, int)
    api_tokens = Signal(int, list, object)
    api_finished = Signal(int, list, object)
    api_failed = Signal(int, str)
    api_queue = Signal(int)
    tune_progress = Signal(float, str)
    tuned = Signal(object, bool, bool, list)
    workers = Signal(object)  # tuple[WorkerReport, ...]: the main model's workers now

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._process: QProcess | None = None
        self._buffer = b""
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_LINES_KEPT)
        self._fatal_error = ""  # Python's "Fatal Python error: ..." line, however long the log
        self._log_buffer = b""
        self._stopping = False
        self._next_request_id = 1
        self.engines: list[str] = []
        self.load_in_flight: LoadInFlight | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the engine process is up."""
        return (
            self._process is not None and self._process.state() != QProcess.ProcessState.NotRunning
        )

    @property
    def pid(self) -> int | None:
        """The engine process's id (None when it is not running)."""
        if not self.running or self._process is None:
            return None
        pid = int(self._process.processId())
        return pid or None

    def start(self) -> None:
        """Start the engine process (a no-op when it runs)."""
        if self.running:
            return
        self._buffer = b""
        self._stderr_tail.clear()
        self._fatal_error = ""
        self._log_buffer = b""
        self._stopping = False
        process = QProcess(self)
        environment = QProcessEnvironment.systemEnvironment()
        environment.insert("PYTHONUNBUFFERED", "1")
        process.setProcessEnvironment(environment)
        process.readyReadStandardOutput.connect(self._read_events)
        process.readyReadStandardError.connect(self._read_log)
        process.finished.connect(self._on_finished)
        process.errorOccurred.connect(self._on_error)
        program, *arguments = engine_command()
        self._process = process
        process.start(program, arguments)

    def stop(self) -> None:
        """Ask the process to quit and wait briefly; kill it if it does not."""
        process = self._process
        if process is None or not self.running:
            return
        self._stopping = True
        self._send({"type": "quit"})
        process.closeWriteChannel()
        if not process.waitForFinished(QUIT_GRACE_MS):
            process.kill()
            process.waitForFinished(QUIT_GRACE_MS)

    def last_log_lines(self) -> list[str]:
        """What the engine process last wrote to its log (for crash reports)."""
        return list(self._stderr_tail)

    # -- commands ----------------------------------------------------------------------------

    def load(self, request: LoadRequest) -> None:
        """Load a model pair (starting the process if needed)."""
        self.start()
        self.load_in_flight = LoadInFlight(request)
        self._send(load_command(request))

    def unload(self) -> None:
        """Free the loaded models."""
        self._send({"type": "unload"})

    def generate(self, request: GenerateRequest) -> None:
        """Start answering; events carry ``request.request_id``."""
        self._send(generate_command(request))

    def new_request_id(self) -> int:
        """A fresh id for a generate request."""
        request_id = self._next_request_id
        self._next_request_id += 1
        return request_id

    def serve(self, port: int, host: str = "127.0.0.1", api_key: str | None = None) -> None:
        """Open the local API on the loaded pair (``serving`` says how it went)."""
        self.start()
        self._send({"type": "serve_start", "host": host, "port": port, "api_key": api_key})

    def stop_serving(self) -> None:
        """Close the local API."""
        self._send({"type": "serve_stop"})

    def tune(
        self,
        request_id: int,
        *,
        budget_seconds: float,
        drafts: list[str],
        prompts: list[str],
        again: bool = False,
        recall_only: bool = False,
    ) -> None:
        """Find the fastest setup for the loaded main model (``tuned`` has the result)."""
        self._send(
            {
                "type": "tune",
                "request_id": request_id,
                "budget_seconds": budget_seconds,
                "drafts": drafts,
                "prompts": prompts,
                "again": again,
                "recall_only": recall_only,
            }
        )

    def cancel(self) -> None:
        """Stop the running generation (its ``run_finished`` says ``cancelled``)."""
        self._send({"type": "cancel"})

    def _send(self, message: dict[str, Any]) -> None:
        if self._process is None or not self.running:
            self.failed.emit("the engine is not running; load a model first", None)
            return
        self._process.write(encode(message))

    # -- events ------------------------------------------------------------------------------

    def _read_events(self) -> None:
        if self._process is None:
            return
        self._buffer += bytes(self._process.readAllStandardOutput().data())
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                self._dispatch(decode(line))
            except (ValueError, KeyError, TypeError) as error:
                log.warning("unreadable engine event %r: %s", line[:120], error)

    def _dispatch(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "tokens":
            self.tokens_arrived.emit(
                event["request_id"],
                event["run"],
                tokens_from_wire(event["tokens"]),
                stats_from_wire(event["stats"]),
            )
        elif kind == "load_stage":
            if self.load_in_flight is not None:
                self.load_in_flight = LoadInFlight(
                    self.load_in_flight.request, str(event["stage"]), str(event["model"])
                )
        elif kind == "load_progress":
            self.load_progress.emit(float(event["fraction"]), str(event["message"]))
        elif kind == "started":
            self.run_started.emit(event["request_id"], event["run"], event["prompt_tokens"])
        elif kind == "finished":
            self.run_finished.emit(
                event["request_id"],
                event["run"],
                tokens_from_wire(event["tokens"]),
                stats_from_wire(event["stats"]),
            )
        elif kind == "compared":
            self.compared.emit(event["request_id"], event["speedup"], event["identical"])
        elif kind == "loaded":
            self.load_in_flight = None
            draft = event["draft"]
            self.loaded.emit(
                PairReport(
                    main=_report(event["main"]),
                    draft=_report(draft) if draft is not None else None,
                    exact_batch_limit=event["exact_batch_limit"],
                    n_ctx=int(event["n_ctx"]),
                    method=str(event["method"]),
                    gpus=tuple(ComputeDevice(**gpu) for gpu in event.get("gpus", ())),
                    load_seconds=float(event.get("seconds", 0.0)),
                    calibration=tuple(str(note) for note in event.get("calibration", ())),
                    main_batch_seconds=tuple(
                        sorted(
                            (int(size), float(seconds))
                            for size, seconds in event.get("main_batch_seconds", {}).items()
                        )
                    ),
                )
            )
        elif kind == "unloaded":
            self.unloaded.emit()
        elif kind == "serving":
            self.serving.emit(
                bool(event["listening"]), str(event.get("url") or ""), str(event.get("error") or "")
            )
        elif kind == "api_started":
            self.api_started.emit(event["api_id"], event["prompt_tokens"], event["queued"])
        elif kind in ("api_tokens", "api_finished"):
            signal = self.api_tokens if kind == "api_tokens" else self.api_finished
            signal.emit(
                event["api_id"], tokens_from_wire(event["tokens"]), stats_from_wire(event["stats"])
            )
        elif kind == "api_failed":
            self.api_failed.emit(event["api_id"], str(event["message"]))
        elif kind == "api_queue":
            self.api_queue.emit(int(event["queued"]))
        elif kind == "tune_progress":
            self.tune_progress.emit(float(event["fraction"]), str(event["message"]))
        elif kind == "tuned":
            result = event["result"]
            self.tuned.emit(
                RememberedTuning.from_json(result) if result is not None else None,
                bool(event["recalled"]),
                bool(event["cancelled"]),
                [str(change) for change in event.get("changes", ())],
            )
        elif kind == "error":
            if event.get("request_id") is None:
                self.load_in_flight = None  # a load (or unload) that failed cleanly
            self.failed.emit(str(event["message"]), event.get("request_id"))
        elif kind == "workers":
            self.workers.emit(worker_reports(event))
        elif kind == "ready":
            self.engines = list(event["engines"])
            self.ready.emit(self.engines)
        else:
            log.warning("unknown engine event %r", kind)

    def _read_log(self, *, final: bool = False) -> None:
        if self._process is None:
            return
        # Output arrives in chunks that may end mid-line: keep the unfinished line.
        self._log_buffer += bytes(self._process.readAllStandardError().data())
        *complete, self._log_buffer = self._log_buffer.split(b"\n")
        if final:
            complete, self._log_buffer = [*complete, self._log_buffer], b""
        for raw in complete:
            line = raw.decode("utf-8", "replace")
            if line.strip():
                self._stderr_tail.append(line.rstrip())
                if line.startswith(FATAL_ERROR_PREFIX):
                    self._fatal_error = line.strip()
                log.debug("engine: %s", line.rstrip())

    def _on_finished(self, exit_code: int, status: QProcess.ExitStatus) -> None:
        self._read_events()
        self._read_log(final=True)
        loading, self.load_in_flight = self.load_in_flight, None
        if self._stopping:
            return
        if status == QProcess.ExitStatus.CrashExit:
            how, cause = f"crashed ({signal_name(exit_code)})", signal_name(exit_code)
        else:
            how = cause = f"exited with code {exit_code}"
        detail = crash_detail([*self._stderr_tail, self._fatal_error])[-200:]
        message = f"the engine process {how}"
        if detail:
            message += f": {detail}"
            cause += f": {detail}"
        self.crashed.emit(message, EngineDeath(cause, loading))

    def _on_error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            loading, self.load_in_flight = self.load_in_flight, None
            message = f"the engine process could not start ({' '.join(engine_command())})"
            self.crashed.emit(message, EngineDeath(message, loading))


def crash_detail(log_lines: Iterable[str]) -> str:
    """What a dead engine's last log lines say: Python's fatal-error line, else the last line."""
    lines = [line.strip() for line in log_lines if line.strip()]
    for line in reversed(lines):
        if line.startswith(FATAL_ERROR_PREFIX):
            return line.removeprefix(FATAL_ERROR_PREFIX).strip()
    return lines[-1] if lines else ""
