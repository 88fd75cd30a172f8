"""The QProcess client against the real engine process and real models."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

from backends.engines.interface import ChatMessage
from backends.engines.load_guard import CRASH_AT_ENV
from backends.service.protocol import GenerateRequest, LoadRequest
from backends.speculation.types import GenerationSettings, TokenOrigin
from gui.engine_client import EngineClient, EngineDeath, PairReport
from tests.gui.conftest import engine_wait

if TYPE_CHECKING:
    from pathlib import Path

    import pytest
    from pytestqt.qtbot import QtBot

    from backends.speculation.types import EmittedToken, SpeculationStats

LOAD_TIMEOUT_MS = 120_000


def _loaded_client(qtbot: QtBot, request: LoadRequest) -> EngineClient:
    return _load(qtbot, request)[0]


def _load(qtbot: QtBot, request: LoadRequest) -> tuple[EngineClient, PairReport]:
    client = EngineClient()
    with engine_wait(qtbot, client, client.loaded, LOAD_TIMEOUT_MS) as blocker:
        client.load(request)
    report = blocker.args[0]
    assert isinstance(report, PairReport)
    return client, report


def test_an_auto_load_reports_how_sure_its_costs_are_and_the_best_they_allow(
    qtbot: QtBot, smollm_path: Path
) -> None:
    client, report = _load(qtbot, LoadRequest(str(smollm_path), str(smollm_path), n_ctx=1024))
    sureness, ceiling = report.calibration
    assert sureness.startswith("auto's batch costs: median of 3 interleaved rounds")
    assert ceiling.startswith("at best on this CPU: ")
    assert "with the " in ceiling
    client.stop()


def test_client_streams_tokens_and_final_stats(qtbot: QtBot, smollm_path: Path) -> None:
    client = _loaded_client(
        qtbot, LoadRequest(str(smollm_path), str(smollm_path), method="draft-model", n_ctx=1024)
    )
    streamed: list[EmittedToken] = []
    client.tokens_arrived.connect(lambda _id, _run, tokens, _stats: streamed.extend(tokens))
    request = GenerateRequest(
        client.new_request_id(),
        (ChatMessage("user", "List the numbers from one to ten."),),
        GenerationSettings(max_tokens=40),
    )
    with engine_wait(qtbot, client, client.run_finished, LOAD_TIMEOUT_MS) as finished:
        client.generate(request)
    request_id, run, last_tokens, stats = finished.args
    streamed.extend(last_tokens)
    assert (request_id, run) == (request.request_id, "speculative")
    final: SpeculationStats = stats
    drafted = sum(1 for token in streamed if token.origin is TokenOrigin.DRAFT)
    assert drafted == final.accepted_draft_tokens_count > 0
    assert final.generated_tokens >= len([t for t in streamed if t.text])
    client.stop()
    assert not client.running


def test_killed_engine_reports_a_crash_and_can_start_again(qtbot: QtBot, smollm_path: Path) -> None:
    client = _loaded_client(qtbot, LoadRequest(str(smollm_path), method="off", n_ctx=1024))
    pid = client.pid
    assert pid is not None
    with qtbot.waitSignal(client.crashed, timeout=30_000) as crashed:
        os.kill(pid, signal.SIGKILL)
    assert "engine process" in crashed.args[0]
    assert not client.running
    with engine_wait(qtbot, client, client.loaded, LOAD_TIMEOUT_MS):
        client.load(LoadRequest(str(smollm_path), method="off", n_ctx=1024))
    assert client.pid not in (None, pid)
    client.stop()


def test_errors_arrive_as_one_line_failed_signals(qtbot: QtBot, tmp_path: Path) -> None:
    client = EngineClient()
    with engine_wait(qtbot, client, client.failed, LOAD_TIMEOUT_MS) as failed:
        client.load(LoadRequest(str(tmp_path / "missing.gguf")))
    message, request_id = failed.args
    assert "missing.gguf" in message
    assert "\n" not in message
    assert request_id is None
    assert client.running  # a bad file costs a message, not the process
    client.stop()


def test_a_crash_while_loading_names_the_load_and_its_stage(
    qtbot: QtBot, smollm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CRASH_AT_ENV, "main-probe")
    client = EngineClient()
    request = LoadRequest(str(smollm_path), method="off", n_ctx=1024)
    with qtbot.waitSignal(client.crashed, timeout=LOAD_TIMEOUT_MS) as crashed:
        client.load(request)
    message, death = crashed.args
    assert message.startswith("the engine process crashed (SIGSEGV)")
    assert "Segmentation fault" in message
    assert "\n" not in message
    assert isinstance(death, EngineDeath)
    assert death.cause == "SIGSEGV: Segmentation fault"
    assert death.loading is not None
    assert death.loading.request == request
    assert (death.loading.stage, death.loading.model_path) == ("main-probe", str(smollm_path))
    assert client.load_in_flight is None
    assert not client.running


def test_a_crash_after_loading_carries_no_load(qtbot: QtBot, smollm_path: Path) -> None:
    client = _loaded_client(qtbot, LoadRequest(str(smollm_path), method="off", n_ctx=1024))
    assert client.load_in_flight is None
    pid = client.pid
    assert pid is not None
    with qtbot.waitSignal(client.crashed, timeout=30_000) as crashed:
        os.kill(pid, signal.SIGSEGV)
    assert crashed.args[1].loading is None
    assert crashed.args[1].cause.startswith("SIGSEGV")
