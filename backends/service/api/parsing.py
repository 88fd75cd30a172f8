"""Request bodies → checked requests: what each one says, resolved over the server's defaults.

:func:`parse_request` reads OpenAI's fields (and SpecDeck's ``specdeck`` object, or
llama.cpp's dotted ``speculative.*`` keys) into :class:`GenerationOptions` holding only
what the request says, and resolves them over the server's defaults with
:func:`~backends.service.generation_options.generation_settings`: no policy lives here
(a seed's verification is that function's to decide, for the window and the API alike).
A bad field is an :class:`ApiError` naming it in ``param``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from backends.engines.interface import ChatMessage, ToolCall
from backends.errors import SettingsError
from backends.service.api.errors import ApiError
from backends.service.api.tool_requests import (
    ToolRequest,
    message_tool_calls,
    parse_tools,
    with_tools,
)
from backends.service.generation_options import (
    VERIFICATIONS,
    GenerationOptions,
    generation_settings,
    merged,
)
from backends.speculation.grammar import ANY_JSON_OBJECT, compile_grammar
from backends.speculation.methods import parse_method
from backends.speculation.types import DEFAULT_MAX_TOKENS

if TYPE_CHECKING:
    from collections.abc import Mapping

    from backends.service.api.jobs import GenerationBackend
    from backends.speculation.methods import SpeculationMethod
    from backends.speculation.types import GenerationSettings

MAX_STOP_STRINGS = 4  # as OpenAI allows
RANDOM_SEED = -1  # llama.cpp server's seed for "draw a fresh one"

Endpoint = Literal["chat", "completion"]

# OpenAI's sampling fields, read in this order.
_SAMPLING_FIELDS: tuple[
    tuple[Literal["temperature", "top_k", "top_p", "min_p", "seed"], type], ...
] = (
    ("temperature", float),
    ("top_k", int),
    ("top_p", float),
    ("min_p", float),
    ("seed", int),
)
# SpecDeck's ``specdeck`` keys and llama.cpp's dotted names for them (None: SpecDeck's only).
_SPECULATION_FIELDS: tuple[
    tuple[Literal["draft_max", "draft_min", "p_min", "lookup_draft_max"], str | None, type], ...
] = (
    ("draft_max", "speculative.n_max", int),
    ("draft_min", "speculative.n_min", int),
    ("p_min", "speculative.p_min", float),
    ("lookup_draft_max", None, int),
)


@dataclass(frozen=True)
class ParsedRequest:
    """A completion request, checked.

    ``options`` holds only what the request says; ``settings`` are those options over the
    server's defaults, as the generation gets them.
    """

    endpoint: Endpoint
    messages: tuple[ChatMessage, ...] | None
    text: str | None
    options: GenerationOptions
    settings: GenerationSettings
    method: SpeculationMethod | None
    stream: bool
    include_usage: bool
    tools: ToolRequest | None = None  # chat completions: the functions offered, the choice


def _number(body: Mapping[str, Any], key: str, kind: type, default: Any = None) -> Any:
    """``body[key]`` checked to be a ``kind`` (an int passes for a float), else ``default``."""
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
    """OpenAI's ``messages`` as chat messages (developer = system).

    An assistant message may carry ``tool_calls`` (and no content); a ``tool`` message is a
    call's result, naming the call by ``tool_call_id``.
    """
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    messages = []
    call_ids: set[str] = set()  # the ids of the calls made so far
    for index, message in enumerate(raw):
        if not isinstance(message, dict):
            raise ApiError(400, f"messages[{index}] must be an object", param="messages")
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise ApiError(
                400,
                f"messages[{index}].role must be system, user, assistant or tool",
                param="messages",
            )
        calls: tuple[ToolCall, ...] = ()
        if role == "assistant" and message.get("tool_calls"):
            calls = message_tool_calls(message["tool_calls"], index)
            call_ids.update(call.id for call in calls)
        content = message.get("content")
        text = "" if content is None and calls else _content_text(content, index)
        call_id = None
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ApiError(
                    400,
                    f"messages[{index}].tool_call_id must name the call this result answers",
                    param="messages",
                )
            if call_id not in call_ids:  # as OpenAI: a result answers a call made before it
                raise ApiError(
                    400,
                    f"messages[{index}].tool_call_id {call_id!r} answers no tool call of an "
                    "assistant message before it",
                    param="messages",
                )
        messages.append(ChatMessage(role, text, calls, call_id))
    return tuple(messages)


def _check_models(body: Mapping[str, Any], backend: GenerationBackend) -> None:
    """The request's ``model`` and ``draft_model``, if given, must name the loaded ones."""
    main = backend.main
    if main is None:
        raise ApiError(503, backend.unavailable or "no model is loaded", error_type="server_error")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", param="model")
    if model is not None and not main.is_named_by(model):
        # 404, as OpenAI answers a model it does not have (clients raise NotFoundError).
        raise ApiError(
            404,
            f"model {model!r} is not loaded; this server answers with {main.id!r}",
            param="model",
            code="model_not_found",
        )
    draft_model = body.get("draft_model")
    if draft_model is not None:
        draft = backend.draft
        if not isinstance(draft_model, str):
            raise ApiError(400, "'draft_model' must be a string", param="draft_model")
        if draft is None or not draft.is_named_by(draft_model):
            loaded = f"the loaded draft is {draft.id!r}" if draft else "no draft model is loaded"
            raise ApiError(
                404,
                f"draft model {draft_model!r} is not loaded; {loaded}",
                param="draft_model",
                code="model_not_found",
            )


def _prompt(
    endpoint: Endpoint, body: Mapping[str, Any]
) -> tuple[tuple[ChatMessage, ...] | None, str | None]:
    """The chat messages (chat completions) or the raw prompt (completions)."""
    if endpoint == "chat":
        if "messages" not in body:
            raise ApiError(400, "'messages' is required", param="messages")
        return parse_messages(body["messages"]), None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be a non-empty string", param="prompt")
    return None, prompt


def _stop_strings(body: Mapping[str, Any]) -> tuple[str, ...] | None:
    """OpenAI's ``stop``: a string or a list of them; None when the request has none."""
    stop = body.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        stops: tuple[str, ...] = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise ApiError(400, "'stop' must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
        raise ApiError(400, f"'stop' takes 1 to {MAX_STOP_STRINGS} non-empty strings", param="stop")
    return stops


def _speculation(body: Mapping[str, Any], options: GenerationOptions) -> SpeculationMethod | None:
    """Speculation options into ``options``; returns the method asked for, if any.

    They come in SpecDeck's ``specdeck`` object, or as llama.cpp's dotted keys.
    """
    extension = body.get("specdeck") or {}
    if not isinstance(extension, dict):
        raise ApiError(400, "'specdeck' must be an object", param="specdeck")
    for key, dotted, kind in _SPECULATION_FIELDS:
        if key in extension:
            value = _number(extension, key, kind)
        elif dotted is not None:
            value = _number(body, dotted, kind)
        else:
            value = None
        if value is not None:
            options[key] = value
    verification = extension.get("verification")
    if verification is not None:
        if verification not in VERIFICATIONS:
            raise ApiError(
                400,
                "'specdeck.verification' must be 'rejection' or 'sample-match'",
                param="specdeck.verification",
            )
        options["verification"] = verification
    method = extension.get("method")
    if method is None:
        return None
    if not isinstance(method, str):
        raise ApiError(400, "'specdeck.method' must be a string", param="specdeck.method")
    try:
        return parse_method(method)
    except SettingsError as error:
        raise ApiError(400, str(error), param="specdeck.method") from None


def _grammar(body: Mapping[str, Any]) -> tuple[str | None, Any]:
    """The grammar the answer must follow (None: free text), and the response's JSON schema.

    OpenAI's ``response_format`` (``json_object``, ``json_schema``; the schema is returned
    too, for a tool-call grammar to offer it beside the calls) or llama.cpp's ``grammar``
    (GBNF). A schema or grammar that cannot be compiled is a 400 naming the problem.
    """
    response_format = body.get("response_format")
    grammar_text = body.get("grammar")
    if response_format is not None and grammar_text is not None:
        raise ApiError(400, "give 'response_format' or 'grammar', not both", param="grammar")
    try:
        if grammar_text is not None:
            return compile_grammar("gbnf", grammar_text), None
        if response_format is None:
            return None, None
        if not isinstance(response_format, dict):
            raise ApiError(400, "'response_format' must be an object", param="response_format")
        kind = response_format.get("type")
        if kind == "text":
            return None, None
        if kind == "json_object":
            return compile_grammar("json_schema", ANY_JSON_OBJECT), ANY_JSON_OBJECT
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, dict) or "schema" not in spec:
                raise ApiError(
                    400,
                    "'response_format.json_schema' must be an object with a 'schema'",
                    param="response_format.json_schema",
                )
            return compile_grammar("json_schema", spec["schema"]), spec["schema"]
    except SettingsError as error:
        param = "grammar" if grammar_text is not None else "response_format"
        raise ApiError(400, str(error), param=param) from None
    raise ApiError(
        400,
        "'response_format.type' must be 'text', 'json_object' or 'json_schema'",
        param="response_format.type",
    )


def _resolved(defaults: Mapping[str, Any] | None, options: GenerationOptions) -> GenerationSettings:
    """The request's options over the defaults; an impossible value is a 400 saying why."""
    try:
        return generation_settings(merged(defaults or {}, options))
    except SettingsError as error:
        raise ApiError(400, str(error)) from None


def parse_request(
    endpoint: Endpoint,
    body: Any,
    backend: GenerationBackend,
    defaults: Mapping[str, Any] | None = None,
) -> ParsedRequest:
    """Check a completion request against the loaded models; ApiError when it is bad.

    ``defaults`` are the server's :class:`GenerationOptions` (``specdeck serve``'s flags);
    the request's own fields win over them.
    """
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    _check_models(body, backend)
    if _number(body, "n", int, 1) != 1:
        raise ApiError(400, "only n = 1 is supported (one answer per request)", param="n")
    messages, text = _prompt(endpoint, body)
    options = GenerationOptions()
    stops = _stop_strings(body)
    if stops is not None:
        options["stop_strings"] = stops
    max_tokens = _number(body, "max_completion_tokens", int)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", int)
    if max_tokens is not None:
        options["max_tokens"] = max_tokens
    limit = max(1, backend.n_ctx)
    defaults = defaults or {}
    if "max_tokens" not in merged(defaults, options):
        # Neither the request nor serve says: the default, within a small context.
        defaults = {**defaults, "max_tokens": min(DEFAULT_MAX_TOKENS, limit)}
    if not 1 <= merged(defaults, options)["max_tokens"] <= limit:
        raise ApiError(
            400,
            f"'max_tokens' must be between 1 and the context size ({limit})",
            param="max_tokens",
        )
    for key, kind in _SAMPLING_FIELDS:
        value = _number(body, key, kind)
        if key == "seed" and value == RANDOM_SEED:
            continue  # llama.cpp's word for a fresh seed
        if value is not None:
            options[key] = value
    _resolved(defaults, options)  # a bad sampling value is named before the speculation fields
    method = _speculation(body, options)
    grammar, response_schema = _grammar(body)
    if grammar is not None:
        options["grammar"] = grammar
    tools = parse_tools(body) if endpoint == "chat" else None
    if tools is not None:
        assert backend.main is not None  # _check_models said so
        with_tools(options, tools, backend.main, response_schema)
    settings = _resolved(defaults, options)
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
        options,
        settings,
        method,
        stream,
        bool(stream_options.get("include_usage", False)),
        tools,
    )
