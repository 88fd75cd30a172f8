"""The main model on llama.cpp RPC workers: real ``specdeck worker`` processes on loopback."""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from backends.engines.interface import ChatMessage, LoadReport
from backends.engines.layer_split import LayerSplit, parse_split, split_layers
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.engines.rpc import REPLY_TIMEOUT_ENV
from backends.engines.worker_probe import (
    WorkerAddress,
    WorkerError,
    check_workers,
    parse_workers,
    probe_worker,
)
from backends.errors import SettingsError, SpecDeckError
from backends.service.loaded_pair import open_pair
from backends.service.protocol import (
    GenerateRequest,
    LoadRequest,
    generate_command,
    load_command,
    worker_reports,
)
from backends.service.tuning_memory import machine_key
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.types import GenerationSettings
from benchmarks.latency_relay import LatencyRelay
from tests.conftest import TEST_CONTEXT
from tests.test_engine_server import EngineProcess
from tests.workers import Worker, free_port

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

QUESTION = "Write a Python function that returns the squares of a list of numbers."


@pytest.fixture(scope="module")
def two_workers() -> Iterator[tuple[Worker, Worker]]:
    first, second = Worker(), Worker()
    yield first, second
    first.kill()
    second.kill()


def _settings(*workers: Worker, split: tuple[float, ...] = ()) -> LlamaLoadSettings:
    return LlamaLoadSettings(
        n_ctx=TEST_CONTEXT, workers=tuple(str(w) for w in workers), layer_split=split
    )


def _prompt(engine: LlamaEngine, text: str = QUESTION) -> list[int]:
    return SpeculativeDecoder(engine).prompt_tokens([ChatMessage("user", text)])


# -- addresses, splits, probes ----------------------------------------------------------------


def test_worker_lists_and_splits_are_checked_with_one_line_errors() -> None:
    assert parse_workers("10.0.0.5:50052, gpu-box:7000 10.0.0.6") == (
        WorkerAddress("10.0.0.5", 50052),
        WorkerAddress("gpu-box", 7000),
        WorkerAddress("10.0.0.6", 50052),
    )
    assert parse_workers("") == ()
    for bad, words in [
        ("10.0.0.5:0", "port must be a number"),
        ("10.0.0.5:http", "port must be a number"),
        (":50052", "host:port"),
        ("a:1,a:1", "listed twice"),
    ]:
        with pytest.raises(SettingsError, match=words):
            parse_workers(bad)
    assert parse_split("3,1,0", 2) == (3.0, 1.0, 0.0)
    assert parse_split("", 2) == ()
    with pytest.raises(SettingsError, match="give 3"):
        parse_split("1,1", 2)
    with pytest.raises(SettingsError, match="not all 0"):
        parse_split("0,0,0", 2)
    with pytest.raises(SettingsError, match="needs workers"):
        parse_split("1", 0)
    with pytest.raises(SettingsError, match="one number per worker"):
        parse_split("a,b", 1)
    with pytest.raises(SettingsError, match="MLX runs on one machine"):
        LoadRequest("m", engine="mlx", workers=("10.0.0.5:50052",))


def test_layers_go_to_workers_by_share_and_the_rest_stay_here() -> None:
    # No GPU here: the CPU keeps its share, the workers the last layers.
    # llama.cpp counts the output layer as one more: n_gpu_layers = repeating layers + 1.
    assert split_layers(30, [1.0, 1.0], [], 1.0) == LayerSplit(21, (1.0, 1.0))
    assert split_layers(30, [1.0, 1.0], [], 0.0).n_gpu_layers == 999  # everything
    assert split_layers(28, [1.0], [], 99.0).n_gpu_layers == 2  # a worker gets one at least
    # With a local GPU the CPU keeps nothing; the GPU is one more device.
    with_gpu = split_layers(28, [2.0, 2.0], [4.0], 0.0)
    assert (with_gpu.n_gpu_layers, with_gpu.device_shares) == (999, (2.0, 2.0, 4.0))


def test_a_tuning_result_on_this_machine_is_not_taken_for_one_on_workers(
    smollm_path: Path,
) -> None:
    alone = LoadReport("m", "CPU", 30, 0, False, 1024, 2, 1.0)
    spread = replace(alone, layer_placement=(("worker 10.0.0.5:50052", 30),))
    here, there = machine_key(smollm_path, alone), machine_key(smollm_path, spread)
    assert here != there
    assert "worker 10.0.0.5:50052" in there.accelerator


def test_probes_name_what_is_wrong_and_never_hang() -> None:
    closed = WorkerAddress("127.0.0.1", free_port())
    status = probe_worker(closed)
    assert not status.reachable
    assert "connection refused" in status.problem
    with pytest.raises(WorkerError, match=rf"worker {closed} is unreachable: connection refused"):
        check_workers([closed])

    # A listener that accepts and never answers (a worker busy with another client).
    silent = socket.create_server(("127.0.0.1", 0))
    silent_address = WorkerAddress("127.0.0.1", silent.getsockname()[1])
    started = time.monotonic()
    status = probe_worker(silent_address, timeout=0.5)
    assert time.monotonic() - started < 3
    assert "did not answer within 0.5 s" in status.problem
    silent.close()

    # A worker of another llama.cpp: protocol 6.
    old = socket.create_server(("127.0.0.1", 0))

    def answer_hello() -> None:
        connection, _ = old.accept()
        connection.recv(1 + 8 + 24)
        connection.sendall(struct.pack("<Q", 28) + bytes([6, 1, 0, 0]) + bytes(24))
        connection.close()

    threading.Thread(target=answer_hello, daemon=True).start()
    status = probe_worker(WorkerAddress("127.0.0.1", old.getsockname()[1]))
    assert "speaks RPC protocol 6.1.0" in status.problem
    old.close()


def test_a_worker_reports_its_device_and_memory(two_workers: tuple[Worker, Worker]) -> None:
    status = probe_worker(two_workers[0].address)
    assert status.reachable, status.problem
    assert status.version.startswith("7.0.")
    assert len(status.devices) == 1
    assert 0 < status.memory_free <= status.memory_total


# -- the worker command -----------------------------------------------------------------------


def _worker_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "backends.service.worker_cli", *args]


def test_the_worker_command_refuses_bad_addresses_in_one_line() -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    for args, words in [
        (["--host", "localhost"], "give a numeric IPv4 address"),
        (["--port", "70000"], "from 1 to 65535"),
        (["--port", str(port)], f"port {port} on 127.0.0.1 is in use"),
        (["--threads", "0"], "give at least 1"),
    ]:
        done = subprocess.run(_worker_command(*args), capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert words in lines[0], done.stderr
    taken.close()


def test_a_worker_on_every_network_prints_llama_cpps_warning() -> None:
    port = free_port()
    process = subprocess.Popen(
        _worker_command("--host", "0.0.0.0", "--port", str(port), "--threads", "1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        status = probe_worker(WorkerAddress("127.0.0.1", port))
        deadline = time.monotonic() + 30
        while not status.reachable and time.monotonic() < deadline:
            time.sleep(0.2)
            status = probe_worker(WorkerAddress("127.0.0.1", port))
        assert status.reachable, status.problem
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl+C stops it at once
        _, stderr = process.communicate(timeout=30)
    assert "Never expose the RPC server to an open network!" in stderr
    assert "WARNING: Host ('0.0.0.0') is != '127.0.0.1'" in stderr


# -- models on workers ------------------------------------------------------------------------


@pytest.mark.heavy
def test_smollm_split_over_two_workers_decodes_exactly_as_plain_with_the_draft_here(
    smollm_path: Path, two_workers: tuple[Worker, Worker]
) -> None:
    first, second = two_workers
    with (
        LlamaEngine(smollm_path, _settings(first, second, split=(1.0, 1.0, 1.0))) as main,
        LlamaEngine(smollm_path, LlamaLoadSettings(n_ctx=TEST_CONTEXT), is_draft=True) as draft,
    ):
        placement = dict(main.load_report.layer_placement)
        # A third of the 30 layers here, the rest spread over the workers with the output
        # layer (llama.cpp's 31st) on the second.
        assert placement == {
            "this computer (CPU)": 10,
            f"worker {first}": 11,
            f"worker {second}": 9,
        }
        assert f"on worker {first}" in main.load_report.placement
        # The draft is on this machine: no worker, no remote layer.
        assert draft.load_report.layer_placement == ()
        assert draft.worker_statuses() == ()
        statuses = main.worker_statuses()
        assert [s.address for s in statuses] == [first.address, second.address]
        assert all(s.reachable and s.memory_total > 0 for s in statuses)
        assert main.exact_batch_limit is not None
        assert main.exact_batch_limit >= 3

        prompt = _prompt(main)
        settings = GenerationSettings(max_tokens=48)
        plain = SpeculativeDecoder(main).run(prompt, settings)
        for method in ("draft-model", "ngram-simple", "auto"):
            main.truncate(0)
            draft.truncate(0)
            decoder = build_decoder(method, main, draft, adaptive=method == "auto")
            result = decoder.run(prompt, settings)
            assert result.token_ids == plain.token_ids, method
            if method == "draft-model":
                assert result.stats.accepted_draft_tokens_count > 0


@pytest.mark.default_pair
def test_the_default_pair_with_the_main_model_on_two_workers_is_exact(
    qwen_main_path: Path, qwen_draft_path: Path, two_workers: tuple[Worker, Worker]
) -> None:
    first, second = two_workers
    request = LoadRequest(
        str(qwen_main_path),
        str(qwen_draft_path),
        method="auto",
        n_ctx=TEST_CONTEXT,
        workers=(str(first), str(second)),
        layer_split=(1.0, 1.0, 0.0),
    )
    pair = open_pair(request)
    try:
        placement = dict(pair.main.load_report.layer_placement)
        # 28 repeating layers and the output layer, split 1:1 over the two workers.
        assert set(placement) == {f"worker {first}", f"worker {second}"}, placement
        assert sum(placement.values()) == 28
        assert min(placement.values()) >= 13, placement
        assert pair.draft is not None
        assert pair.draft.load_report.layer_placement == ()
        prompt = _prompt(pair.main)  # type: ignore[arg-type]
        settings = GenerationSettings(max_tokens=40)
        plain = SpeculativeDecoder(pair.main).run(prompt, settings)
        for method in ("draft-model", "auto"):
            pair.main.truncate(0)
            pair.draft.truncate(0)
            result = pair.decoder(method, settings.p_min).run(prompt, settings)
            assert result.token_ids == plain.token_ids, method
    finally:
        pair.close()


def test_an_unreachable_worker_at_load_is_one_line_naming_it(
    smollm_path: Path, two_workers: tuple[Worker, Worker]
) -> None:
    closed = f"127.0.0.1:{free_port()}"
    with pytest.raises(WorkerError) as raised:
        LlamaEngine(smollm_path, LlamaLoadSettings(workers=(str(two_workers[0]), closed)))
    assert str(raised.value) == (
        f"worker {closed} is unreachable: connection refused (is `specdeck worker` running?)"
    )
    # The reachable worker was not left holding a connection: it serves the next client.
    assert probe_worker(two_workers[0].address).reachable


def test_the_memory_check_counts_only_this_computers_share_of_the_layers(
    smollm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from backends.service import loaded_pair

    monkeypatch.setattr(loaded_pair, "available_memory", lambda: 20 << 20)  # 20 MB free
    closed = f"127.0.0.1:{free_port()}"
    # Every layer here: refused before any worker is asked.
    with pytest.raises(SpecDeckError, match="not enough memory: the models need about"):
        open_pair(LoadRequest(str(smollm_path), workers=(closed,), layer_split=(0.0, 1.0)))
    # Every layer on the worker: nothing much here, so the load goes on to ask the worker.
    with pytest.raises(WorkerError, match="unreachable"):
        open_pair(LoadRequest(str(smollm_path), workers=(closed,), layer_split=(1.0, 0.0)))


@pytest.mark.heavy
def test_through_a_slow_network_the_text_stays_exact(
    smollm_path: Path, two_workers: tuple[Worker, Worker]
) -> None:
    relay = LatencyRelay(("127.0.0.1", two_workers[1].port), round_trip_ms=4).start()
    try:
        settings = LlamaLoadSettings(
            n_ctx=TEST_CONTEXT, workers=(f"127.0.0.1:{relay.port}",), layer_split=(1.0, 0.0)
        )
        with LlamaEngine(smollm_path, settings) as main:
            prompt = _prompt(main, "Name three colours.")
            greedy = GenerationSettings(max_tokens=16)
            plain = SpeculativeDecoder(main).run(prompt, greedy)
            main.truncate(0)
            auto = build_decoder("auto", main, None, adaptive=True)
            auto.prepare()  # batch costs measured through the relay
            assert auto.run(prompt, greedy).token_ids == plain.token_ids
            # Every forward pass after the first token waits for at least one round trip.
            passes = len(plain.token_ids) - 1
            assert plain.stats.generation_seconds / passes >= 0.004
    finally:
        relay.stop()


# -- a worker lost: between answers, during one, or hung --------------------------------------


def _load_on(engine: EngineProcess, path: Path, *workers: Worker) -> dict[str, Any]:
    request = LoadRequest(
        str(path),
        n_ctx=TEST_CONTEXT,
        method="ngram-simple",
        workers=tuple(str(w) for w in workers),
        layer_split=(1.0,) * len(workers) + (0.0,),
    )
    engine.send(load_command(request))
    events = engine.until("loaded", "error")
    assert events[-1]["type"] == "loaded", events[-1]
    reports = worker_reports(engine.until("workers")[-1])
    assert [r.address for r in reports] == [str(w) for w in workers]
    assert all(r.reachable and r.layers > 0 for r in reports)
    return events[-1]


def _ask(request_id: int, max_tokens: int) -> dict[str, Any]:
    return generate_command(
        GenerateRequest(
            request_id,
            (ChatMessage("user", QUESTION),),
            GenerationSettings(max_tokens=max_tokens),
        )
    )


@pytest.mark.heavy
def test_a_worker_gone_between_answers_is_an_error_and_the_process_lives(
    smollm_path: Path,
) -> None:
    keeper, leaver = Worker(), Worker()
    engine = EngineProcess()
    try:
        engine.until("ready")
        _load_on(engine, smollm_path, keeper, leaver)
        leaver.kill()
        time.sleep(0.3)
        engine.send(_ask(1, 16))
        error = engine.until("error")[-1]
        assert error["message"] == (
            f"worker {leaver} is gone (its connection closed); "
            "Reload models to load again without it"
        )
        reports = worker_reports(engine.until("workers")[-1])
        assert [(r.address, r.reachable) for r in reports] == [
            (str(keeper), True),
            (str(leaver), False),
        ]
        # Still alive: it loads again without the lost worker and answers, twice (the
        # first model is left in memory, still using the keeper's link).
        for request_id in (2, 3):
            _load_on(engine, smollm_path, keeper)
            engine.send(_ask(request_id, 8))
            assert engine.until("finished", "error")[-1]["type"] == "finished"
        # The lost worker is refused by this process until it restarts.
        engine.send(load_command(LoadRequest(str(smollm_path), workers=(str(leaver),))))
        assert engine.until("loaded", "error")[-1]["message"] == (
            f"worker {leaver} was lost by this engine process; restart it to use that worker "
            "again (Reload models does)"
        )
    finally:
        engine.close()
        keeper.kill()


@pytest.mark.parametrize("fault", ["killed", pytest.param("hung", marks=pytest.mark.heavy)])
def test_a_worker_lost_mid_answer_ends_the_engine_process_in_time(
    smollm_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """Killed: llama.cpp sees the connection close. Hung (SIGSTOP: the socket stays open):
    only the reply timeout can notice; both abort the process, neither hangs."""
    monkeypatch.setenv(REPLY_TIMEOUT_ENV, "2")
    worker = Worker()
    engine = EngineProcess()
    try:
        engine.until("ready")
        _load_on(engine, smollm_path, worker)
        engine.send(_ask(1, 2000))
        engine.until("tokens")
        started = time.monotonic()
        if fault == "killed":
            worker.kill()
        else:
            worker.freeze()
        # Killed between two passes, the engine sees the closed link first and says so.
        event: dict[str, Any] | None = {}
        while event is not None and event.get("type") != "error":
            event = engine.events.get(timeout=60)
        if event is not None:
            assert fault == "killed"
            assert event["message"].startswith(f"worker {worker} is gone")
            return
        ended = engine.process.wait(timeout=60)
        assert ended == -signal.SIGABRT
        assert time.monotonic() - started < 20
        assert engine.process.stderr is not None
        log = engine.process.stderr.read().decode(errors="replace")
        assert "Remote RPC server crashed" in log
    finally:
        engine.close()
        worker.thaw()
        worker.kill()


@pytest.mark.heavy
def test_bench_runs_on_workers_and_says_which_worker_was_lost(
    smollm_path: Path, two_workers: tuple[Worker, Worker]
) -> None:
    first, second = two_workers
    command = [sys.executable, "-m", "backends.service.bench", "--main", str(smollm_path)]
    command += ["--rpc", f"{first},{second}", "--max-tokens", "24", "--json"]
    command += ["--method", "ngram-simple", "--no-warmup", "--draft", str(smollm_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert f"on worker {first}" in result["load"]["main_placement"]
    assert result["identical"] is True
    closed = f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "backends.service.bench", "--main", str(smollm_path)]
    done = subprocess.run(
        [*command, "--draft", str(smollm_path), "--rpc", closed],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"specdeck-bench: error: worker {closed} is unreachable: connection refused "
        "(is `specdeck worker` running?)"
    )


def test_the_relay_delays_each_round_trip() -> None:
    echo = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = echo.accept()
        while data := connection.recv(100):
            connection.sendall(data)
        connection.close()

    threading.Thread(target=serve, daemon=True).start()
    relay = LatencyRelay(("127.0.0.1", echo.getsockname()[1]), round_trip_ms=50).start()
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as client:
            started = time.perf_counter()
            for _ in range(3):
                client.sendall(b"ping")
                assert client.recv(100) == b"ping"
            assert time.perf_counter() - started >= 0.15
    finally:
        relay.stop()
        echo.close()
