"""A request's tools: the functions offered, the choice, past calls, and the grammar they need.

:func:`parse_tools` reads OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls``
(each function's parameter schema compiled once, so a bad one is a 400 naming it);
:func:`message_tool_calls` an assistant message's ``tool_calls``; :func:`with_tools` puts
the grammar a forced call needs (:func:`~.tool_calls.tool_call_grammar`) into the
generation's options.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backends.engines.interface import ToolCall, ToolFunction
from backends.errors import SettingsError
from backends.service.api.errors import ApiError
from backends.service.api.tool_calls import ToolChoice, tool_call_grammar
from backends.speculation.grammar import compile_grammar

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from backends.service.api.jobs import ServedModel
    from backends.service.generation_options import GenerationOptions

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names


@dataclass(frozen=True)
class ToolRequest:
    """The functions a request offers, whether and how one must be called."""

    functions: tuple[ToolFunction, ...]
    choice: ToolChoice
    parallel: bool = True  # more than one call in an answer

    @property
    def offered(self) -> tuple[ToolFunction, ...]:
        """The functions the prompt shows the model (none under ``tool_choice`` "none")."""
        return () if self.choice.mode == "none" else self.functions


def parse_tools(body: Mapping[str, Any]) -> ToolRequest | None:
    """OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls``; None: no tools."""
    raw = body.get("tools")
    choice_raw = body.get("tool_choice")
    if raw is None or raw == []:
        if choice_raw is not None and choice_raw != "none":
            raise ApiError(400, "'tool_choice' is allowed only with 'tools'", param="tool_choice")
        return None
    if not isinstance(raw, list):
        raise ApiError(400, "'tools' must be a list of functions", param="tools")
    functions: list[ToolFunction] = []
    for index, tool in enumerate(raw):
        functions.append(_tool_function(tool, index))
    names = [function.name for function in functions]
    for name in names:
        if names.count(name) > 1:
            raise ApiError(400, f"the function {name!r} is among the tools twice", param="tools")
    choice = _tool_choice(choice_raw, names)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ApiError(
            400, "'parallel_tool_calls' must be true or false", param="parallel_tool_calls"
        )
    return ToolRequest(tuple(functions), choice, parallel)


def _tool_function(tool: Any, index: int) -> ToolFunction:
    """One of ``tools``: ``{"type": "function", "function": {name, description, parameters}}``."""
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise ApiError(400, f"{where} must be a function tool", param=where)
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ApiError(400, f"{where}.function must be an object", param=f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ApiError(
            400,
            f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-'",
            param=f"{where}.function.name",
        )
    description = function.get("description", "")
    if not isinstance(description, str):
        raise ApiError(
            400,
            f"{where}.function.description must be a string",
            param=f"{where}.function.description",
        )
    parameters = function.get("parameters") or {}
    try:
        compile_grammar("json_schema", parameters)
    except SettingsError as error:
        raise ApiError(400, str(error), param=f"{where}.function.parameters") from None
    return ToolFunction(name, description, parameters)


def _tool_choice(raw: Any, names: Sequence[str]) -> ToolChoice:
    """``tool_choice``: "auto" (the default), "none", "required" or one named function."""
    if raw is None:
        return ToolChoice("auto")
    if raw in ("auto", "none", "required"):
        return ToolChoice(raw)
    function = raw.get("function") if isinstance(raw, dict) else None
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        if function["name"] not in names:
            raise ApiError(
                400,
                f"tool_choice: {function['name']!r} is not among the tools",
                param="tool_choice",
            )
        return ToolChoice("function", function["name"])
    raise ApiError(
        400,
        "'tool_choice' must be 'auto', 'none', 'required' or "
        '{"type": "function", "function": {"name": ...}}',
        param="tool_choice",
    )


def with_tools(
    options: GenerationOptions,
    tools: ToolRequest,
    model: ServedModel,
    response_schema: Any,
) -> None:
    """Put the grammar that shapes the tool calls (if the choice needs one) into ``options``."""
    if tools.choice.mode == "none":
        return
    if "grammar" in options and response_schema is None:  # llama.cpp's GBNF
        raise ApiError(
            400,
            "a 'grammar' and 'tools' together need tool_choice 'none'",
            param="grammar",
        )
    source = tool_call_grammar(
        model.tool_format,
        tools.functions,
        tools.choice,
        response_schema,
        parallel=tools.parallel,
        markers=model.tool_markers,
    )
    if source is None:
        return
    try:
        options["grammar"] = compile_grammar("lark", source)
    except SettingsError as error:
        raise ApiError(400, str(error), param="tools") from None


def message_tool_calls(raw: Any, index: int) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls``: id, function name, arguments (a JSON object)."""
    where = f"messages[{index}].tool_calls"
    if not isinstance(raw, list):
        raise ApiError(400, f"{where} must be a list", param="messages")
    calls = []
    for number, call in enumerate(raw):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(
                400, f"{where}[{number}].function must be an object with a name", param="messages"
            )
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else None
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise ApiError(
                400,
                f"{where}[{number}].function.arguments must be a JSON object's text",
                param="messages",
            )
        call_id = call.get("id")
        calls.append(
            ToolCall(
                call_id if isinstance(call_id, str) else f"call_{index}_{number}",
                function["name"],
                arguments,
            )
        )
    return tuple(calls)
