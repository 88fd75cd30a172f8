"""The engine process: loads models and generates, speaking the JSON-lines protocol on stdio.

Run as ``python -m backends.service.engine_server``. The window starts it as a child process, so
that a native crash in llama.cpp (which can abort the whole process) costs a message and a
reload, never the window or the chat. Loading, answering, comparing and tuning are the pair
service's (:mod:`backends.service.loaded_pair`); this module turns commands into its calls
and what they produce into events. Commands arrive on stdin (see
:mod:`backends.service.protocol`); a reader thread takes them, so ``cancel`` reaches a
running generation at once, while loading and generating run one at a time on the main
thread. Events go to the original stdout; anything native code prints is sent to stderr,
so it can never corrupt the protocol.

Events: ``ready``, ``load_stage`` (a risky step of a load begins: if the process dies
now, the window knows where), ``load_progress``, ``loaded``, ``unloaded``, ``started``,
``tokens`` (one per round, with the stats so far), ``finished``, ``compared``, ``error``,
``workers`` (after a load and each answer, when the main model has llama.cpp RPC workers:
each reachable or gone, its memory and layers).

"Find my fastest setup" (``tune``; events ``tune_progress``, ``tuned``) runs every setup
on the loaded main model, like an answer: a crash is the crash-recovery path, ``cancel``
stops it, and the loaded pair is left as it was (trial drafts are loaded beside it and
closed after; the loaded draft is reused, not loaded twice).

The local API (``serve_start`` / ``serve_stop``; event ``serving``) listens from a thread
of its own on the loaded pair: each request becomes a command in the same queue as the
window's, so it waits its turn on the one engine, and the window hears of it as it runs
(``api_started``, ``api_tokens``, ``api_finished``, ``api_failed``).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import queue
import sys
import threading
import time
import weakref
from dataclasses import asdict
from typing import IO, TYPE_CHECKING, Any, NoReturn

from backends.engines.load_guard import add_stage_listener
from backends.engines.selection import installed_engines
from backends.errors import SettingsError, SpecDeckError
from backends.models.catalog import read_catalog_model
from backends.service.api.app import DEFAULT_HOST, DEFAULT_PORT, ApiServer, ServerSettings
from backends.service.api.errors import ApiError
from backends.service.api.host import ApiHost
from backends.service.api.jobs import RequestCounts, ServedModel, job_failed
from backends.service.api.worker import run_job
from backends.service.loaded_pair import LoadedPair, open_pair
from backends.service.protocol import (
    GenerateRequest,
    LoadRequest,
    WorkerReport,
    decode,
    encode,
    parse_generate,
    parse_load,
    stats_to_wire,
    tokens_to_wire,
)
from backends.service.tuning import DEFAULT_BUDGET_SECONDS, trial_prompts

if TYPE_CHECKING:
    from collections.abc import Callable

    from backends.engines.hardware import ComputeDevice
    from backends.service.api.jobs import ApiJob
    from backends.service.protocol import RunKind
    from backends.speculation.methods import SpeculationMethod
    from backends.speculation.types import GenerationUpdate, SpeculationStats

log = logging.getLogger("backends.service.engine_server")

PROGRESS_EVENT_INTERVAL = 0.1  # seconds between load_progress events


class EngineServer:
    """Executes commands one at a time and writes events; ``serve()`` runs until ``quit``."""

    def __init__(self, events: IO[bytes]) -> None:
        self._events = events
        self._write_lock = threading.Lock()
        self._commands: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._cancel = threading.Event()
        self._pair: LoadedPair | None = None
        self._loading = False
        self._api: ApiHost | None = None
        self._api_backend = _EngineBackend(self)
        self._next_api_id = 1
        add_stage_listener(self._on_load_stage)

    def _on_load_stage(self, stage: str, model: str) -> None:
        self.emit("load_stage", stage=stage, model=model)

    # -- output ------------------------------------------------------------------------------

    def emit(self, event_type: str, **fields: Any) -> None:
        """Write one event line (from any thread)."""
        line = encode({"type": event_type, **fields})
        with self._write_lock:
            try:
                self._events.write(line)
                self._events.flush()
            except (BrokenPipeError, ValueError):
                # The window is gone; nothing is left to tell.
                self._commands.put(None)

    def _error(self, message: str, request_id: int | None = None) -> None:
        self.emit("error", message=" ".join(message.split()), request_id=request_id)

    # -- input -------------------------------------------------------------------------------

    def read_commands(self, stream: IO[bytes]) -> None:
        """Reader thread: queue commands; act on ``cancel`` and ``quit`` at once."""
        for raw in stream:
            if not raw.strip():
                continue
            try:
                command = decode(raw)
            except ValueError as error:
                self._error(f"engine process: unreadable command ({error})")
                continue
            if command["type"] in ("cancel", "quit"):
                self._cancel.set()
            if command["type"] != "cancel":
                self._commands.put(command)
        self._cancel.set()  # stdin closed: the window is gone
        self._commands.put(None)

    def serve(self, stream: IO[bytes]) -> None:
        """Run commands until ``quit`` or the end of input."""
        reader = threading.Thread(
            target=self.read_commands, args=(stream,), name="commands", daemon=True
        )
        reader.start()
        self.emit("ready", pid=os.getpid(), engines=installed_engines())
        try:
            while True:
                command = self._commands.get()
                if command is None or command["type"] == "quit":
                    break
                self._run(command)
        finally:
            self._stop_serving()
            self._unload()

    def _run(self, command: dict[str, Any]) -> None:
        kind = command["type"]
        if kind == "api_job":
            self._api_job(command["job"])
            return
        request_id = command.get("request_id")
        try:
            if kind == "load":
                self._load(parse_load(command))
            elif kind == "serve_start":
                self._start_serving(command)
            elif kind == "serve_stop":
                self._stop_serving()
                self.emit("serving", listening=False, url=None, error=None)
            elif kind == "unload":
                self._unload()
                self.emit("unloaded")
            elif kind == "generate":
                self._generate(parse_generate(command))
            elif kind == "tune":
                self._tune(command)
            else:
                self._error(f"engine process: unknown command {kind!r}", request_id)
        except SpecDeckError as error:
            self._error(str(error), request_id)
        except (KeyError, TypeError, ValueError) as error:
            log.exception("bad %s command", kind)
            self._error(f"engine process: malformed {kind} command ({error})", request_id)
        except MemoryError:
            self._error("out of memory: unload models or choose smaller ones", request_id)
        except Exception as error:  # noqa: BLE001 - the process must answer, not die
            log.exception("%s failed", kind)
            self._error(f"{kind} failed: {type(error).__name__}: {error}", request_id)
        if kind == "generate":
            self._emit_workers()  # after the answer (or its error): how the workers are now

    def _progress_events(self, event_type: str) -> Callable[[float, str], None]:
        """A progress callback that emits ``event_type``: at a new step, else every 0.1 s."""
        last_sent, last_message = 0.0, ""

        def progress(fraction: float, message: str) -> None:
            nonlocal last_sent, last_message
            now = time.monotonic()
            if now - last_sent >= PROGRESS_EVENT_INTERVAL or message != last_message:
                last_sent, last_message = now, message
                self.emit(event_type, fraction=round(fraction, 4), message=message)

        return progress

    # -- commands ----------------------------------------------------------------------------

    def _load(self, request: LoadRequest) -> None:
        started = time.perf_counter()
        self._unload()
        progress = self._progress_events("load_progress")
        self._loading = True
        try:
            pair = open_pair(request, progress)
        finally:
            self._loading = False
        self._pair = pair
        main, draft = pair.main, pair.draft
        self.emit(
            "loaded",
            main=asdict(main.load_report),
            draft=asdict(draft.load_report) if draft is not None else None,
            exact_batch_limit=main.exact_batch_limit,
            n_ctx=main.n_ctx,
            method=request.method,
            gpus=[asdict(device) for device in _gpus(request)],
            # auto's calibration: how sure, and what speculation can gain here at best.
            calibration=pair.calibration_notes(),
            # The main model's batch costs auto measured ({size: seconds}; {} for another
            # method): the Download dialog ranks drafts with them.
            main_batch_seconds=pair.main_batch_seconds(),
            # Everything the user waited for: both models, probes and the auto calibration.
            seconds=time.perf_counter() - started,
        )
        self._emit_workers()

    def _emit_workers(self) -> None:
        """Tell the window how the main model's workers are (nothing without workers)."""
        pair = self._pair
        if pair is None or not pair.request.workers:
            return
        layers = dict(pair.main.load_report.layer_placement)
        reports = [
            WorkerReport(
                str(status.address),
                status.reachable,
                status.problem,
                status.memory_free,
                status.memory_total,
                layers.get(f"worker {status.address}", 0),
            )
            for status in pair.main.worker_statuses()
        ]
        self.emit("workers", workers=[asdict(report) for report in reports])

    # -- the local API ------------------------------------------------------------------------

    def _start_serving(self, command: dict[str, Any]) -> None:
        """Open the OpenAI-compatible API on the loaded pair (``serving`` says how it went)."""
        self._stop_serving()
        settings = ServerSettings(
            host=str(command.get("host", DEFAULT_HOST)),
            port=int(command.get("port", DEFAULT_PORT)),
            api_key=command.get("api_key") or None,
        )
        host = ApiHost(ApiServer(self._api_backend, settings))
        try:
            url = host.start()
        except OSError as error:
            self.emit("serving", listening=False, url=None, error=error.strerror or str(error))
            return
        self._api = host
        self.emit("serving", listening=True, url=url, error=None)

    def _stop_serving(self) -> None:
        if self._api is not None:
            self._api.stop()
            self._api = None

    def queue_api_job(self, job: ApiJob) -> None:
        """From the API's thread: the job waits its turn with the window's commands."""
        self._commands.put({"type": "api_job", "job": job})

    def _api_job(self, job: ApiJob) -> None:
        """Answer an API request on the loaded pair; the window hears of it as it runs."""
        api_id, self._next_api_id = self._next_api_id, self._next_api_id + 1
        started = False

        def observe(prompt_tokens: int, update: GenerationUpdate) -> None:
            nonlocal started
            if not started:
                started = True
                self.emit(
                    "api_started",
                    api_id=api_id,
                    prompt_tokens=prompt_tokens,
                    queued=self._api_backend.counts.queued,
                )
            kind = "api_finished" if update.finished else "api_tokens"
            self.emit(
                kind,
                api_id=api_id,
                tokens=tokens_to_wire(update.tokens),
                stats=stats_to_wire(update.stats),
            )

        stats: SpeculationStats | None = None
        try:
            pair = self._pair
            if pair is None:
                raise ApiError(503, NO_MODEL_FOR_API, error_type="server_error")
            stats = run_job(pair, job, pair.request.method, observe)
        except BaseException as error:  # noqa: BLE001 - the client gets its error; we go on
            if not isinstance(error, SpecDeckError | ApiError):
                log.exception("an API request failed")
            failure = job_failed(error)
            job.deliver(failure)
            self.emit("api_failed", api_id=api_id, message=failure.error.message)
        finally:
            self._api_backend.counts.finished(stats)
            self.emit("api_queue", queued=self._api_backend.counts.queued)

    def _unload(self) -> None:
        if self._pair is not None:
            self._pair.close()
            self._pair = None

    def _loaded_pair(self) -> LoadedPair:
        if self._pair is None:
            raise SettingsError("no model is loaded; load a main model first")
        return self._pair

    def _generate(self, request: GenerateRequest) -> None:
        pair = self._loaded_pair()
        self._cancel.clear()
        answer = pair.answer(
            request.messages,
            request.settings,
            method=request.method,
            compare=request.compare,
            observer=_RunEvents(self, request.request_id),
            cancel=self._cancel,
            context_policy=request.context_policy,
        )
        comparison = answer.comparison
        if comparison is not None:
            self.emit(
                "compared",
                request_id=request.request_id,
                speedup=comparison.speedup,
                identical=comparison.identical,
            )

    def _tune(self, command: dict[str, Any]) -> None:
        """Find the fastest setup for the loaded main model (or recall the remembered one)."""
        pair = self._loaded_pair()
        self._cancel.clear()
        recall = pair.recall_tuning()
        if command.get("recall_only") or (
            recall is not None and recall.current and not command.get("again")
        ):
            self.emit(
                "tuned",
                result=recall.tuning.to_json() if recall is not None else None,
                changes=list(recall.changes) if recall is not None else [],
                recalled=True,
                cancelled=False,
            )
            return
        run = pair.tune(
            [read_catalog_model(path) for path in command.get("drafts", [])],
            trial_prompts(command.get("prompts", [])),
            budget_seconds=float(command.get("budget_seconds", DEFAULT_BUDGET_SECONDS)),
            progress=self._progress_events("tune_progress"),
            cancel=self._cancel,
        )
        self.emit(
            "tuned",
            result=run.tuning.to_json(),
            changes=[],
            recalled=False,
            cancelled=run.cancelled,
        )


class _RunEvents:
    """An answer's runs as events: ``started``, ``tokens`` per round, ``finished``."""

    def __init__(self, server: EngineServer, request_id: int) -> None:
        self._server = server
        self._request_id = request_id

    def run_started(self, run: RunKind, prompt_tokens: int) -> None:
        self._server.emit(
            "started", request_id=self._request_id, run=run, prompt_tokens=prompt_tokens
        )

    def round_done(self, run: RunKind, update: GenerationUpdate) -> None:
        self._server.emit(
            "finished" if update.finished else "tokens",
            request_id=self._request_id,
            run=run,
            tokens=tokens_to_wire(update.tokens),
            stats=stats_to_wire(update.stats),
        )


NO_MODEL_FOR_API = "no model is loaded; load one in SpecDeck's window first"


class _EngineBackend:
    """The API's view of the engine process: its loaded pair, its one command queue."""

    def __init__(self, server: EngineServer) -> None:
        self._server = server
        self.counts = RequestCounts()
        # What the API says of each model of the loaded pair, made once per pair (it
        # tokenizes the tool-call markers): {"main" or "draft": (the pair, its model)}. The
        # pair is held weakly: an unloaded pair's models are not kept alive by this cache.
        self._served: dict[str, tuple[weakref.ref[LoadedPair], ServedModel | None]] = {}

    def _model(self, which: str) -> ServedModel | None:
        pair = self._server._pair
        if pair is None:
            return None
        cached = self._served.get(which)
        if cached is not None and cached[0]() is pair:
            return cached[1]
        engine = pair.main if which == "main" else pair.draft
        path = pair.request.main_path if which == "main" else pair.request.draft_path
        served = None if engine is None or path is None else ServedModel.of_engine(path, engine)
        self._served[which] = (weakref.ref(pair), served)
        return served

    @property
    def main(self) -> ServedModel | None:
        return self._model("main")

    @property
    def draft(self) -> ServedModel | None:
        return self._model("draft")

    @property
    def n_ctx(self) -> int:
        pair = self._server._pair
        return pair.main.n_ctx if pair is not None else 0

    @property
    def method(self) -> SpeculationMethod:
        pair = self._server._pair
        return pair.request.method if pair is not None else "auto"

    @property
    def unavailable(self) -> str | None:
        if self._server._loading:
            return "the models are loading"
        if self._server._pair is None:
            return NO_MODEL_FOR_API
        return None

    def submit(self, job: ApiJob) -> None:
        problem = self.unavailable
        if problem is not None:
            raise ApiError(503, problem, error_type="server_error")
        self.counts.admit()
        self._server.queue_api_job(job)


def _gpus(request: LoadRequest) -> tuple[ComputeDevice, ...]:
    """The GPUs and their free memory after loading (llama.cpp reports them; MLX does not)."""
    if request.engine != "llama.cpp":
        return ()
    from backends.engines.hardware import gpu_devices

    return gpu_devices()


def main() -> NoReturn:
    """Serve the protocol on stdio; native output is moved to stderr first.

    Works on file descriptors, not ``sys.stdout``: a windowed Windows build has no
    ``sys.stdout`` object even when its standard handles are the window's pipes.
    """
    if sys.stderr is None:
        sys.stderr = os.fdopen(2, "w", encoding="utf-8", errors="replace", buffering=1)
    # A native crash leaves "Fatal Python error: Segmentation fault" and where it happened
    # in the log, which the window shows.
    faulthandler.enable(sys.stderr, all_threads=False)
    # When llama.cpp aborts (a worker lost mid-answer), its own message is the last line,
    # not a debugger's backtrace.
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    events = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    commands = sys.stdin.buffer if sys.stdin is not None else os.fdopen(0, "rb")
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    logging.getLogger("backends.engines.llama.native").setLevel(logging.ERROR)
    server = EngineServer(events)
    server.serve(commands)
    logging.shutdown()
    # The reader thread may still be blocked on stdin; interpreter shutdown would wait on
    # its lock and abort, so leave at once (events are unbuffered, models already freed).
    os._exit(0)


if __name__ == "__main__":
    main()
