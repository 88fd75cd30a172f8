"""The load controller's states and transitions, against a scripted engine client.

No engine process runs here: :class:`_ScriptedClient` records the loads it is sent and the
tests emit its signals as the engine process would (a crash while loading, a lost worker),
so every path of the crash and worker-loss handling runs in the quick tier. The real
engine's deaths are in test_load_crash_recovery.py and test_workers.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from backends.engines.interface import LoadReport
from backends.engines.load_guard import SAFEST, SAFEST_DESCRIPTION, RiskySettings
from backends.service.protocol import LoadRequest, WorkerReport
from gui.crash_banner import RELOAD_TEXT, CrashBanner
from gui.engine_client import EngineClient, EngineDeath, LoadInFlight, PairReport
from gui.load_controller import LoadController, LoadPhase, LoadState
from gui.settings import AppSettings
from gui.sidebar import Sidebar
from gui.status_bar import ResourceStatusBar

if TYPE_CHECKING:
    from pathlib import Path

    from pytestqt.qtbot import QtBot

REQUESTED = RiskySettings("auto", -1, None)
SEGFAULT = "SIGSEGV: Segmentation fault"


class _ScriptedClient(EngineClient):
    """An engine client without a process: it records what it is asked to do."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[LoadRequest] = []
        self.stops = 0
        self.log_lines: list[str] = []

    @property
    def pid(self) -> int | None:
        return None

    def load(self, request: LoadRequest) -> None:
        self.sent.append(request)
        self.load_in_flight = LoadInFlight(request)

    def stop(self) -> None:
        self.stops += 1

    def last_log_lines(self) -> list[str]:
        return list(self.log_lines)

    def die_loading(self, stage: str = "main-probe") -> None:
        """The process dies at ``stage`` of the load it was last sent."""
        loading = LoadInFlight(self.sent[-1], stage, self.sent[-1].main_path)
        self.load_in_flight = None
        self.crashed.emit("the engine process crashed (SIGSEGV)", EngineDeath(SEGFAULT, loading))

    def report_loaded(self, calibration: tuple[str, ...] = ()) -> None:
        report = LoadReport("model.gguf", "CPU", 30, 0, False, 1024, 4, 0.5)
        self.load_in_flight = None
        self.loaded.emit(PairReport(report, None, None, 1024, "ngram-mod", calibration=calibration))


class _Controller:
    """A load controller with a scripted client, real sidebar and status bar, and a banner."""

    def __init__(self, qtbot: QtBot) -> None:
        self.settings = AppSettings()
        self.sidebar = Sidebar(self.settings)
        self.status = ResourceStatusBar()
        self.banner = CrashBanner()
        for widget in (self.sidebar, self.status, self.banner):
            qtbot.addWidget(widget)
        self.client = _ScriptedClient()
        self.loads = LoadController(self.client, self.settings, self.sidebar, self.status)
        self.loads.state_changed.connect(self.banner.show_state)
        self.gave_up: list[str] = []
        self.loads.gave_up.connect(self.gave_up.append)
        self.lost: list[str] = []
        self.loads.engine_lost.connect(self.lost.append)


@pytest.fixture
def model(tmp_path: Path) -> str:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    return str(path)


@pytest.fixture
def controller(qtbot: QtBot) -> _Controller:
    return _Controller(qtbot)


def test_a_fresh_load_clears_what_a_retry_keeps() -> None:
    lost = LoadState().worker_lost("10.0.0.5:50052", "Worker 10.0.0.5:50052 is gone.")
    assert lost.phase is LoadPhase.WORKER_LOST
    assert lost.restart_engine
    assert lost.offer_reload
    fresh = lost.load_begun(("a note",))
    assert fresh == LoadState(LoadPhase.LOADING, notes=("a note",))
    retry = lost.load_crashed("It crashed. Retrying once", "It crashed").load_begun(
        (), "It crashed"
    )
    assert retry.phase is LoadPhase.LOADING
    assert retry.retrying_after == "It crashed"
    assert retry.banner == "It crashed. Retrying once"  # the banner that announced it stays
    assert retry.lost_worker == "10.0.0.5:50052"
    assert not retry.restart_engine  # this load starts a fresh process anyway
    refused = retry.load_refused("It crashed")
    assert (refused.phase, refused.banner, refused.retrying_after) == (LoadPhase.NO_PAIR, "", "")


def test_unloading_and_failing_change_only_the_phases_they_end() -> None:
    report = LoadReport("model.gguf", "CPU", 30, 0, False, 1024, 4, 0.5)
    pair = PairReport(report, None, None, 1024, "ngram-mod")
    loaded = LoadState().load_begun().pair_loaded(pair)
    assert (loaded.phase, loaded.pair) == (LoadPhase.LOADED, pair)
    assert loaded.pair_unloaded() == LoadState(LoadPhase.NO_PAIR)
    lost = loaded.worker_lost("10.0.0.5:50052", "Worker 10.0.0.5:50052 is gone.")
    assert lost.pair is pair  # the engine lives on, holding the pair
    unloaded = lost.pair_unloaded()
    assert (unloaded.phase, unloaded.pair) == (LoadPhase.WORKER_LOST, None)
    assert unloaded.lost_worker == "10.0.0.5:50052"
    assert lost.load_failed() is lost
    failed = LoadState().load_begun().load_failed()
    assert failed.phase is LoadPhase.NO_PAIR


def test_the_sidebar_says_how_sure_auto_s_costs_are_and_the_best_this_cpu_allows(
    controller: _Controller, model: str
) -> None:
    controller.loads.load(LoadRequest(model))
    notes = (
        "auto's batch costs: median of 3 interleaved rounds, within ±4%",
        "at best on this CPU: 1.60× where the text is copied (lookups), every drafted token "
        "accepted",
    )
    controller.client.report_loaded(calibration=notes)
    shown = controller.sidebar.placement_text()
    assert all(note in shown for note in notes)


def test_a_crash_while_loading_retries_once_with_the_safest_settings(
    controller: _Controller, model: str
) -> None:
    client, loads = controller.client, controller.loads
    loads.load(LoadRequest(model))
    assert loads.state.phase is LoadPhase.LOADING
    client.die_loading()
    assert [request.risky for request in client.sent] == [REQUESTED, SAFEST]
    state = loads.state
    assert state.phase is LoadPhase.LOADING
    assert state.retrying_after.startswith("The engine crashed while running the main model's")
    assert state.banner == (
        f"{state.retrying_after}. Retrying once with the safest settings ({SAFEST_DESCRIPTION})."
    )
    assert "weight repacking auto, GPU layers all, default threads): SIGSEGV" in state.banner
    assert loads.crash_records.find(model, REQUESTED) is not None
    assert not controller.banner.isHidden()
    assert controller.banner.reload_button.isHidden()
    client.report_loaded()
    state = loads.state
    assert state.phase is LoadPhase.LOADED
    assert loads.pair is not None
    assert state.retrying_after == ""
    assert state.banner.endswith(f". Loaded again with the safest settings ({SAFEST_DESCRIPTION}).")
    assert controller.banner.label.text() == f"⚠ {state.banner}"
    assert controller.gave_up == []
    assert controller.lost == []  # no answer was under way to end


def test_a_second_crash_gives_up_and_the_records_refuse_the_next_load(
    controller: _Controller, model: str
) -> None:
    client, loads = controller.client, controller.loads
    loads.load(LoadRequest(model))
    client.die_loading()
    client.die_loading()
    assert len(client.sent) == 2
    assert loads.state.phase is LoadPhase.ENGINE_DIED
    assert loads.state.retrying_after == ""
    assert len(controller.gave_up) == 1
    assert (
        "Nothing safer is left to try: SpecDeck will not load it this way"
        in (controller.gave_up[0])
    )
    assert controller.gave_up[0] == loads.state.banner
    assert controller.banner.reload_button.isHidden()
    loads.reload()
    assert len(client.sent) == 2  # refused before anything was sent
    assert "will not load it again by itself" in controller.gave_up[-1]
    refused = loads.state
    assert refused.phase is LoadPhase.NO_PAIR
    assert controller.banner.isHidden()


def test_a_retry_that_crashes_ends_the_attempts_whatever_its_settings(
    controller: _Controller, model: str, tmp_path: Path
) -> None:
    # The records hold the crash for the file that was being loaded; when that is not one
    # of the request's paths the retry goes out with the requested settings again, and
    # its crash must not start a third load.
    client, loads = controller.client, controller.loads
    loads.load(LoadRequest(model))
    loading = LoadInFlight(client.sent[-1], "draft-model", str(tmp_path / "draft-copy.gguf"))
    client.crashed.emit("the engine process crashed", EngineDeath(SEGFAULT, loading))
    assert [request.risky for request in client.sent] == [REQUESTED, REQUESTED]
    client.die_loading("draft-model")
    assert len(client.sent) == 2
    assert len(controller.gave_up) == 1


def test_a_lost_worker_is_left_out_of_the_reload_in_a_fresh_engine(
    controller: _Controller, model: str
) -> None:
    client, loads = controller.client, controller.loads
    request = LoadRequest(model, workers=("10.0.0.5:50052", "10.0.0.6:50052"))
    loads.load(request)
    client.report_loaded()
    gone = WorkerReport("10.0.0.6:50052", reachable=False, problem="gone")
    client.workers.emit((WorkerReport("10.0.0.5:50052", reachable=True), gone))
    state = loads.state
    assert state.phase is LoadPhase.WORKER_LOST
    assert state.banner == (
        "Worker 10.0.0.6:50052 is gone: the main model cannot answer without it."
    )
    assert loads.pair is not None  # the engine still holds the pair
    assert controller.banner.reload_button.text() == "Reload without 10.0.0.6:50052"
    assert not controller.banner.reload_button.isHidden()
    loads.reload()
    assert client.stops == 1  # the old process keeps llama.cpp's leftovers of the link
    assert client.sent[-1].workers == ("10.0.0.5:50052",)
    assert controller.settings.get_str("workers") == "10.0.0.5:50052"
    assert loads.state == LoadState(LoadPhase.LOADING)
    assert controller.banner.reload_button.text() == RELOAD_TEXT
    assert controller.banner.isHidden()
    loads.load(client.sent[-1])
    assert client.stops == 1  # only once


def test_a_crash_not_while_loading_offers_reload_and_ends_the_answer(
    controller: _Controller, model: str
) -> None:
    client, loads = controller.client, controller.loads
    loads.load(LoadRequest(model))
    client.report_loaded()
    client.crashed.emit("the engine process was killed", EngineDeath("SIGKILL"))
    state = loads.state
    assert (state.phase, state.pair) == (LoadPhase.ENGINE_DIED, None)
    assert controller.banner.label.text() == "⚠ the engine process was killed"
    assert not controller.banner.reload_button.isHidden()
    assert controller.lost == ["the engine process was killed. The text above was kept."]
    assert loads.crash_records.find(model, REQUESTED) is None  # not the settings' fault
    loads.reload()
    assert client.sent[-1] == LoadRequest(model)
    assert loads.state.phase is LoadPhase.LOADING
    assert controller.banner.isHidden()


def test_an_engine_dead_on_workers_asks_them_which_went_away(
    controller: _Controller, model: str, qtbot: QtBot
) -> None:
    client, loads = controller.client, controller.loads
    loads.load(LoadRequest(model, workers=("127.0.0.1:9",)))  # the discard port: refused
    client.report_loaded()
    client.log_lines = ["Remote RPC server crashed or returned malformed response"]
    client.crashed.emit("the engine process crashed (SIGABRT)", EngineDeath("SIGABRT"))
    state = loads.state
    assert state.phase is LoadPhase.CHECKING_WORKERS
    assert state.banner == "the engine process crashed (SIGABRT). Checking the workers…"
    assert controller.banner.reload_button.isHidden()
    assert controller.lost == []  # the answer ends once the worker is named
    qtbot.waitUntil(lambda: loads.state.phase is not LoadPhase.CHECKING_WORKERS, timeout=10_000)
    state = loads.state
    assert state.phase is LoadPhase.WORKER_LOST
    assert state.banner.startswith("Worker 127.0.0.1:9 stopped answering mid-answer (")
    assert state.lost_worker == "127.0.0.1:9"
    assert controller.lost == [f"{state.banner[:-1]}. The text above was kept."]
    assert loads.crash_records.find(model, REQUESTED) is None
