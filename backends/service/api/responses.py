"""OpenAI's Responses API (``POST /v1/responses``) over the chat completions machinery.

A Responses request is translated into the chat request it means (:func:`chat_body`):
``input`` (text, or items: messages, ``function_call``, ``function_call_output``) and
``instructions`` become ``messages``; ``max_output_tokens``, ``text.format``, the flat
function ``tools`` and ``tool_choice`` become their chat names. :mod:`.parsing` then checks
it as any chat request. :class:`ResponseAnswer` writes the answer back as a response
object, whole or as the standard stream of events (``response.created``,
``response.output_text.delta``, ``response.function_call_arguments.delta``,
``response.completed``, ...).

Stateless: no response is stored (``store`` is always false in the answer), so
``previous_response_id`` is refused with a 400 saying to send the whole conversation.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from backends.service.api.errors import ApiError
from backends.service.api.wire import FINISH_REASONS, llama_timings, lmstudio_stats

if TYPE_CHECKING:
    from collections.abc import Mapping

    from aiohttp import web

    from backends.engines.interface import ToolCall
    from backends.service.api.jobs import ServedModel
    from backends.speculation.types import SpeculationStats

# Fields of a Responses request that mean the same in a chat request.
_PASSED_THROUGH = (
    "model",
    "temperature",
    "top_p",
    "stream",
    "parallel_tool_calls",
    "specdeck",
    "draft_model",
)
_TEXT_PARTS = ("input_text", "output_text", "text")


def chat_body(body: Any) -> dict[str, Any]:
    """The chat completions request a Responses request means; ApiError where it is bad."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if body.get("previous_response_id") is not None:
        raise ApiError(
            400,
            "SpecDeck stores no responses: send the whole conversation in 'input'",
            param="previous_response_id",
        )
    chat: dict[str, Any] = {key: body[key] for key in _PASSED_THROUGH if key in body}
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ApiError(400, "'instructions' must be a string", param="instructions")
        messages.append({"role": "system", "content": instructions})
    messages.extend(_input_messages(body.get("input")))
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        if not isinstance(fmt, dict):
            raise ApiError(400, "'text.format' must be an object", param="text.format")
        if fmt.get("type") == "json_schema":
            spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
            chat["response_format"] = {"type": "json_schema", "json_schema": spec}
        else:
            chat["response_format"] = fmt
    if body.get("tools") is not None:
        chat["tools"] = _chat_tools(body["tools"])
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        chat["tool_choice"] = choice
    return chat


def _input_messages(raw: Any) -> list[dict[str, Any]]:
    """``input``: a text (one user message) or a list of items, as chat messages."""
    if isinstance(raw, str):
        if not raw:
            raise ApiError(400, "'input' must not be empty", param="input")
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'input' must be a text or a non-empty list of items", param="input")
    messages: list[dict[str, Any]] = []
    call_ids: set[object] = set()  # the function calls so far
    for index, item in enumerate(raw):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise ApiError(400, f"{where} must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _item_text(item, where)})
        elif kind == "function_call":
            call_ids.add(item.get("call_id"))
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if item.get("call_id") not in call_ids:  # as OpenAI answers it
                raise ApiError(
                    400,
                    f"{where}.call_id {item.get('call_id')!r} answers no function_call before it",
                    param="input",
                )
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": output if isinstance(output, str) else json.dumps(output),
                }
            )
        else:
            raise ApiError(
                400,
                f"{where}.type {kind!r} is not supported (message, function_call, "
                "function_call_output)",
                param="input",
            )
    return messages


def _item_text(item: Mapping[str, Any], where: str) -> str:
    """A message item's content: a text, or its text parts joined."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
                raise ApiError(400, f"{where}: only text content is supported", param="input")
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise ApiError(400, f"{where}.content must be a text or a list of parts", param="input")


def _chat_tools(raw: Any) -> Any:
    """Responses' flat function tools in the chat shape (other kinds of tool: a 400)."""
    if not isinstance(raw, list):
        return raw  # parsing names the problem
    tools = []
    for index, tool in enumerate(raw):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise ApiError(
                400,
                f"tools[{index}]: only function tools are supported, not {kind!r}",
                param=f"tools[{index}]",
            )
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        tools.append({"type": "function", "function": function})
    return tools


class ResponseAnswer:
    """One response: its object whole, or the events that stream it."""

    def __init__(self, body: Mapping[str, Any], model: ServedModel) -> None:
        self.request = body
        self.model = model
        self.id = f"resp_{uuid.uuid4().hex[:24]}"
        self.message_id = f"msg_{uuid.uuid4().hex[:24]}"
        self.created_at = int(time.time())
        self.sequence = 0
        self.output: list[dict[str, Any]] = []

    # -- the response object --------------------------------------------------------------

    def response(
        self, status: str, stats: SpeculationStats | None, draft: ServedModel | None
    ) -> dict[str, Any]:
        """The response object, ``in_progress`` (no stats yet) or finished."""
        body = self.request
        text = body.get("text") if isinstance(body.get("text"), dict) else None
        result: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model.id,
            "output": list(self.output),
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "tools": body.get("tools") or [],
            "tool_choice": body.get("tool_choice", "auto"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "text": text or {"format": {"type": "text"}},
            "store": False,
            "previous_response_id": None,
            "metadata": body.get("metadata") or {},
            "truncation": "disabled",
            "reasoning": None,
            "error": None,
            "incomplete_details": None,
            "usage": None,
        }
        if stats is not None:
            if FINISH_REASONS.get(stats.stop_reason or "eos") == "length":
                result["status"] = "incomplete"
                result["incomplete_details"] = {"reason": "max_output_tokens"}
            result["usage"] = {
                "input_tokens": stats.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": stats.generated_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": stats.prompt_tokens + stats.generated_tokens,
            }
            result["specdeck"] = {
                "stats": lmstudio_stats(stats, draft),
                "timings": llama_timings(stats),
            }
        return result

    def message_item(
        self, text: str, status: str = "completed", item_id: str | None = None
    ) -> dict[str, Any]:
        """The assistant's text as an output message item (the answer's first, by default)."""
        content = [{"type": "output_text", "text": text, "annotations": []}] if text else []
        return {
            "type": "message",
            "id": item_id or self.message_id,
            "status": status,
            "role": "assistant",
            "content": content,
        }

    @staticmethod
    def call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
        """A tool call as a ``function_call`` output item."""
        return {
            "type": "function_call",
            "id": f"fc_{call.id.removeprefix('call_')}",
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments if status == "completed" else "",
            "status": status,
        }

    def finished_output(self, text: str, calls: list[ToolCall]) -> None:
        """The whole answer's output items: its text (if any), then its calls."""
        self.output = [self.message_item(text)] if text else []
        self.output.extend(self.call_item(call) for call in calls)

    # -- the stream's events --------------------------------------------------------------

    def event(self, kind: str, **fields: Any) -> bytes:
        """One server-sent event of the stream, numbered."""
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


class ResponseStream:
    """Writes a response's output items as the Responses API streams them."""

    def __init__(self, answer: ResponseAnswer, response: web.StreamResponse) -> None:
        self.answer = answer
        self.response = response
        self.message_index: int | None = None  # the open message item's place in the output
        self.message_id = answer.message_id  # the open (or next) message item's id
        self.text_so_far = ""  # the open message item's text

    async def send(self, kind: str, **fields: Any) -> None:
        await self.response.write(self.answer.event(kind, **fields))

    async def text(self, text: str) -> None:
        """More of the answer's text: the message item opens with its first piece."""
        answer = self.answer
        if self.message_index is None:
            self.message_index = len(answer.output)
            item = answer.message_item("", "in_progress", self.message_id)
            answer.output.append(item)
            await self.send(
                "response.output_item.added", output_index=self.message_index, item=item
            )
            await self.send(
                "response.content_part.added",
                item_id=self.message_id,
                output_index=self.message_index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )
        self.text_so_far += text
        await self.send(
            "response.output_text.delta",
            item_id=self.message_id,
            output_index=self.message_index,
            content_index=0,
            delta=text,
        )

    async def close_message(self) -> None:
        """The message item is complete (a call follows, or the answer ended)."""
        if self.message_index is None:
            return
        answer, index, text, item_id = (
            self.answer,
            self.message_index,
            self.text_so_far,
            self.message_id,
        )
        # Text after a tool call is a message item of its own, with its own id and text.
        self.message_index = None
        self.message_id = f"msg_{uuid.uuid4().hex[:24]}"
        self.text_so_far = ""
        await self.send(
            "response.output_text.done",
            item_id=item_id,
            output_index=index,
            content_index=0,
            text=text,
        )
        part = {"type": "output_text", "text": text, "annotations": []}
        await self.send(
            "response.content_part.done",
            item_id=item_id,
            output_index=index,
            content_index=0,
            part=part,
        )
        answer.output[index] = answer.message_item(text, item_id=item_id)
        await self.send("response.output_item.done", output_index=index, item=answer.output[index])

    async def call(self, call: ToolCall) -> None:
        """A whole tool call: its item added, its arguments, its item done."""
        await self.close_message()
        answer = self.answer
        index = len(answer.output)
        done = answer.call_item(call)
        answer.output.append(done)
        await self.send(
            "response.output_item.added",
            output_index=index,
            item=answer.call_item(call, "in_progress"),
        )
        for kind, key in (("delta", "delta"), ("done", "arguments")):
            await self.send(
                f"response.function_call_arguments.{kind}",
                item_id=done["id"],
                output_index=index,
                **{key: call.arguments},
            )
        await self.send("response.output_item.done", output_index=index, item=done)
