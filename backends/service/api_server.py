"""SpecDeck's OpenAI-compatible HTTP API: the loaded pair, served to other programs.

Endpoints, as OpenAI, LM Studio and llama.cpp's ``llama-server`` name them:
``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions``, streamed
(server-sent events ending in ``data: [DONE]``) or not. Every answer carries LM Studio's
``stats`` (tok/s, time to first token, the four draft-token counts, the stop reason) and
llama.cpp's ``timings`` (``predicted_per_second``, ``draft_n``, ``draft_n_accepted``);
every streamed chunk carries, in a ``specdeck`` field, who produced each of its tokens
(``draft``: drafted and accepted; ``target``: the main model's own), so that a client can
colour accepted draft tokens as the window does.

Requests go to one :class:`GenerationBackend` that generates one at a time (a queue;
its length is in ``/v1/models``'s ``specdeck`` field). aiohttp serves them: one
well-kept package brings the server, streamed responses and a test client, with no ASGI
stack to assemble, and its handlers notice a client that went away on the next write, so
a dropped stream cancels its generation within one round.

Safe by default: the server binds 127.0.0.1; another address needs an API key, and with
a key every request without ``Authorization: Bearer <key>`` gets 401. Bodies are bounded
(1 MiB), ``max_tokens`` by the context, and CORS is off unless origins are given. Bad
requests get OpenAI's error shape (``{"error": {"message", "type", "param", "code"}}``)
and a 4xx status with a one-line message.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from aiohttp import web

from backends.engines.interface import ChatMessage
from backends.errors import ContextOverflowError, SettingsError, SpecDeckError
from backends.service.protocol import DEFAULT_API_HOST, DEFAULT_API_PORT, is_loopback_host
from backends.speculation.methods import METHODS, parse_method
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import (
    GenerationSettings,
    GenerationUpdate,
    SpeculationStats,
    StopReason,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from backends.service.loaded_pair import LoadedPair
    from backends.speculation.methods import SpeculationMethod

log = logging.getLogger(__name__)

DEFAULT_HOST = DEFAULT_API_HOST
DEFAULT_PORT = DEFAULT_API_PORT
MAX_BODY_BYTES = 1 << 20
MAX_QUEUED_REQUESTS = 16
MAX_STOP_STRINGS = 4  # as OpenAI allows

Endpoint = Literal["chat", "completion"]

# OpenAI's finish reasons for SpecDeck's stop reasons.
_FINISH_REASONS: dict[StopReason, str] = {
    "eos": "stop",
    "stop_string": "stop",
    "max_tokens": "length",
    "context_full": "length",
    "cancelled": "stop",
}
# LM Studio's stop reasons (its REST API's stats.stop_reason).
_LMSTUDIO_STOP_REASONS: dict[StopReason, str] = {
    "eos": "eosFound",
    "stop_string": "stopStringFound",
    "max_tokens": "maxPredictedTokensReached",
    "context_full": "contextLengthReached",
    "cancelled": "userStopped",
}


class ApiError(Exception):
    """A request the API refuses: an HTTP status and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param
        self.code = code

    def response(self) -> web.Response:
        """The error as OpenAI shapes it."""
        body = {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }
        return web.json_response(body, status=self.status)


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


@dataclass(frozen=True)
class ServedModel:
    """A model the API answers with: its id, display name and file."""

    id: str
    name: str
    path: str

    def is_named_by(self, text: str) -> bool:
        """Whether a request's ``model`` or ``draft_model`` field means this model."""
        return text in (self.id, self.name, self.path)

    @classmethod
    def of(cls, path: str, name: str) -> ServedModel:
        """How the API names a loaded model: its file or folder name without ``.gguf``."""
        stem = Path(path).name
        if stem.lower().endswith(".gguf"):
            stem = stem[: -len(".gguf")]
        return cls(id=stem, name=name, path=path)


# -- jobs: what the HTTP side hands the generating side ----------------------------------


@dataclass(frozen=True)
class JobStarted:
    """The prompt fits and generation begins."""

    prompt_tokens: int


@dataclass(frozen=True)
class JobFailed:
    """The job could not run (an ApiError to send as it is)."""

    error: ApiError


JobEvent = JobStarted | GenerationUpdate | JobFailed


@dataclass
class ApiJob:
    """One request for the backend: what to generate and where its events go.

    ``deliver`` is called on the backend's thread; ``cancel`` is set by the HTTP side when
    the client went away.
    """

    messages: tuple[ChatMessage, ...] | None  # chat completions
    text: str | None  # completions: a raw prompt, no chat template
    settings: GenerationSettings
    method: SpeculationMethod | None
    deliver: Callable[[JobEvent], None]
    cancel: threading.Event = field(default_factory=threading.Event)


class GenerationBackend(Protocol):
    """What the API needs from whatever holds the loaded pair."""

    @property
    def main(self) -> ServedModel | None:
        """The loaded main model (None while none is loaded)."""
        ...

    @property
    def draft(self) -> ServedModel | None:
        """The loaded draft model, if any."""
        ...

    @property
    def n_ctx(self) -> int:
        """The main model's context size (0 while none is loaded)."""
        ...

    @property
    def method(self) -> SpeculationMethod:
        """The speculation method requests get unless they ask for another."""
        ...

    @property
    def counts(self) -> RequestCounts:
        """Requests waiting or running, and how those that ran ended."""
        ...

    @property
    def unavailable(self) -> str | None:
        """Why no request can run now (loading, failed), or None."""
        ...

    def submit(self, job: ApiJob) -> None:
        """Queue a job; raises ApiError when it cannot be queued."""
        ...


# -- reading requests ----------------------------------------------------------------------


def _number(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ApiError(400, f"'{key}' must be a {kind.__name__}", param=key)
    if isinstance(value, float) and not math.isfinite(value):
        raise ApiError(400, f"'{key}' must be a finite number", param=key)
    return value


def _content_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ApiError(
                    400, f"messages[{index}]: only text content is supported", param="messages"
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ApiError(400, f"messages[{index}].content must be a string", param="messages")


def parse_messages(raw: Any) -> tuple[ChatMessage, ...]:
    """OpenAI's ``messages`` as chat messages (system, user, assistant; developer = system)."""
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    messages = []
    for index, message in enumerate(raw):
        if not isinstance(message, dict):
            raise ApiError(400, f"messages[{index}] must be an object", param="messages")
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise ApiError(
                400, f"messages[{index}].role must be system, user or assistant", param="messages"
            )
        messages.append(ChatMessage(role, _content_text(message.get("content"), index)))
    return tuple(messages)


def _speculation(body: dict[str, Any], defaults: GenerationSettings) -> dict[str, Any]:
    """Speculation options: SpecDeck's ``specdeck`` object, or llama.cpp's dotted keys."""
    extension = body.get("specdeck") or {}
    if not isinstance(extension, dict):
        raise ApiError(400, "'specdeck' must be an object", param="specdeck")
    options: dict[str, Any] = {}
    for key, dotted, kind in (
        ("draft_max", "speculative.n_max", int),
        ("draft_min", "speculative.n_min", int),
        ("p_min", "speculative.p_min", float),
        ("lookup_draft_max", None, int),
    ):
        if key in extension:
            options[key] = _number(extension, key, kind, None)
        elif dotted is not None and dotted in body:
            options[key] = _number(body, dotted, kind, None)
    verification = extension.get("verification")
    if verification is not None:
        if verification not in ("rejection", "sample-match"):
            raise ApiError(
                400,
                "'specdeck.verification' must be 'rejection' or 'sample-match'",
                param="specdeck.verification",
            )
        options["verification"] = verification
    elif body.get("seed") is not None:
        # A seed asks for a reproducible answer: sample-match verification gives the main
        # model's own sample for that seed, whatever was drafted (rejection sampling's
        # answer also depends on the drafts).
        options["verification"] = "sample-match"
    method = extension.get("method")
    if method is not None:
        if not isinstance(method, str):
            raise ApiError(400, "'specdeck.method' must be a string", param="specdeck.method")
        try:
            options["method"] = parse_method(method)
        except SettingsError as error:
            raise ApiError(400, str(error), param="specdeck.method") from None
    return options


@dataclass(frozen=True)
class ParsedRequest:
    """A completion request, checked."""

    endpoint: Endpoint
    messages: tuple[ChatMessage, ...] | None
    text: str | None
    settings: GenerationSettings
    method: SpeculationMethod | None
    stream: bool
    include_usage: bool


def parse_request(
    endpoint: Endpoint, body: Any, backend: GenerationBackend, defaults: GenerationSettings
) -> ParsedRequest:
    """Check a completion request against the loaded models; ApiError when it is bad."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    main = backend.main
    if main is None:
        raise ApiError(503, backend.unavailable or "no model is loaded", error_type="server_error")
    model = body.get("model")
    if model is not None and (not isinstance(model, str) or not main.is_named_by(model)):
        raise ApiError(
            400,
            f"model {model!r} is not loaded; this server answers with {main.id!r}",
            param="model",
            code="model_not_found",
        )
    draft_model = body.get("draft_model")
    if draft_model is not None:
        draft = backend.draft
        if not isinstance(draft_model, str) or draft is None or not draft.is_named_by(draft_model):
            loaded = f"the loaded draft is {draft.id!r}" if draft else "no draft model is loaded"
            raise ApiError(
                400,
                f"draft model {draft_model!r} is not loaded; {loaded}",
                param="draft_model",
                code="model_not_found",
            )
    if _number(body, "n", int, 1) != 1:
        raise ApiError(400, "only n = 1 is supported (one answer per request)", param="n")
    messages: tuple[ChatMessage, ...] | None = None
    text: str | None = None
    if endpoint == "chat":
        if "messages" not in body:
            raise ApiError(400, "'messages' is required", param="messages")
        messages = parse_messages(body["messages"])
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise ApiError(400, "'prompt' must be a non-empty string", param="prompt")
        text = prompt
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise ApiError(400, "'stop' must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
        raise ApiError(400, f"'stop' takes 1 to {MAX_STOP_STRINGS} non-empty strings", param="stop")
    limit = max(1, backend.n_ctx)
    max_tokens = _number(body, "max_completion_tokens", int, None)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", int, defaults.max_tokens)
    if not 1 <= max_tokens <= limit:
        raise ApiError(
            400,
            f"'max_tokens' must be between 1 and the context size ({limit})",
            param="max_tokens",
        )
    sampling = defaults.sampling
    try:
        sampling = SamplingSettings(
            temperature=_number(body, "temperature", float, sampling.temperature),
            top_k=_number(body, "top_k", int, sampling.top_k),
            top_p=_number(body, "top_p", float, sampling.top_p),
            min_p=_number(body, "min_p", float, sampling.min_p),
            seed=_number(body, "seed", int, sampling.seed),
        )
        speculation = _speculation(body, defaults)
        method = speculation.pop("method", None)
        settings = replace(
            defaults, max_tokens=max_tokens, sampling=sampling, stop_strings=stops, **speculation
        )
    except SettingsError as error:
        raise ApiError(400, str(error)) from None
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false", param="stream")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options")
    return ParsedRequest(
        endpoint,
        messages,
        text,
        settings,
        method,
        stream,
        bool(stream_options.get("include_usage", False)),
    )


# -- writing answers -----------------------------------------------------------------------


def lmstudio_stats(stats: SpeculationStats, draft: ServedModel | None) -> dict[str, Any]:
    """LM Studio's ``stats`` object (its REST API's names)."""
    result: dict[str, Any] = {
        "tokens_per_second": stats.tokens_per_second,
        "time_to_first_token": stats.time_to_first_token_sec,
        "generation_time": stats.generation_seconds,
        "stop_reason": _LMSTUDIO_STOP_REASONS.get(stats.stop_reason or "eos", "eosFound"),
        "total_draft_tokens_count": stats.total_draft_tokens_count,
        "accepted_draft_tokens_count": stats.accepted_draft_tokens_count,
        "rejected_draft_tokens_count": stats.rejected_draft_tokens_count,
        "ignored_draft_tokens_count": stats.ignored_draft_tokens_count,
    }
    if draft is not None:
        result["draft_model"] = draft.id
    return result


def llama_timings(stats: SpeculationStats) -> dict[str, Any]:
    """llama.cpp server's ``timings`` object."""
    prompt_ms = 1000.0 * (stats.time_to_first_token_sec or 0.0)
    predicted_ms = 1000.0 * stats.generation_seconds
    return {
        "prompt_n": stats.prompt_tokens,
        "prompt_ms": prompt_ms,
        "prompt_per_second": stats.prompt_tokens / (prompt_ms / 1000.0) if prompt_ms else 0.0,
        "predicted_n": stats.generated_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / max(1, stats.generated_tokens - 1),
        "predicted_per_second": stats.tokens_per_second,
        "draft_n": stats.total_draft_tokens_count,
        "draft_n_accepted": stats.accepted_draft_tokens_count,
    }


def usage(stats: SpeculationStats) -> dict[str, int]:
    """OpenAI's token counts."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
    }


def origins(update: GenerationUpdate) -> list[dict[str, Any]]:
    """Each released token of a round: id, text and who produced it."""
    return [
        {"id": token.token_id, "text": token.text, "origin": token.origin.value}
        for token in update.tokens
    ]


class _Answer:
    """The response envelope shared by a request's chunks or its one body."""

    def __init__(self, parsed: ParsedRequest, model: ServedModel) -> None:
        self.parsed = parsed
        self.model = model
        prefix = "chatcmpl" if parsed.endpoint == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.object = "chat.completion" if parsed.endpoint == "chat" else "text_completion"

    def envelope(self, chunk: bool) -> dict[str, Any]:
        kind = self.object + (".chunk" if chunk and self.parsed.endpoint == "chat" else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model.id}

    def choice(self, text: str, finish: str | None, *, chunk: bool, first: bool) -> dict[str, Any]:
        if self.parsed.endpoint == "completion":
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if chunk:
            delta: dict[str, Any] = {"content": text}
            if first:
                delta["role"] = "assistant"
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        message = {"role": "assistant", "content": text}
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}


def _sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()


# -- the HTTP side --------------------------------------------------------------------------


class ApiServer:
    """The aiohttp application over one backend."""

    def __init__(
        self,
        backend: GenerationBackend,
        settings: ServerSettings | None = None,
        defaults: GenerationSettings | None = None,
    ) -> None:
        self.backend = backend
        self.settings = settings or ServerSettings()
        self.defaults = defaults or GenerationSettings()
        self.app = web.Application(
            client_max_size=MAX_BODY_BYTES, middlewares=[self._errors, self._auth]
        )
        # Before any response's headers go out, streamed ones included.
        self.app.on_response_prepare.append(self._add_cors_headers)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_post("/v1/completions", self._completion)
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
        }
        return web.json_response({"object": "list", "data": data, "specdeck": status})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "chat")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, "completion")

    async def _complete(self, request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
        try:
            body = await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ApiError(400, f"the request body is not valid JSON ({error})") from None
        parsed = parse_request(endpoint, body, self.backend, self.defaults)
        model = self.backend.main
        assert model is not None
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[JobEvent] = asyncio.Queue()

        def deliver(event: JobEvent) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        job = ApiJob(parsed.messages, parsed.text, parsed.settings, parsed.method, deliver)
        self.backend.submit(job)
        try:
            first = await events.get()
            if isinstance(first, JobFailed):
                raise first.error
            answer = _Answer(parsed, model)
            if parsed.stream:
                return await self._stream(request, answer, events, job)
            return await self._whole(request, answer, events, job)
        finally:
            job.cancel.set()  # a no-op once finished; stops a job whose client went away

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

    async def _whole(
        self, request: web.Request, answer: _Answer, events: asyncio.Queue[JobEvent], job: ApiJob
    ) -> web.Response:
        texts: list[str] = []
        tokens: list[dict[str, Any]] = []
        stats = SpeculationStats()
        async for update in self._updates(events, request, job):
            texts.extend(token.text for token in update.tokens)
            tokens.extend(origins(update))
            stats = update.stats
        finish = _FINISH_REASONS.get(stats.stop_reason or "eos", "stop")
        body = answer.envelope(chunk=False)
        body["choices"] = [answer.choice("".join(texts), finish, chunk=False, first=True)]
        body["usage"] = usage(stats)
        body["stats"] = lmstudio_stats(stats, self.backend.draft)
        body["timings"] = llama_timings(stats)
        body["specdeck"] = {"tokens": tokens}
        return web.json_response(body)

    async def _stream(
        self, request: web.Request, answer: _Answer, events: asyncio.Queue[JobEvent], job: ApiJob
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        first = True
        stats = SpeculationStats()
        try:
            async for update in self._updates(events, request, job):
                stats = update.stats
                text = "".join(token.text for token in update.tokens)
                if update.tokens or first:
                    chunk = answer.envelope(chunk=True)
                    chunk["choices"] = [answer.choice(text, None, chunk=True, first=first)]
                    chunk["specdeck"] = {"tokens": origins(update)}
                    await response.write(_sse(chunk))
                    first = False
            finish = _FINISH_REASONS.get(stats.stop_reason or "eos", "stop")
            last = answer.envelope(chunk=True)
            last["choices"] = [answer.choice("", finish, chunk=True, first=False)]
            last["stats"] = lmstudio_stats(stats, self.backend.draft)
            last["timings"] = llama_timings(stats)
            await response.write(_sse(last))
            if answer.parsed.include_usage:
                tail = answer.envelope(chunk=True)
                tail["choices"] = []
                tail["usage"] = usage(stats)
                await response.write(_sse(tail))
            await response.write(_sse("[DONE]"))
        except ConnectionResetError:
            job.cancel.set()
            log.info("a client left mid-stream; its generation is cancelled")
        except asyncio.CancelledError:
            job.cancel.set()
            raise
        except ApiError as error:
            # Headers are out: say it in the stream, as OpenAI does.
            await response.write(_sse(json.loads(error.response().text or "{}")))
        return response


def job_failed(error: BaseException) -> JobFailed:
    """The event for an exception raised while running a job."""
    if isinstance(error, ApiError):
        return JobFailed(error)
    if isinstance(error, ContextOverflowError):
        return JobFailed(ApiError(400, str(error), code="context_length_exceeded"))
    if isinstance(error, SpecDeckError):
        return JobFailed(ApiError(400, str(error)))
    return JobFailed(
        ApiError(
            500, f"generation failed: {type(error).__name__}: {error}", error_type="server_error"
        )
    )


class RequestCounts:
    """A backend's requests: how many wait or run (bounded), and how those that ran ended."""

    def __init__(self, limit: int = MAX_QUEUED_REQUESTS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self.queued = 0
        self.served = 0  # answered to the end
        self.cancelled = 0  # their client went away first

    def admit(self) -> None:
        """Count a new request in; ApiError 429 when the queue is full."""
        with self._lock:
            if self.queued >= self.limit:
                raise ApiError(
                    429,
                    "too many requests are waiting; try again shortly",
                    error_type="server_error",
                )
            self.queued += 1

    def finished(self, stats: SpeculationStats | None) -> None:
        """A request left the queue: answered (its final stats) or failed (None)."""
        with self._lock:
            self.queued -= 1
            if stats is not None and stats.stop_reason == "cancelled":
                self.cancelled += 1
            elif stats is not None:
                self.served += 1


def run_job(
    pair: LoadedPair,
    job: ApiJob,
    method: SpeculationMethod,
    observe: Callable[[int, GenerationUpdate], None] | None = None,
) -> SpeculationStats:
    """Generate one job on a loaded pair, delivering its events; returns the final stats.

    The prompt is the main model's chat template over the messages (chat completions) or
    the raw text (completions); one that does not fit the context is an error. ``observe``
    sees (prompt tokens, update) for every round too (the window's meter, a log).
    """
    if job.cancel.is_set():
        raise ApiError(499, "the client went away before its turn")
    decoder = pair.decoder(job.method or method, job.settings.p_min)
    if job.messages is not None:
        prompt = decoder.prompt_tokens(job.messages)
    else:
        assert job.text is not None
        prompt = pair.main.tokenize(job.text, add_special=True, parse_special=False)
    n_ctx = pair.main.n_ctx
    if len(prompt) >= n_ctx:
        raise ContextOverflowError(
            f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}; "
            "shorten it or load the model with a larger context"
        )
    job.deliver(JobStarted(len(prompt)))
    stats = SpeculationStats()
    for update in decoder.generate(prompt, job.settings, job.cancel):
        stats = update.stats
        job.deliver(update)
        if observe is not None:
            observe(len(prompt), update)
    return stats


class PairWorker:
    """A :class:`GenerationBackend` that runs jobs one at a time on its own thread.

    ``load`` runs on the worker thread first (the API answers 503 until it is done); then
    each queued job is tokenized, checked against the context and generated with the
    pair's decoder for its method.
    """

    def __init__(
        self,
        load: Callable[[], Any],
        *,
        method: SpeculationMethod,
        max_queued: int = MAX_QUEUED_REQUESTS,
        on_finished: Callable[[ApiJob, SpeculationStats], None] | None = None,
        on_load_failed: Callable[[str], None] | None = None,
    ) -> None:
        self._load = load
        self._method = method
        self._jobs: queue.Queue[ApiJob | None] = queue.Queue()
        self.counts = RequestCounts(max_queued)
        self._pair: LoadedPair | None = None
        self._main: ServedModel | None = None
        self._draft: ServedModel | None = None
        self._problem: str | None = "the models are still loading"
        self._on_finished = on_finished
        self.on_load_failed = on_load_failed  # told why, once, when loading fails
        self._thread = threading.Thread(target=self._work, name="generation", daemon=True)

    def start(self) -> None:
        """Start loading, then serving jobs."""
        self._thread.start()

    def stop(self) -> None:
        """Finish the running job, then stop and free the models."""
        if not self._thread.is_alive():
            return
        self._jobs.put(None)
        self._thread.join()

    @property
    def main(self) -> ServedModel | None:
        return self._main

    @property
    def draft(self) -> ServedModel | None:
        return self._draft

    @property
    def n_ctx(self) -> int:
        return self._pair.main.n_ctx if self._pair is not None else 0

    @property
    def method(self) -> SpeculationMethod:
        return self._method

    @property
    def unavailable(self) -> str | None:
        return self._problem

    def submit(self, job: ApiJob) -> None:
        if self._problem is not None:
            raise ApiError(503, self._problem, error_type="server_error")
        self.counts.admit()
        self._jobs.put(job)

    def _work(self) -> None:
        try:
            self._pair, self._main, self._draft = self._load()
        except Exception as error:  # noqa: BLE001 - said in every answer from now on
            if not isinstance(error, SpecDeckError):
                log.exception("loading failed")
            self._problem = f"the models could not be loaded: {error}"
            if self.on_load_failed is not None:
                self.on_load_failed(self._problem)
            return
        self._problem = None
        try:
            while (job := self._jobs.get()) is not None:
                stats: SpeculationStats | None = None
                try:
                    stats = run_job(self._pair, job, self._method)
                    if self._on_finished is not None:
                        self._on_finished(job, stats)
                except BaseException as error:  # noqa: BLE001 - the next job must run
                    if not isinstance(error, SpecDeckError | ApiError):
                        log.exception("a request failed")
                    job.deliver(job_failed(error))
                finally:
                    self.counts.finished(stats)
        finally:
            self._problem = "the server is stopping"
            self._pair.close()


class ApiHost:
    """An :class:`ApiServer` listening from a thread and event loop of its own.

    For a process whose main thread is busy generating (the engine process): ``start``
    returns once the port is open (or raises OSError saying why it is not), ``stop`` closes
    it and waits for the thread.
    """

    def __init__(self, api: ApiServer) -> None:
        self.api = api
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        """Open the port; returns the API's base URL (``http://host:port/v1``)."""
        loop = asyncio.new_event_loop()
        opened = threading.Event()
        outcome: dict[str, Any] = {}
        settings = self.api.settings

        def serve() -> None:
            asyncio.set_event_loop(loop)
            runner = web.AppRunner(self.api.app, access_log=None, handle_signals=False)
            loop.run_until_complete(runner.setup())
            try:
                loop.run_until_complete(web.TCPSite(runner, settings.host, settings.port).start())
            except OSError as error:
                outcome["error"] = error
            else:
                host, port = runner.addresses[0][:2]
                outcome["url"] = f"http://{host}:{port}/v1"
            opened.set()
            if "url" in outcome:
                loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        thread = threading.Thread(target=serve, name="api", daemon=True)
        thread.start()
        opened.wait()
        if "error" in outcome:
            thread.join()
            error: OSError = outcome["error"]
            raise OSError(
                error.errno, f"cannot listen on {settings.host}:{settings.port}: {error.strerror}"
            )
        self._loop, self._thread, self.url = loop, thread, str(outcome["url"])
        return self.url

    def stop(self) -> None:
        """Close the port (requests in flight end) and wait for the thread."""
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop = self._thread = None
