"""The local API: a live ``specdeck serve`` with the SmolLM pair, driven by the openai client."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai
import pytest

from backends.errors import SettingsError
from backends.service.api.app import ApiServer, ServerSettings
from backends.service.api.jobs import ServedModel
from backends.service.api.worker import PairWorker
from backends.service.loaded_pair import open_pair
from backends.service.protocol import LoadRequest
from backends.service.serve_cli import build_parser, generation_defaults
from tests.conftest import TEST_CONTEXT

if TYPE_CHECKING:
    from collections.abc import Iterator

    from openai.types.chat import ChatCompletionMessageParam

    from backends.service.loaded_pair import LoadedPair
    from backends.speculation.types import GenerationSettings

QUESTION = "Write a Python function that adds two numbers."
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]
SPECDECK = Path(sys.executable).with_name("specdeck")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Served:
    """A running ``specdeck serve`` process and where it listens."""

    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}/v1"

    def client(self, **options: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, **options)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        connection.request(method, "/v1" + path, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
        connection.close()
        return response.status, json.loads(data) if data else None

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.request("GET", "/models")[1]["specdeck"]
        return status


@contextmanager
def serve(*arguments: str, wait: bool = True) -> Iterator[Served]:
    port = free_port()
    command = [str(SPECDECK), "serve", "--port", str(port), *arguments]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    served = Served(process, port)
    try:
        deadline = time.monotonic() + 300
        while wait:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            try:
                if served.status()["unavailable"] is None:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "specdeck serve did not get ready"
            time.sleep(0.2)
        yield served
    finally:
        process.terminate()
        process.wait(timeout=60)


@pytest.fixture
def server(smollm_server: Served) -> Served:
    return smollm_server


def plain_text(smollm_path: Path, prompt: str, max_tokens: int) -> str:
    """What specdeck-bench's plain decoding answers to the same user message."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "backends.service.bench",
            "--json",
            "--no-warmup",
            "--main",
            str(smollm_path),
            "--draft",
            str(smollm_path),
            "--prompt",
            prompt,
            "--max-tokens",
            str(max_tokens),
            "--method",
            "off",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return str(json.loads(done.stdout)["baseline"]["text"])


def test_models_lists_the_main_model_and_its_draft(server: Served, smollm_path: Path) -> None:
    models = server.client().models.list()
    ids = [model.id for model in models.data]
    assert ids == [smollm_path.stem, smollm_path.stem]
    assert server.status()["queued"] == 0


@pytest.mark.heavy
def test_a_chat_answer_is_plain_decoding_with_stats_that_add_up(
    server: Served, smollm_path: Path
) -> None:
    answer = server.client().chat.completions.create(
        model=smollm_path.stem,
        messages=MESSAGES,
        max_tokens=48,
        temperature=0,
    )
    text = answer.choices[0].message.content
    assert text == plain_text(smollm_path, QUESTION, 48)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage is not None
    assert answer.usage.completion_tokens > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    extra = answer.model_extra or {}
    stats, timings = extra["stats"], extra["timings"]
    assert stats["total_draft_tokens_count"] == (
        stats["accepted_draft_tokens_count"]
        + stats["rejected_draft_tokens_count"]
        + stats["ignored_draft_tokens_count"]
    )
    assert stats["tokens_per_second"] > 0
    assert stats["stop_reason"] in ("eosFound", "maxPredictedTokensReached")
    assert timings["draft_n"] == stats["total_draft_tokens_count"]
    assert timings["draft_n_accepted"] == stats["accepted_draft_tokens_count"]
    assert timings["predicted_n"] == answer.usage.completion_tokens


def collect_stream(server: Served, **request: Any) -> tuple[str, list[dict[str, Any]], list[Any]]:
    """Text, token origins and chunks of a streamed chat answer."""
    chunks = list(
        server.client().chat.completions.create(
            model="SmolLM2-135M-Instruct.Q4_1", stream=True, **request
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tokens = [
        t for c in chunks for t in ((c.model_extra or {}).get("specdeck") or {}).get("tokens", [])
    ]
    return text, tokens, chunks


def test_a_streamed_answer_marks_which_tokens_the_draft_made(server: Served) -> None:
    rewrite = "Repeat this line exactly: the quick brown fox jumps over the lazy dog, twice."
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": rewrite}]
    # The draft model forced every round: whether auto drafts a 10-token answer depends on
    # this machine's costs, and this test is about the origins of drafted tokens.
    text, tokens, chunks = collect_stream(
        server,
        messages=messages,
        max_tokens=64,
        temperature=0,
        stream_options={"include_usage": True},
        extra_body={"specdeck": {"method": "draft-model", "p_min": 0.0}},
    )
    whole = server.client().chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1",
        messages=messages,
        max_tokens=64,
        temperature=0,
    )
    assert text == whole.choices[0].message.content
    assert "".join(t["text"] for t in tokens) == text
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1
    stats = (finals[0].model_extra or {})["stats"]
    drafted = sum(t["origin"] == "draft" for t in tokens)
    # An accepted end-of-generation token is counted as accepted but never sent as text.
    unsent = stats["accepted_draft_tokens_count"] - drafted
    assert unsent == 0 or (unsent == 1 and stats["stop_reason"] == "eosFound")
    assert drafted > 0  # the draft model drafted every round
    assert {t["origin"] for t in tokens} <= {"draft", "target"}
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage is not None
    assert usage.completion_tokens == len(tokens)


def test_stop_strings_and_seeds(server: Served) -> None:
    client = server.client()
    stopped = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1",
        messages=MESSAGES,
        max_tokens=64,
        stop=["\n"],
    )
    assert "\n" not in (stopped.choices[0].message.content or "")
    assert stopped.choices[0].finish_reason == "stop"
    assert (stopped.model_extra or {})["stats"]["stop_reason"] == "stopStringFound"
    sampled = [
        client.chat.completions.create(
            model="SmolLM2-135M-Instruct.Q4_1",
            messages=MESSAGES,
            max_tokens=32,
            temperature=1.0,
            seed=seed,
        )
        .choices[0]
        .message.content
        for seed in (7, 7, 8, 9)
    ]
    assert sampled[0] == sampled[1]
    assert len(set(sampled[1:])) > 1
    # A seed's answer is the main model's own sample: the same with speculation off.
    plain = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1",
        messages=MESSAGES,
        max_tokens=32,
        temperature=1.0,
        seed=7,
        extra_body={"specdeck": {"method": "off"}},
    )
    assert plain.choices[0].message.content == sampled[0]


def test_the_completions_endpoint_takes_a_raw_prompt(server: Served) -> None:
    client = server.client()
    answer = client.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", prompt="def add(a, b):\n", max_tokens=24, temperature=0
    )
    assert answer.object == "text_completion"
    assert answer.choices[0].text
    streamed = client.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1",
        prompt="def add(a, b):\n",
        max_tokens=24,
        temperature=0,
        stream=True,
    )
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == (
        answer.choices[0].text
    )


def test_two_clients_at_once_each_get_their_own_answer(server: Served) -> None:
    prompts = ["Name three colours.", "Write a haiku about rain."]
    alone = [
        collect_stream(
            server, messages=[{"role": "user", "content": p}], max_tokens=40, temperature=0
        )[0]
        for p in prompts
    ]
    together: dict[int, str] = {}

    def ask(index: int) -> None:
        together[index] = collect_stream(
            server,
            messages=[{"role": "user", "content": prompts[index]}],
            max_tokens=40,
            temperature=0,
        )[0]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert [together[0], together[1]] == alone


def test_a_client_leaving_mid_stream_cancels_its_generation(server: Served) -> None:
    counting: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Count from 1 to 2000, one number per line."}
    ]
    body = json.dumps(
        {"messages": counting, "max_tokens": 3000, "stream": True, "specdeck": {"method": "off"}}
    ).encode()
    cancelled = server.status()["cancelled"]
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request(
        "POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: ")
    connection.close()  # the client goes away after its first chunk
    deadline = time.monotonic() + 10
    while server.status()["queued"] and time.monotonic() < deadline:
        time.sleep(0.1)
    status = server.status()
    assert status["queued"] == 0, "the abandoned generation kept running"
    assert status["cancelled"] == cancelled + 1
    answer = server.client().chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", messages=MESSAGES, max_tokens=8
    )
    assert answer.choices[0].message.content


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "not valid JSON"),
        (json.dumps({"max_tokens": 8}).encode(), 400, "'messages' is required"),
        (json.dumps({"messages": MESSAGES, "model": "gpt-4o"}).encode(), 404, "is not loaded"),
        (json.dumps({"messages": MESSAGES, "n": 2}).encode(), 400, "only n = 1"),
        (json.dumps({"messages": MESSAGES, "draft_model": "other"}).encode(), 404, "draft model"),
        (json.dumps({"messages": MESSAGES, "model": 7}).encode(), 400, "'model' must be a string"),
        (json.dumps({"messages": MESSAGES, "max_tokens": 0}).encode(), 400, "max_tokens"),
        (json.dumps({"messages": MESSAGES, "temperature": -1}).encode(), 400, "temperature"),
        (json.dumps({"messages": [{"role": "robot", "content": "hi"}]}).encode(), 400, "role"),
        (
            json.dumps({"messages": MESSAGES, "specdeck": {"method": "fast"}}).encode(),
            400,
            "unknown speculation method",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "word " * 5000}]}).encode(),
            400,
            "but the context holds",
        ),
        (b"x" * (2 << 20), 413, "bytes"),
    ],
)
def test_bad_requests_get_openais_error_shape(
    server: Served, body: bytes, status: int, words: str
) -> None:
    got, answer = server.request(
        "POST", "/chat/completions", body, {"Content-Type": "application/json"}
    )
    assert got == status
    assert words in answer["error"]["message"]
    assert "\n" not in answer["error"]["message"]
    assert set(answer["error"]) == {"message", "type", "param", "code"}


def test_the_openai_client_sees_the_errors_as_its_own(server: Served) -> None:
    with pytest.raises(openai.BadRequestError, match="only n = 1"):
        server.client().chat.completions.create(
            model="SmolLM2-135M-Instruct.Q4_1",
            messages=MESSAGES,
            n=2,
        )
    got, answer = server.request("GET", "/nowhere")
    assert got == 404
    assert "no such endpoint" in answer["error"]["message"]


def test_response_format_and_grammar_shape_the_answer(server: Served) -> None:
    from tests.test_grammar import PERSON_PROMPT, PERSON_SCHEMA, assert_person

    client = server.client()
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": PERSON_PROMPT}]
    schema_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True},
    }
    answer = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1",
        messages=messages,
        max_tokens=200,
        temperature=0,
        response_format=schema_format,
    )
    content = answer.choices[0].message.content
    assert content is not None
    assert_person(content)
    assert answer.choices[0].finish_reason == "stop"
    stats = (answer.model_extra or {})["stats"]
    assert stats["grammar_tokens_count"] > 0  # the keys and quotes, with no drafting
    # Streamed, the same text.
    text, tokens, _chunks = collect_stream(
        server, messages=messages, max_tokens=200, temperature=0, response_format=schema_format
    )
    assert text == content
    assert {token["origin"] for token in tokens} >= {"grammar", "target"}
    # Any JSON object; llama.cpp's GBNF grammar field.
    answer = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1",
        messages=messages,
        max_tokens=160,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)
    answer = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1",
        messages=[{"role": "user", "content": "Is the sky blue? Answer yes or no."}],
        max_tokens=8,
        temperature=0,
        extra_body={"grammar": 'root ::= "yes" | "no"'},
    )
    assert answer.choices[0].message.content in ("yes", "no")


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 1}}}},
            "response_format",
            "invalid json schema",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "'text', 'json_object'"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "schema"),
        ({"grammar": "root ::= ("}, "grammar", "invalid gbnf: Expected ')'"),
        ({"grammar": "x", "response_format": {"type": "text"}}, "grammar", "not both"),
        (  # a keyword llguidance does not implement
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"not": {}}}}},
            "response_format",
            'Unimplemented keys: ["not"]',
        ),
        ({"grammar": 'root ::= "ab" root'}, None, "the grammar cannot take token"),  # no end
    ],
)
def test_a_bad_schema_or_grammar_is_a_400_naming_it(
    server: Served, fields: dict[str, Any], param: str | None, words: str
) -> None:
    body = json.dumps({"messages": MESSAGES, "max_tokens": 8, **fields}).encode()
    got, answer = server.request(
        "POST", "/chat/completions", body, {"Content-Type": "application/json"}
    )
    assert got == 400
    assert words in answer["error"]["message"]
    assert answer["error"]["param"] == param
    assert "\n" not in answer["error"]["message"]


def test_an_error_after_the_headers_is_said_in_the_stream_and_the_server_goes_on(
    server: Served,
) -> None:
    """A grammar that can never finish fails at its first token, the stream's headers sent:
    the stream ends with OpenAI's error object, and the next request is answered."""
    body = json.dumps(
        {"messages": MESSAGES, "max_tokens": 8, "stream": True, "grammar": 'root ::= "ab" root'}
    ).encode()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    events = response.read()
    connection.close()
    assert response.status == 200
    last = events.strip().split(b"\n\n")[-1]
    assert last.startswith(b"data: ")
    error = json.loads(last[len(b"data: ") :])["error"]
    assert error["message"].startswith("the grammar cannot take token")
    answer = server.client().chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", messages=MESSAGES, max_tokens=2
    )
    assert answer.choices[0].finish_reason in ("length", "stop")


def test_curl_streams_server_sent_events(server: Served) -> None:
    body = json.dumps({"messages": MESSAGES, "max_tokens": 16, "stream": True})
    done = subprocess.run(
        [
            "curl",
            "-sN",
            f"{server.base_url}/chat/completions",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    events = [line for line in done.stdout.splitlines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"


# -- without a live model ----------------------------------------------------------------


@contextmanager
def in_thread(api: ApiServer) -> Iterator[int]:
    """Serve ``api`` on a free port from a thread with its own event loop."""
    from aiohttp import web

    loop = asyncio.new_event_loop()
    runner = web.AppRunner(api.app, handle_signals=False)
    port = free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def call(
    port: int, method: str, path: str, body: Any = None, key: str | None = None
) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    connection.request(
        method, "/v1" + path, body=None if body is None else json.dumps(body), headers=headers
    )
    response = connection.getresponse()
    data = json.loads(response.read() or b"null")
    connection.close()
    return response.status, data


def test_requests_while_the_models_load_or_after_a_failed_load_get_503() -> None:
    release = threading.Event()

    def load() -> Any:
        release.wait(30)
        raise RuntimeError("the GGUF file is truncated")

    worker = PairWorker(load, method="auto")
    worker.start()
    with in_thread(ApiServer(worker)) as port:
        status, answer = call(port, "POST", "/chat/completions", {"messages": MESSAGES})
        assert status == 503
        assert "still loading" in answer["error"]["message"]
        release.set()
        deadline = time.monotonic() + 10
        while worker.unavailable == "the models are still loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        status, answer = call(port, "POST", "/chat/completions", {"messages": MESSAGES})
        assert status == 503
        assert "could not be loaded: the GGUF file is truncated" in answer["error"]["message"]
        status, models = call(port, "GET", "/models")
        assert status == 200
        assert models["data"] == []


def test_an_api_key_is_required_when_set_and_for_other_addresses() -> None:
    with pytest.raises(SettingsError, match="give an API key"):
        ServerSettings(host="0.0.0.0")
    assert ServerSettings(host="0.0.0.0", api_key="k").host == "0.0.0.0"
    worker = PairWorker(lambda: threading.Event().wait(30), method="auto")
    with in_thread(ApiServer(worker, ServerSettings(api_key="secret"))) as port:
        assert call(port, "GET", "/models")[0] == 401
        status, answer = call(port, "GET", "/models", key="wrong")
        assert status == 401
        assert answer["error"]["code"] == "invalid_api_key"
        assert call(port, "GET", "/models", key="secret")[0] == 200


def test_serve_refuses_other_addresses_without_a_key(smollm_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPECDECK_API_KEY"}
    done = subprocess.run(
        [str(SPECDECK), "serve", "--host", "0.0.0.0", "--main", str(smollm_path), "--no-draft"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "give an API key" in lines[0]


def test_cors_is_off_unless_origins_are_given() -> None:
    def headers(api: ApiServer, method: str) -> tuple[int, dict[str, str]]:
        with in_thread(api) as port:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            connection.request(method, "/v1/models", headers={"Origin": "http://editor.local"})
            response = connection.getresponse()
            response.read()
            connection.close()
            return response.status, dict(response.getheaders())

    idle = PairWorker(lambda: threading.Event().wait(30), method="auto")
    status, plain = headers(ApiServer(idle), "GET")
    assert status == 200
    assert "Access-Control-Allow-Origin" not in plain
    assert headers(ApiServer(idle), "OPTIONS")[0] == 405
    cors = ServerSettings(cors_origins=("http://editor.local",))
    status, preflight = headers(ApiServer(idle, cors), "OPTIONS")
    assert status == 204
    assert preflight["Access-Control-Allow-Origin"] == "http://editor.local"
    allowed = headers(ApiServer(idle, cors), "GET")[1]
    assert allowed["Access-Control-Allow-Origin"] == "http://editor.local"


@pytest.mark.parametrize("problem", ["missing", "corrupt", "incompatible"])
def test_serve_names_a_bad_model_in_one_line_before_listening(
    problem: str, smollm_path: Path, gemma_path: Path, tmp_path: Path
) -> None:
    corrupt = tmp_path / "broken.gguf"
    corrupt.write_bytes(b"not a model at all")
    models = {
        "missing": ["--main", str(tmp_path / "gone.gguf"), "--no-draft"],
        "corrupt": ["--main", str(corrupt), "--no-draft"],
        "incompatible": ["--main", str(smollm_path), "--draft", str(gemma_path)],
    }[problem]
    done = subprocess.run(
        [str(SPECDECK), "serve", "--port", str(free_port()), *models],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    words = {"missing": "not found", "corrupt": "not a GGUF", "incompatible": "incompatible pair"}
    assert words[problem] in lines[0]
    assert "listening" not in done.stderr


# -- serve's generation flags, on the real pair in this process -----------------------------


class PairInProcess:
    """``specdeck serve``'s worker on the SmolLM pair, and the settings each job ran with."""

    def __init__(self, smollm_path: Path) -> None:
        self.ran: queue.Queue[GenerationSettings] = queue.Queue()
        request = LoadRequest(
            str(smollm_path), str(smollm_path), method="draft-model", n_ctx=TEST_CONTEXT
        )

        def load() -> tuple[LoadedPair, ServedModel, ServedModel]:
            pair = open_pair(request)
            served = ServedModel.of(str(smollm_path), pair.main.name)
            return pair, served, served  # the same file serves as main and draft

        self.worker = PairWorker(
            load, method="draft-model", on_finished=lambda job, _: self.ran.put(job.settings)
        )

    def answer(self, flags: list[str], body: dict[str, Any]) -> tuple[GenerationSettings, Any]:
        """Ask an API with serve's defaults for these flags; the settings the job ran with."""
        api = ApiServer(
            self.worker, ServerSettings(), generation_defaults(build_parser().parse_args(flags))
        )
        with in_thread(api) as port:
            status, answer = call(port, "POST", "/chat/completions", {"messages": MESSAGES, **body})
        assert status == 200, answer
        return self.ran.get(timeout=60), answer


@pytest.fixture(scope="module")
def in_process(smollm_path: Path) -> Iterator[PairInProcess]:
    pair = PairInProcess(smollm_path)
    pair.worker.start()
    deadline = time.monotonic() + 120
    while pair.worker.unavailable is not None:
        assert "could not be loaded" not in pair.worker.unavailable, pair.worker.unavailable
        assert time.monotonic() < deadline, "the pair did not load"
        time.sleep(0.05)
    yield pair
    pair.worker.stop()


def test_a_request_seed_gets_sample_match_unless_serve_or_the_request_says_otherwise(
    in_process: PairInProcess,
) -> None:
    seeded = {"max_tokens": 6, "temperature": 1.0, "seed": 7}
    settings, _ = in_process.answer([], seeded)
    assert settings.verification == "sample-match"
    assert settings.sampling.seed == 7
    settings, _ = in_process.answer([], {"max_tokens": 6, "temperature": 1.0})
    assert settings.verification == "rejection"
    settings, _ = in_process.answer(["--verification", "rejection"], seeded)
    assert settings.verification == "rejection"
    asked = {**seeded, "specdeck": {"verification": "sample-match"}}
    settings, _ = in_process.answer(["--verification", "rejection"], asked)
    assert settings.verification == "sample-match"


def test_serves_batch_and_sibling_flags_reach_the_generation(in_process: PairInProcess) -> None:
    settings, _ = in_process.answer([], {"max_tokens": 6, "temperature": 0})
    assert (settings.exact_batches, settings.sibling_branches) == (True, False)
    settings, answer = in_process.answer(
        ["--fast-batches", "--sibling-branches"], {"max_tokens": 6, "temperature": 0}
    )
    assert (settings.exact_batches, settings.sibling_branches) == (False, True)
    assert answer["choices"][0]["message"]["content"]


def test_serves_sampling_defaults_reach_the_generation_under_a_requests_own(
    in_process: PairInProcess,
) -> None:
    flags = ["--max-tokens", "3", "--temperature", "0.8", "--top-k", "40", "--seed", "5"]
    settings, answer = in_process.answer(flags, {})
    assert settings.max_tokens == 3
    assert answer["usage"]["completion_tokens"] <= 3
    assert (settings.sampling.temperature, settings.sampling.top_k) == (0.8, 40)
    assert settings.sampling.seed == 5
    assert settings.verification == "sample-match"  # serve's seed is a seed like a request's
    again, repeated = in_process.answer(flags, {})
    assert again == settings
    assert repeated["choices"] == answer["choices"]
    settings, _ = in_process.answer(flags, {"max_tokens": 5, "temperature": 0, "seed": None})
    assert (settings.max_tokens, settings.sampling.temperature) == (5, 0.0)
    assert settings.sampling.seed == 5  # a null field says nothing
