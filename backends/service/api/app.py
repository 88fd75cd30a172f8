"""The aiohttp application: routes, the API key, CORS, and the handlers that answer requests.

A completion handler parses its request (:mod:`.parsing`), submits a job to the backend
(:mod:`.jobs`) and writes the job's events back in OpenAI's wire format (:mod:`.wire`),
whole or streamed; where the request offers tools, the answer's calls are read out of its
text (:mod:`.tool_calls`). ``/v1/responses`` is the same request in the Responses API's
words (:mod:`.responses`), answered as a response object or its stream of events.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from backends.errors import SettingsError
from backends.service.api.errors import ApiError
from backends.service.api.jobs import MAX_QUEUED_REQUESTS, ApiJob, JobFailed
from backends.service.api.openapi import openapi_document
from backends.service.api.parsing import parse_request
from backends.service.api.responses import ResponseAnswer, ResponseStream, chat_body
from backends.service.api.tool_calls import ToolCallReader
from backends.service.api.wire import (
    Answer,
    finish_reason,
    llama_timings,
    lmstudio_stats,
    origins,
    sse,
    tool_call_dicts,
    usage,
)
from backends.service.generation_options import GenerationOptions
from backends.service.protocol import DEFAULT_API_HOST, DEFAULT_API_PORT, is_loopback_host
from backends.speculation.methods import METHODS
from backends.speculation.types import GenerationUpdate, SpeculationStats
from backends.version import app_version

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from backends.engines.interface import ToolCall
    from backends.service.api.jobs import GenerationBackend, JobEvent
    from backends.service.api.parsing import Endpoint, ParsedRequest

log = logging.getLogger("backends.service.api")

DEFAULT_HOST = DEFAULT_API_HOST
DEFAULT_PORT = DEFAULT_API_PORT
MAX_BODY_BYTES = 1 << 20


@dataclass(frozen=True)
class ServerSettings:
    """Where the API listens and who may use it."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    max_queued: int = MAX_QUEUED_REQUESTS

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise SettingsError(f"the port must be between 0 and 65535, got {self.port}")
        if not self.api_key and not is_loopback_host(self.host):
            raise SettingsError(
                f"listening on {self.host} lets other machines in: give an API key "
                "(--api-key) or listen on 127.0.0.1"
            )
        if self.max_queued < 1:
            raise SettingsError(f"the queue must hold at least 1 request, got {self.max_queued}")


class ApiServer:
    """The aiohttp application over one backend.

    ``defaults`` are the generation options a request's own fields override
    (``specdeck serve``'s flags); none: the backends' defaults.
    """

    def __init__(
        self,
        backend: GenerationBackend,
        settings: ServerSettings | None = None,
        defaults: GenerationOptions | None = None,
    ) -> None:
        self.backend = backend
        self.settings = settings or ServerSettings()
        self.defaults = defaults or GenerationOptions()
        self.app = web.Application(
            client_max_size=MAX_BODY_BYTES, middlewares=[self._errors, self._auth]
        )
        # Before any response's headers go out, streamed ones included.
        self.app.on_response_prepare.append(self._add_cors_headers)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_post("/v1/completions", self._completion)
        self.app.router.add_post("/v1/responses", self._responses)
        self.app.router.add_get("/openapi.json", self._openapi)
        if self.settings.cors_origins:
            self.app.router.add_route("OPTIONS", "/{tail:.*}", self._preflight)

    # -- middleware --------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except ApiError as error:
            return error.response()
        except web.HTTPRequestEntityTooLarge:
            return ApiError(413, f"the request body is over {MAX_BODY_BYTES} bytes").response()
        except web.HTTPNotFound:
            return ApiError(404, f"no such endpoint: {request.path}").response()
        except web.HTTPMethodNotAllowed:
            return ApiError(405, f"{request.method} is not allowed on {request.path}").response()

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        key = self.settings.api_key
        given = request.headers.get("Authorization", "")
        if key and request.method != "OPTIONS" and not hmac.compare_digest(given, f"Bearer {key}"):
            raise ApiError(
                401,
                "missing or wrong API key (send Authorization: Bearer <key>)",
                error_type="authentication_error",
                code="invalid_api_key",
            )
        response: web.StreamResponse = await handler(request)
        return response

    async def _add_cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        allowed = self.settings.cors_origins
        if origin and ("*" in allowed or origin in allowed):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"

    async def _preflight(self, request: web.Request) -> web.Response:
        return web.Response(status=204)  # _add_cors_headers adds the headers

    # -- endpoints ---------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        backend = self.backend
        data = []
        for model, role in ((backend.main, "main"), (backend.draft, "draft")):
            if model is not None:
                data.append(
                    {
                        "id": model.id,
                        "object": "model",
                        "created": 0,
                        "owned_by": "local",
                        "specdeck": {"role": role, "name": model.name, "path": model.path},
                    }
                )
        status = {
            "method": backend.method,
            "methods": list(METHODS),
            "queued": backend.counts.queued,
            "served": backend.counts.served,
            "cancelled": backend.counts.cancelled,
            "n_ctx": backend.n_ctx,
            "unavailable": backend.unavailable,
            "notes": [
                "/v1/responses is stateless: no response is stored (store is always false), "
                "so previous_response_id is refused; send the whole conversation in 'input'",
            ],
        }
        return web.json_response({"object": "list", "data": data, "specdeck": status})

    async def _openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_document(app_version()))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "chat")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "completion")

    @staticmethod
    async def _body(request: web.Request) -> Any:
        try:
            return await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ApiError(400, f"the request body is not valid JSON ({error})") from None

    async def _started(self, parsed: ParsedRequest) -> tuple[asyncio.Queue[JobEvent], ApiJob]:
        """Submit the request's job and wait until it starts (its error raised, if it fails)."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[JobEvent] = asyncio.Queue()

        def deliver(event: JobEvent) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        job = ApiJob(
            parsed.messages,
            parsed.text,
            parsed.settings,
            parsed.method,
            deliver,
            tools=parsed.tools.offered if parsed.tools else (),
        )
        self.backend.submit(job)
        try:
            first = await events.get()
        except BaseException:
            job.cancel.set()
            raise
        if isinstance(first, JobFailed):
            raise first.error
        return events, job

    async def _complete(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        body = await self._body(request)
        parsed = parse_request(endpoint, body, self.backend, self.defaults)
        model = self.backend.main
        assert model is not None
        events, job = await self._started(parsed)
        try:
            answer = Answer(parsed.endpoint, model)
            if parsed.stream:
                return await self._stream(request, parsed, answer, events, job)
            return await self._whole(request, parsed, answer, events, job)
        finally:
            job.cancel.set()  # a no-op once finished; stops a job whose client went away

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        parsed = parse_request("chat", chat_body(body), self.backend, self.defaults)
        model = self.backend.main
        assert model is not None
        events, job = await self._started(parsed)
        try:
            answer = ResponseAnswer(body, model)
            if parsed.stream:
                return await self._stream_response(request, parsed, answer, events, job)
            return await self._whole_response(request, parsed, answer, events, job)
        finally:
            job.cancel.set()

    async def _updates(
        self, events: asyncio.Queue[JobEvent], request: web.Request, job: ApiJob
    ) -> AsyncIterator[GenerationUpdate]:
        while True:
            event = await events.get()
            if isinstance(event, JobFailed):
                raise event.error
            transport = request.transport
            if transport is None or transport.is_closing():
                job.cancel.set()  # the client went away: stop within a round
            if isinstance(event, GenerationUpdate):
                yield event
                if event.finished:
                    return

    def _tool_call_reader(self, parsed: ParsedRequest) -> ToolCallReader | None:
        """What reads the answer's tool calls, where the request offers tools."""
        if parsed.tools is None or not parsed.tools.offered:
            return None
        main = self.backend.main
        assert main is not None
        names = [function.name for function in parsed.tools.offered]
        markers = {token: text for text, token in main.tool_markers.items()}
        return ToolCallReader(main.tool_format, names, markers)

    async def _collected(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        events: asyncio.Queue[JobEvent],
        job: ApiJob,
    ) -> _Collected:
        """A whole answer: its content, its tool calls, each token's origin, the final stats."""
        texts: list[str] = []
        marked: list[str] = []  # the text with the tool-call markers' special tokens written out
        tokens: list[dict[str, Any]] = []
        stats = SpeculationStats()
        reader = self._tool_call_reader(parsed)
        async for update in self._updates(events, request, job):
            texts.extend(token.text for token in update.tokens)
            if reader is not None:
                marked.append(reader.text_of(update.tokens))
            tokens.extend(origins(update))
            stats = update.stats
        text = "".join(texts)
        calls: list[ToolCall] = []
        if reader is not None:
            content, calls = reader.feed("".join(marked))
            rest, more = reader.finish()
            calls += more
            text = (content + rest).strip() if calls else content + rest
        return _Collected(text, calls, tokens, stats)

    def _round_text(
        self, reader: ToolCallReader | None, update: GenerationUpdate
    ) -> tuple[str, list[ToolCall]]:
        """A streamed round's content to send and the tool calls it completed."""
        if reader is None:
            return "".join(token.text for token in update.tokens), []
        text, calls = reader.feed(reader.text_of(update.tokens))
        if update.finished:
            rest, more = reader.finish()
            text, calls = text + rest, calls + more
        return text, calls

    async def _whole(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        answer: Answer,
        events: asyncio.Queue[JobEvent],
        job: ApiJob,
    ) -> web.Response:
        whole = await self._collected(request, parsed, events, job)
        text, calls, tokens, stats = whole.text, whole.calls, whole.tokens, whole.stats
        body = answer.envelope(chunk=False)
        body["choices"] = [
            answer.choice(
                text,
                finish_reason(stats, called=bool(calls)),
                chunk=False,
                first=True,
                tool_calls=tool_call_dicts(calls),
            )
        ]
        body["usage"] = usage(stats)
        body["stats"] = lmstudio_stats(stats, self.backend.draft)
        body["timings"] = llama_timings(stats)
        body["specdeck"] = {"tokens": tokens}
        return web.json_response(body)

    async def _stream(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        answer: Answer,
        events: asyncio.Queue[JobEvent],
        job: ApiJob,
    ) -> web.StreamResponse:
        response = await _event_stream(request)
        first = True
        stats = SpeculationStats()
        reader = self._tool_call_reader(parsed)
        called = 0
        # Headers are out: an error is said in the stream, as OpenAI does.
        async with _stream_guard(job, lambda error: response.write(sse(error.body()))):
            async for update in self._updates(events, request, job):
                stats = update.stats
                text, calls = self._round_text(reader, update)
                if update.tokens or first or calls:
                    chunk = answer.envelope(chunk=True)
                    chunk["choices"] = [
                        answer.choice(
                            text,
                            None,
                            chunk=True,
                            first=first,
                            tool_calls=tool_call_dicts(calls, first_index=called),
                        )
                    ]
                    chunk["specdeck"] = {"tokens": origins(update)}
                    await response.write(sse(chunk))
                    first = False
                called += len(calls)
            last = answer.envelope(chunk=True)
            last["choices"] = [
                answer.choice("", finish_reason(stats, called=called > 0), chunk=True, first=False)
            ]
            last["stats"] = lmstudio_stats(stats, self.backend.draft)
            last["timings"] = llama_timings(stats)
            await response.write(sse(last))
            if parsed.include_usage:
                tail = answer.envelope(chunk=True)
                tail["choices"] = []
                tail["usage"] = usage(stats)
                await response.write(sse(tail))
            await response.write(sse("[DONE]"))
        return response

    # -- the Responses API ---------------------------------------------------------------

    async def _whole_response(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        answer: ResponseAnswer,
        events: asyncio.Queue[JobEvent],
        job: ApiJob,
    ) -> web.Response:
        whole = await self._collected(request, parsed, events, job)
        answer.finished_output(whole.text, whole.calls)
        body = answer.response("completed", whole.stats, self.backend.draft)
        body["specdeck"]["tokens"] = whole.tokens
        return web.json_response(body)

    async def _stream_response(
        self,
        request: web.Request,
        parsed: ParsedRequest,
        answer: ResponseAnswer,
        events: asyncio.Queue[JobEvent],
        job: ApiJob,
    ) -> web.StreamResponse:
        response = await _event_stream(request)
        stream = ResponseStream(answer, response)
        await stream.send("response.created", response=answer.response("in_progress", None, None))
        await stream.send(
            "response.in_progress", response=answer.response("in_progress", None, None)
        )
        reader = self._tool_call_reader(parsed)
        stats = SpeculationStats()
        tokens: list[dict[str, Any]] = []
        async with _stream_guard(job, lambda error: stream.send("error", **error.body()["error"])):
            async for update in self._updates(events, request, job):
                stats = update.stats
                tokens.extend(origins(update))
                text, calls = self._round_text(reader, update)
                if text:
                    await stream.text(text)
                for call in calls:
                    await stream.call(call)
            await stream.close_message()
            final = answer.response("completed", stats, self.backend.draft)
            final["specdeck"]["tokens"] = tokens
            kind = (
                "response.incomplete" if final["status"] == "incomplete" else "response.completed"
            )
            await stream.send(kind, response=final)
        return response


@dataclass(frozen=True)
class _Collected:
    """A whole answer, as the handlers that answer at once write it."""

    text: str
    calls: list[ToolCall]
    tokens: list[dict[str, Any]]
    stats: SpeculationStats


@contextlib.asynccontextmanager
async def _stream_guard(
    job: ApiJob, say_error: Callable[[ApiError], Awaitable[object]]
) -> AsyncIterator[None]:
    """How a stream ends early: a departed client cancels its generation.

    An API error, the headers already sent, is said in the stream (``say_error``).
    """
    try:
        yield
    except ConnectionResetError:
        job.cancel.set()
        log.info("a client left mid-stream; its generation is cancelled")
    except asyncio.CancelledError:
        job.cancel.set()
        raise
    except ApiError as error:
        await say_error(error)


async def _event_stream(request: web.Request) -> web.StreamResponse:
    """A server-sent events response to ``request``, its headers sent."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    return response
