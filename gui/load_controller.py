"""Loading a pair in the engine process, and what the window does when that process dies.

:class:`LoadController` reads the model folders (off the GUI thread) for the sidebar's
pickers, sends the loads, follows them to the end and owns every state the
engine process can leave the window in: a crash while loading (recorded, then retried once
with the safest settings, as :func:`backends.engines.load_guard.after_load_crash` decides),
a crash at any other time (Reload loads the last pair in a fresh process) and a lost
llama.cpp RPC worker (Reload loads the pair without it). Where it stands is one
:class:`LoadState`, replaced whole by its named transitions; the window draws the crash
banner from it.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from backends.engines.load_guard import (
    SAFEST_DESCRIPTION,
    CrashRecords,
    LoadRefusedError,
    after_load_crash,
)
from backends.errors import SpecDeckError
from backends.models.catalog import CatalogScan, default_model_folders, scan_models
from backends.service.loaded_pair import crash_safe_request
from gui.background import BackgroundTask
from gui.engine_client import EngineDeath, PairReport
from gui.settings_to_backends import extra_model_folders
from gui.status_bar import gpu_summary
from gui.worker_loss import WorkerProbe, mentions_rpc_failure

if TYPE_CHECKING:
    from backends.service.protocol import LoadRequest
    from gui.engine_client import EngineClient
    from gui.settings import AppSettings
    from gui.sidebar import Sidebar
    from gui.status_bar import ResourceStatusBar

log = logging.getLogger("gui.load")

NO_MODEL_LOADED = "No model loaded"
KEPT_TEXT = "The text above was kept."  # ends the error of an answer the engine took with it


class LoadPhase(enum.Enum):
    """Where the pair and the engine process stand."""

    NO_PAIR = "no pair"  # nothing loaded: not yet, unloaded, or a load that ended without one
    LOADING = "loading"  # the engine process is loading a pair (perhaps the safe retry)
    LOADED = "loaded"  # the engine process holds a pair
    ENGINE_DIED = "engine died"  # the process died; Reload (when offered) loads again
    CHECKING_WORKERS = "checking workers"  # it died with the main model on workers: which left?
    WORKER_LOST = "worker lost"  # a worker went away; Reload loads the pair without it


@dataclass(frozen=True)
class LoadState:
    """Where loading stands, and the one line the window shows about it.

    Never edited: each transition returns a new state.
    """

    phase: LoadPhase = LoadPhase.NO_PAIR
    pair: PairReport | None = None  # what the engine process holds (LOADED, WORKER_LOST)
    notes: tuple[str, ...] = ()  # LOADING: why the load differs from what was asked
    retrying_after: str = ""  # LOADING: the crash this load is the safest-settings retry of
    probe: WorkerProbe | None = None  # CHECKING_WORKERS: the probe asking the workers
    # A worker of the last load that went away: Reload leaves it out (until the next load).
    lost_worker: str = ""
    # The engine process lost a worker and keeps llama.cpp's leftovers of that link: the
    # next load starts a fresh process.
    restart_engine: bool = False
    banner: str = ""  # the line over the chat ("" hides the banner)
    offer_reload: bool = False  # the banner's Reload button is shown

    def load_begun(self, notes: tuple[str, ...] = (), retrying_after: str = "") -> LoadState:
        """A load was sent; a retry keeps the banner that announced it, and the lost worker."""
        if retrying_after:
            return replace(
                self,
                phase=LoadPhase.LOADING,
                pair=None,
                notes=notes,
                retrying_after=retrying_after,
                probe=None,
                restart_engine=False,
            )
        return LoadState(LoadPhase.LOADING, notes=notes)

    def load_refused(self, retrying_after: str = "") -> LoadState:
        """The crash records refused the load before it was sent."""
        begun = self.load_begun((), retrying_after)
        return replace(begun, phase=LoadPhase.NO_PAIR, retrying_after="", banner="")

    def pair_loaded(self, pair: PairReport) -> LoadState:
        """The engine process reported the pair in memory; a retry that worked says so."""
        state = replace(self, phase=LoadPhase.LOADED, pair=pair, notes=(), retrying_after="")
        if not self.retrying_after:
            return state
        banner = (
            f"{self.retrying_after}. Loaded again with the safest settings ({SAFEST_DESCRIPTION})."
        )
        return replace(state, banner=banner, offer_reload=False)  # nothing left to reload

    def pair_unloaded(self) -> LoadState:
        """The engine process freed the pair."""
        phase = LoadPhase.NO_PAIR if self.phase is LoadPhase.LOADED else self.phase
        return replace(self, phase=phase, pair=None)

    def load_failed(self) -> LoadState:
        """The engine process ended a load (or a command) with an error, and lives on."""
        if self.phase is not LoadPhase.LOADING:
            return self
        return replace(self, phase=LoadPhase.NO_PAIR, notes=(), retrying_after="")

    def load_crashed(self, banner: str, retrying_after: str) -> LoadState:
        """The engine process died while loading; ``retrying_after``: "" when it gives up."""
        return replace(
            self,
            phase=LoadPhase.ENGINE_DIED,
            pair=None,
            notes=(),
            retrying_after=retrying_after,
            banner=banner,
            offer_reload=False,
        )

    def engine_died(self, banner: str, *, offer_reload: bool) -> LoadState:
        """The engine process died, not for its settings (or the workers all answer)."""
        return replace(
            self,
            phase=LoadPhase.ENGINE_DIED,
            pair=None,
            notes=(),
            retrying_after="",
            probe=None,
            banner=banner,
            offer_reload=offer_reload,
        )

    def checking_workers(self, banner: str, probe: WorkerProbe) -> LoadState:
        """The engine process died with its main model on workers; ``probe`` asks them."""
        return replace(
            self,
            phase=LoadPhase.CHECKING_WORKERS,
            pair=None,
            notes=(),
            retrying_after="",
            probe=probe,
            banner=banner,
            offer_reload=False,
        )

    def worker_lost(self, worker: str, banner: str) -> LoadState:
        """``worker`` went away (the engine may live on, holding the pair)."""
        return replace(
            self,
            phase=LoadPhase.WORKER_LOST,
            probe=None,
            lost_worker=worker,
            restart_engine=True,
            banner=banner,
            offer_reload=True,
        )

    def dismissed(self) -> LoadState:
        """The banner was closed (by Reload)."""
        return replace(self, banner="")


class LoadController(QObject):
    """Loads pairs in the engine process and handles its crashes and lost workers.

    It drives the sidebar's load widgets and the status bar's engine lines; the window
    draws the crash banner from ``state_changed``.

    Signals:
        scanned(CatalogScan): the model folders were read (the sidebar has the models).
        state_changed(LoadState): the state after a transition.
        loaded(PairReport): the engine process reported a loaded pair.
        gave_up(str): a load ended without models and nothing more will be tried (an
            error, a refusal, or a crash with the safest settings); the one-line reason.
        engine_lost(str): the engine process died with what it was answering; the
            one-line error to end that answer with.
    """

    scanned = Signal(object)
    state_changed = Signal(object)
    loaded = Signal(object)
    gave_up = Signal(str)
    engine_lost = Signal(str)

    def __init__(
        self,
        client: EngineClient,
        settings: AppSettings,
        sidebar: Sidebar,
        status: ResourceStatusBar,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.client = client
        self.settings = settings
        self.sidebar = sidebar
        self.status = status
        self.crash_records = CrashRecords()
        self.state = LoadState()
        self.last_load: LoadRequest | None = None  # as the user asked for it
        self.catalog: CatalogScan | None = None  # the models found, once the folders are read
        self._scan_task: BackgroundTask | None = None
        self._load_after_scan = False
        client.load_progress.connect(sidebar.set_load_progress)
        client.loaded.connect(self._on_loaded)
        client.unloaded.connect(self._on_unloaded)
        client.crashed.connect(self._on_crashed)
        client.workers.connect(self._on_workers)

    @property
    def pair(self) -> PairReport | None:
        """What the engine process holds, as it reported it (None: no pair)."""
        return self.state.pair

    def _set(self, state: LoadState) -> None:
        self.state = state
        self.state_changed.emit(state)

    # -- the model folders -----------------------------------------------------------------

    def rescan(self) -> None:
        """Read the model folders on a worker thread and fill the sidebar's pickers."""
        folders = default_model_folders()
        for path in extra_model_folders(self.settings):
            if path.is_dir() and path not in folders:
                folders.append(path)
        task = self._scan_task = BackgroundTask(lambda _report: scan_models(folders), self)
        task.succeeded.connect(self._on_scanned)
        task.failed.connect(self.sidebar.show_error)
        task.start()

    def wait_for_scan(self, timeout: float) -> None:
        """Block until the folders are read, at most ``timeout`` seconds (on quitting)."""
        if self._scan_task is not None:
            self._scan_task.wait(timeout)

    def load_when_scanned(self) -> None:
        """Load the sidebar's selected pair as soon as the model folders have been read."""
        if self.catalog is not None:
            self._load_selected_pair()
        else:
            self._load_after_scan = True

    def _load_selected_pair(self) -> None:
        try:
            request = self.sidebar.load_request()
        except SpecDeckError as error:
            self.sidebar.show_error(str(error))
            return
        self.load(request)

    def _on_scanned(self, scan: object) -> None:
        assert isinstance(scan, CatalogScan)
        self.catalog = scan
        self.sidebar.set_catalog(scan)
        self.scanned.emit(scan)
        if self._load_after_scan and scan.models:
            self._load_after_scan = False
            self._load_selected_pair()

    # -- what the user asks for ------------------------------------------------------------

    def load(self, request: LoadRequest, *, retrying_after: str = "") -> None:
        """Load ``request`` in the engine process (``retrying_after``: the crash it retries).

        Settings that crashed the engine for one of these models on this CPU are replaced
        by the safest ones (and the load report says why); a pair that crashed even so is
        refused with a one-line message.
        """
        self.last_load = request
        self.status.set_workers(())
        if self.state.restart_engine:
            self.client.stop()
        self.sidebar.clear_error()
        try:
            safe_request, note = crash_safe_request(request, self.crash_records)
        except LoadRefusedError as error:
            self.sidebar.set_loading(False)
            self.sidebar.set_unloaded()
            self.sidebar.show_error(str(error))
            self._set(self.state.load_refused(retrying_after))
            self.gave_up.emit(str(error))
            return
        self._set(self.state.load_begun((note,) if note else (), retrying_after))
        self.sidebar.set_loading(True, request)
        self.client.load(safe_request)
        self.status.set_engine_pid(self.client.pid)

    def reload(self) -> None:
        """Load the last pair again, in a fresh engine process after a crash.

        After a lost worker: the pair without that worker (the Workers setting follows), in
        a fresh engine process (the old one holds what llama.cpp kept of the lost link).
        """
        self._set(self.state.dismissed())
        if self.last_load is None:
            return
        request = self.last_load
        if self.state.lost_worker:
            request = request.without_worker(self.state.lost_worker)
            self.settings.set("workers", ", ".join(request.workers))
            self.settings.set("layer_split", "")
        self.load(request)

    def report_error(self, message: str) -> None:
        """The engine process ended a load or a command with ``message`` (not an answer)."""
        if self.pair is None:
            self.sidebar.set_loading(False)
            self.sidebar.set_unloaded()
            self._set(self.state.load_failed())
            self.gave_up.emit(message)
        self.sidebar.show_error(message)

    # -- what the engine process says ------------------------------------------------------

    def _on_loaded(self, pair: object) -> None:
        assert isinstance(pair, PairReport)
        notes = self.state.notes
        self._set(self.state.pair_loaded(pair))
        self.sidebar.set_loaded(
            pair.main,
            pair.draft,
            pair.load_seconds or None,
            extra_notes=(*notes, *pair.calibration),
        )
        self.status.set_engine_pid(self.client.pid)
        self.status.set_gpu(gpu_summary(pair))
        self.loaded.emit(pair)

    def _on_unloaded(self) -> None:
        self._set(self.state.pair_unloaded())
        self.status.set_workers(())
        self.sidebar.set_unloaded()
        self.status.set_gpu(NO_MODEL_LOADED)

    def _on_workers(self, reports: object) -> None:
        """The engine says how the main model's workers are: status bar, and a lost one."""
        assert isinstance(reports, tuple)
        self.status.set_workers(reports)
        lost = [report for report in reports if not report.reachable]
        if lost and self.last_load is not None:
            worker = lost[0].address
            text = f"Worker {worker} is {lost[0].problem}: the main model cannot answer without it."
            self._set(self.state.worker_lost(worker, text))

    def _on_crashed(self, message: str, death: object) -> None:
        assert isinstance(death, EngineDeath)
        self.status.set_workers(())
        on_workers = self.last_load is not None and bool(self.last_load.workers)
        lost_link = on_workers and mentions_rpc_failure(self.client.last_log_lines())
        if death.loading is not None and not lost_link:
            self._on_load_crashed(death)
            return
        self._forget_dead_engine()
        self.sidebar.set_loading(False)
        self.sidebar.set_unloaded()
        if on_workers:
            # No load crash to remember: a worker went away (or may have); say which.
            self._find_lost_worker(message, while_loading=death.loading is not None)
            return
        self._set(self.state.engine_died(message, offer_reload=self.last_load is not None))
        self.engine_lost.emit(f"{message}. {KEPT_TEXT}")

    def _forget_dead_engine(self) -> None:
        self.status.set_engine_pid(None)
        self.status.set_gpu(NO_MODEL_LOADED)

    def _on_load_crashed(self, death: EngineDeath) -> None:
        """Record the crash; retry once with the safest settings unless those crashed."""
        loading = death.loading
        assert loading is not None
        self._forget_dead_engine()
        verdict = after_load_crash(
            self.crash_records,
            loading.model_path,
            loading.request.risky,
            loading.stage,
            death.cause,
            retried=bool(self.state.retrying_after),
        )
        log.info("%s", verdict.announcement)
        crash = verdict.line[0].upper() + verdict.line[1:]
        retry = verdict.retry and self.last_load is not None
        if retry:
            text = f"{crash}. Retrying once with the safest settings ({SAFEST_DESCRIPTION})."
        else:
            text = (
                f"{crash}. Nothing safer is left to try: SpecDeck will not load it this way again."
            )
        if retry and self.last_load is not None:
            self._set(self.state.load_crashed(text, retrying_after=crash))
            # The records now hold the crash: the same request loads with the safest settings.
            self.load(self.last_load, retrying_after=crash)
            return
        self.sidebar.set_loading(False)
        self.sidebar.set_unloaded()
        self._set(self.state.load_crashed(text, retrying_after=""))
        self.gave_up.emit(text)

    def _find_lost_worker(self, message: str, while_loading: bool) -> None:
        """The engine died with its main model on workers: name the one that went away."""
        assert self.last_load is not None
        probe = WorkerProbe(self.last_load.workers, self)
        self._set(self.state.checking_workers(f"{message}. Checking the workers…", probe))

        def found(worker: str, problem: str) -> None:
            if self.state.probe is not probe:
                return  # another load began meanwhile
            if worker:
                what = "while loading" if while_loading else "mid-answer"
                text = f"Worker {worker} stopped answering {what} ({problem})"
                self._set(self.state.worker_lost(worker, f"{text}."))
            else:  # every worker answers: the engine died of something else
                text = f"{message[0].upper()}{message[1:]}"
                self._set(self.state.engine_died(text, offer_reload=self.last_load is not None))
            self.engine_lost.emit(f"{text}. {KEPT_TEXT}")

        probe.finished.connect(found)
        probe.start()
