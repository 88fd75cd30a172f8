"""The engine process for real: a child Python process, real models, the JSON-lines protocol."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import pytest

from backends.engines.interface import ChatMessage
from backends.engines.load_guard import CRASH_AT_ENV
from backends.paths import DATA_DIR_ENV
from backends.service.protocol import (
    GenerateRequest,
    LoadRequest,
    generate_command,
    load_command,
    stats_from_wire,
    tokens_from_wire,
)
from backends.service.tuning_memory import RememberedTuning
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.types import GenerationSettings, TokenOrigin

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from backends.engines.llama import LlamaEngine
    from backends.speculation.methods import SpeculationMethod

EVENT_TIMEOUT = 120.0
QUESTION = "Write a Python function that checks whether a number is prime."


class EngineProcess:
    """Drives ``python -m backends.service.engine_server`` and reads its events with a timeout."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "backends.service.engine_server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.events.put(json.loads(line))
        self.events.put(None)

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(message) + "\n").encode())
        self.process.stdin.flush()

    def next_event(self) -> dict[str, Any]:
        event = self.events.get(timeout=EVENT_TIMEOUT)
        assert event is not None, "the engine process ended"
        return event

    def until(self, *types: str) -> list[dict[str, Any]]:
        """Every event up to and including the first of ``types``."""
        seen = []
        while True:
            event = self.next_event()
            seen.append(event)
            if event["type"] in types:
                return seen

    def close(self) -> int:
        if self.process.poll() is None:
            self.send({"type": "quit"})
        return self.process.wait(timeout=60)

    def kill(self) -> None:
        """End the process at once if it still runs (after a failed test)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def engine_process() -> Iterator[EngineProcess]:
    process = EngineProcess()
    assert process.next_event()["type"] == "ready"
    yield process
    process.kill()


def _ask(text: str, request_id: int = 1, **settings: Any) -> dict[str, Any]:
    generation = GenerationSettings(max_tokens=settings.pop("max_tokens", 48), **settings)
    return generate_command(GenerateRequest(request_id, (ChatMessage("user", text),), generation))


def test_answer_streams_with_origins_and_equals_plain_decoding(
    engine_process: EngineProcess, smollm_path: Path, smollm_target: LlamaEngine
) -> None:
    request = LoadRequest(str(smollm_path), str(smollm_path), method="draft-model", n_ctx=2048)
    engine_process.send(load_command(request))
    loaded = engine_process.until("loaded", "error")[-1]
    assert loaded["type"] == "loaded", loaded
    assert loaded["main"]["backend"]
    assert loaded["draft"]["gpu_layers"] >= 0
    # The whole load, of which each model's own load is a part.
    assert loaded["seconds"] >= loaded["main"]["load_seconds"] + loaded["draft"]["load_seconds"]
    assert loaded["main_batch_seconds"] == {}  # a forced method: nothing calibrated
    engine_process.send(_ask(QUESTION))
    events = engine_process.until("finished", "error")
    assert events[-1]["type"] == "finished", events[-1]
    assert events[0]["type"] == "started"
    assert events[0]["run"] == "speculative"
    streamed = [t for e in events if "tokens" in e for t in tokens_from_wire(e["tokens"])]
    final = stats_from_wire(events[-1]["stats"])
    assert final.generated_tokens == len(streamed)  # an end-of-generation token is not counted
    drafted = [t for t in streamed if t.origin is TokenOrigin.DRAFT]
    assert len(drafted) == final.accepted_draft_tokens_count > 0
    # Live stats only grow.
    counts = [stats_from_wire(e["stats"]).generated_tokens for e in events if e["type"] == "tokens"]
    assert counts == sorted(counts)

    plain = SpeculativeDecoder(smollm_target)
    prompt = plain.prompt_tokens([ChatMessage("user", QUESTION)])
    smollm_target.truncate(0)
    expected = plain.run(prompt, GenerationSettings(max_tokens=48)).text
    assert "".join(t.text for t in streamed) == expected
    assert engine_process.close() == 0


def test_comparison_runs_both_one_after_the_other(
    engine_process: EngineProcess, smollm_path: Path
) -> None:
    engine_process.send(load_command(LoadRequest(str(smollm_path), method="ngram-simple")))
    assert engine_process.until("loaded", "error")[-1]["type"] == "loaded"
    message = _ask("Repeat this line three times: the quick brown fox jumps.", max_tokens=40)
    message["compare"] = True
    engine_process.send(message)
    events = engine_process.until("compared", "error")
    kinds = [(e["type"], e.get("run")) for e in events if e["type"] in ("started", "finished")]
    assert kinds == [
        ("started", "speculative"),
        ("finished", "speculative"),
        ("started", "plain"),
        ("finished", "plain"),
    ]
    texts = {
        run: "".join(
            t.text
            for e in events
            if e.get("run") == run and "tokens" in e
            for t in tokens_from_wire(e["tokens"])
        )
        for run in ("speculative", "plain")
    }
    compared = events[-1]
    assert compared["identical"] is (texts["speculative"] == texts["plain"])
    assert compared["identical"] is True
    assert compared["speedup"] > 0
    plain_tokens = [
        t
        for e in events
        if e.get("run") == "plain" and "tokens" in e
        for t in tokens_from_wire(e["tokens"])
    ]
    assert all(t.origin is TokenOrigin.TARGET for t in plain_tokens)


def test_cancel_stops_a_running_generation(
    engine_process: EngineProcess, smollm_path: Path
) -> None:
    engine_process.send(load_command(LoadRequest(str(smollm_path), method="off")))
    assert engine_process.until("loaded", "error")[-1]["type"] == "loaded"
    engine_process.send(_ask("Tell a very long story about the sea.", max_tokens=1500))
    assert engine_process.until("tokens")[-1]["type"] == "tokens"
    engine_process.send({"type": "cancel"})
    finished = engine_process.until("finished", "error")[-1]
    stats = stats_from_wire(finished["stats"])
    assert stats.stop_reason == "cancelled"
    assert stats.generated_tokens < 1500
    # The process keeps serving after a cancel.
    engine_process.send(_ask("Say hi.", request_id=2, max_tokens=4))
    assert engine_process.until("finished", "error")[-1]["request_id"] == 2


@pytest.mark.parametrize(
    "case", ["missing", "corrupt", "incompatible", "no_model", "overflow", "memory"]
)
def test_bad_input_is_one_line_error_and_the_process_lives_on(
    engine_process: EngineProcess,
    smollm_path: Path,
    gemma_path: Path,
    tmp_path: Path,
    case: str,
) -> None:
    if case == "missing":
        engine_process.send(load_command(LoadRequest(str(tmp_path / "nope.gguf"))))
        expected = "not found"
    elif case == "corrupt":
        broken = tmp_path / "broken.gguf"
        broken.write_bytes(b"GGUF" + b"\x00" * 64)
        engine_process.send(load_command(LoadRequest(str(broken))))
        expected = "broken.gguf"
    elif case == "incompatible":
        engine_process.send(load_command(LoadRequest(str(smollm_path), str(gemma_path))))
        expected = "draft"
    elif case == "memory":
        # A context of 50M tokens needs a KV cache far beyond this machine's memory.
        engine_process.send(load_command(LoadRequest(str(smollm_path), n_ctx=50_000_000)))
        expected = "not enough memory"
    elif case == "no_model":
        engine_process.send(_ask("hello"))
        expected = "no model is loaded"
    else:
        engine_process.send(load_command(LoadRequest(str(smollm_path), n_ctx=256)))
        assert engine_process.until("loaded", "error")[-1]["type"] == "loaded"
        engine_process.send(_ask("word " * 400))
        expected = "context holds 256"
    error = engine_process.until("error", "loaded")[-1]
    assert error["type"] == "error"
    assert expected in error["message"]
    assert "\n" not in error["message"]
    assert "Traceback" not in error["message"]
    engine_process.send({"type": "unload"})
    assert engine_process.until("unloaded")[-1]["type"] == "unloaded"
    assert engine_process.close() == 0


# Native code that prints to its standard output after every model load, as some backends'
# libraries do (llama.cpp itself logs through SpecDeck's callback): C's printf, not Python.
_NATIVE_PRINTER = """
import ctypes

import backends.engines.llama as llama

_load = llama.LlamaEngine.__init__


def _load_and_print(self, *args, **kwargs):
    _load(self, *args, **kwargs)
    libc = ctypes.CDLL(None)
    libc.printf(b"native noise from llama on stdout\\n")
    libc.fflush(None)


llama.LlamaEngine.__init__ = _load_and_print
"""


@pytest.mark.heavy
def test_native_output_never_reaches_the_event_stream(smollm_path: Path, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(_NATIVE_PRINTER, encoding="utf-8")
    paths = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    engine_process = EngineProcess({**os.environ, "PYTHONPATH": os.pathsep.join(paths)})
    try:
        assert engine_process.next_event()["type"] == "ready"
        engine_process.send(load_command(LoadRequest(str(smollm_path), method="off")))
        events = engine_process.until("loaded", "error")
        # Every line parsed as a protocol event (the reader would have raised otherwise).
        assert {e["type"] for e in events} <= {"load_stage", "load_progress", "loaded"}
        engine_process.send(_ask("Say hi.", max_tokens=4))
        assert engine_process.until("finished", "error")[-1]["type"] == "finished"
        assert engine_process.close() == 0
        assert engine_process.process.stderr is not None
        assert b"native noise from llama on stdout" in engine_process.process.stderr.read()
    finally:
        engine_process.kill()


def test_mlx_folders_answer_through_the_same_process(
    engine_process: EngineProcess, tiny_mlx_main: Path, tiny_mlx_draft: Path
) -> None:
    pytest.importorskip("mlx_lm", reason="the MLX engine needs mlx-lm (mlx[cpu] on Linux)")
    request = LoadRequest(
        str(tiny_mlx_main), str(tiny_mlx_draft), engine="mlx", method="draft-model", n_ctx=512
    )
    engine_process.send(load_command(request))
    loaded = engine_process.until("loaded", "error")[-1]
    assert loaded["type"] == "loaded", loaded
    assert loaded["main"]["backend"].startswith("MLX")
    engine_process.send(_ask("def add(a, b):", max_tokens=12))
    finished = engine_process.until("finished", "error")[-1]
    assert finished["type"] == "finished", finished
    assert stats_from_wire(finished["stats"]).generated_tokens > 0
    assert engine_process.close() == 0


def test_a_model_of_the_other_engine_is_refused_by_name(
    engine_process: EngineProcess, smollm_path: Path, tiny_mlx_main: Path
) -> None:
    engine_process.send(load_command(LoadRequest(str(smollm_path), engine="mlx")))
    error = engine_process.until("error", "loaded")[-1]
    assert error["type"] == "error"
    assert error["message"].startswith(f"{smollm_path.name} is a GGUF model; the mlx engine")
    engine_process.send(load_command(LoadRequest(str(tiny_mlx_main))))
    error = engine_process.until("error", "loaded")[-1]
    assert "is an MLX model; the llama.cpp engine reads GGUF models" in error["message"]


@pytest.mark.parametrize(
    ("crash_at", "method", "draft", "stages"),
    [
        ("main-model", "off", False, ["main-model"]),
        ("main-probe", "off", False, ["main-model", "main-probe"]),
        ("draft-model", "draft-model", True, ["main-model", "main-probe", "draft-model"]),
        ("calibration", "auto", False, ["main-model", "main-probe", "calibration"]),
    ],
)
@pytest.mark.heavy
def test_a_crash_while_loading_follows_the_announced_stage(
    monkeypatch: pytest.MonkeyPatch,
    smollm_path: Path,
    crash_at: str,
    method: SpeculationMethod,
    draft: bool,
    stages: list[str],
) -> None:
    monkeypatch.setenv(CRASH_AT_ENV, crash_at)
    engine = EngineProcess()
    try:
        assert engine.next_event()["type"] == "ready"
        request = LoadRequest(
            str(smollm_path), str(smollm_path) if draft else None, method=method, n_ctx=1024
        )
        engine.send(load_command(request))
        events = []
        while (event := engine.events.get(timeout=EVENT_TIMEOUT)) is not None:
            events.append(event)
        assert [e["stage"] for e in events if e["type"] == "load_stage"] == stages
        assert all(e["model"] == str(smollm_path) for e in events if e["type"] == "load_stage")
        assert not any(e["type"] in ("loaded", "error") for e in events)
        assert engine.process.wait(timeout=30) == -signal.SIGSEGV
        assert engine.process.stderr is not None
        assert b"Fatal Python error: Segmentation fault" in engine.process.stderr.read()
    finally:
        engine.kill()


@pytest.mark.heavy
def test_the_local_api_serves_the_loaded_pair_in_turn_with_the_window(
    engine_process: EngineProcess, smollm_path: Path
) -> None:
    import openai

    from tests.test_api_server import free_port

    port = free_port()
    engine_process.send({"type": "serve_start", "port": port})
    serving = engine_process.until("serving")[-1]
    assert serving["listening"] is True, serving
    assert serving["url"] == f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=serving["url"], api_key="-", max_retries=0)
    # Before a load: the API says what to do, it does not hang.
    with pytest.raises(openai.APIStatusError, match="no model is loaded") as refused:
        client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": QUESTION}], max_tokens=8
        )
    assert refused.value.status_code == 503
    engine_process.send(load_command(LoadRequest(str(smollm_path), str(smollm_path))))
    assert engine_process.until("loaded", "error")[-1]["type"] == "loaded"
    # A window answer first, then an API request: they take turns on the one engine. The
    # request goes once the window's answer has started: sent at once, it can reach the
    # queue first (the HTTP thread may run before the thread that reads the window's pipe).
    engine_process.send(_ask(QUESTION, max_tokens=24))
    window_started = engine_process.until("started")
    answers: dict[str, Any] = {}

    def ask_api() -> None:
        answers["api"] = client.chat.completions.create(
            model=smollm_path.stem,
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=24,
        )

    asking = threading.Thread(target=ask_api)
    asking.start()
    events = window_started + engine_process.until("api_finished", "api_failed")
    asking.join(timeout=120)
    kinds = [e["type"] for e in events]
    assert kinds.index("finished") < kinds.index("api_started")  # the window's went first
    assert events[-1]["type"] == "api_finished"
    api_text = "".join(
        t.text
        for e in events
        if e["type"].startswith("api_") and "tokens" in e
        for t in tokens_from_wire(e["tokens"])
    )
    window_text = "".join(
        t.text
        for e in events
        if e["type"] in ("tokens", "finished")
        for t in tokens_from_wire(e["tokens"])
    )
    answer = answers["api"]
    assert answer.choices[0].message.content == api_text == window_text  # same pair, greedy
    stats = stats_from_wire(events[-1]["stats"])
    assert (answer.model_extra or {})["stats"]["accepted_draft_tokens_count"] == (
        stats.accepted_draft_tokens_count
    )
    engine_process.send({"type": "serve_stop"})
    stopped = engine_process.until("serving")[-1]
    assert stopped["listening"] is False
    with pytest.raises(openai.APIConnectionError):
        client.models.list()
    assert engine_process.close() == 0


def test_the_local_api_says_when_its_port_is_taken(engine_process: EngineProcess) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        engine_process.send({"type": "serve_start", "port": taken.getsockname()[1]})
        serving = engine_process.until("serving")[-1]
    assert serving["listening"] is False
    assert "cannot listen on 127.0.0.1" in serving["error"]
    engine_process.send({"type": "serve_start", "host": "0.0.0.0"})
    error = engine_process.until("error", "serving")[-1]
    assert error["type"] == "error"
    assert "give an API key" in error["message"]
    assert engine_process.close() == 0


def _tune(request_id: int, drafts: list[str], **options: Any) -> dict[str, Any]:
    return {
        "type": "tune",
        "request_id": request_id,
        "budget_seconds": options.pop("budget_seconds", 20),
        "drafts": drafts,
        "prompts": options.pop("prompts", ["Write a haiku about rain."]),
        **options,
    }


@pytest.mark.heavy
def test_tuning_runs_in_the_engine_process_and_is_remembered(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, smollm_path: Path
) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    engine = EngineProcess()
    try:
        assert engine.next_event()["type"] == "ready"
        request = LoadRequest(str(smollm_path), str(smollm_path), method="auto", n_ctx=1024)
        engine.send(load_command(request))
        assert engine.until("loaded", "error")[-1]["type"] == "loaded"
        engine.send(_tune(5, [], recall_only=True))
        nothing = engine.until("tuned", "error")[-1]
        assert nothing["type"] == "tuned"
        assert nothing["result"] is None
        # The loaded draft is a candidate too: reused, not loaded a second time.
        engine.send(_tune(6, [str(smollm_path)], again=True))
        events = engine.until("tuned", "error")
        assert events[-1]["type"] == "tuned", events[-1]
        assert not any(e["type"] == "load_stage" for e in events)
        progress = [e["fraction"] for e in events if e["type"] == "tune_progress"]
        assert progress == sorted(progress)
        assert progress[-1] == 1.0
        result = RememberedTuning.from_json(events[-1]["result"])
        labels = {row.label for row in result.rows if row.measured}
        assert {"plain", "ngram-mod", "auto + 135M Q4_1", "draft 135M Q4_1"} <= labels
        assert result.prompts == ("chat 1",)
        assert (tmp_path / "tuning.json").is_file()
        engine.send(_tune(7, [str(smollm_path)]))
        recalled = engine.until("tuned", "error")[-1]
        assert recalled["recalled"] is True
        assert RememberedTuning.from_json(recalled["result"]).rows == result.rows
        # The loaded pair is as it was: it still answers, with its draft.
        engine.send(_ask("Say hi.", request_id=8, max_tokens=8))
        assert engine.until("finished", "error")[-1]["type"] == "finished"
    finally:
        engine.close()


@pytest.mark.heavy
def test_a_crash_while_loading_a_trial_draft_ends_the_process_like_an_answer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, smollm_path: Path
) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(CRASH_AT_ENV, "draft-model")  # fault injection: the trial draft's load
    engine = EngineProcess()
    try:
        assert engine.next_event()["type"] == "ready"
        engine.send(load_command(LoadRequest(str(smollm_path), method="ngram-mod", n_ctx=1024)))
        assert engine.until("loaded", "error")[-1]["type"] == "loaded"
        engine.send(_tune(3, [str(smollm_path)]))
        events = []
        while (event := engine.events.get(timeout=EVENT_TIMEOUT)) is not None:
            events.append(event)
        stages = [e["stage"] for e in events if e["type"] == "load_stage"]
        assert stages == ["draft-model"]
        assert not any(e["type"] == "tuned" for e in events)
        assert engine.process.wait(timeout=30) == -signal.SIGSEGV
        assert not (tmp_path / "tuning.json").exists()  # nothing half-measured is remembered
    finally:
        engine.kill()


def test_an_auto_load_reports_the_main_models_batch_costs(
    engine_process: EngineProcess, smollm_path: Path
) -> None:
    """What auto measured at load reaches the window (the Download dialog ranks drafts by it)."""
    request = LoadRequest(str(smollm_path), str(smollm_path), method="auto", n_ctx=512)
    engine_process.send(load_command(request))
    loaded = engine_process.until("loaded", "error")[-1]
    assert loaded["type"] == "loaded", loaded
    seconds = {int(size): value for size, value in loaded["main_batch_seconds"].items()}
    assert 1 in seconds
    assert len(seconds) >= 2
    assert all(value > 0 for value in seconds.values())
    assert seconds[max(seconds)] > seconds[1]  # a batch costs more than one token
