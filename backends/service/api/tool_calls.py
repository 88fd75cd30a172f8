r"""Tool calls: what the model writes when it calls a function, read back into OpenAI's shape.

A chat template that knows tools tells the model how to call one, and each family says it
its own way (:data:`~backends.engines.interface.ToolFormat`):

- ``hermes`` (Qwen2.5, Qwen3, Hermes, and SpecDeck's fallback for templates without
  tools): ``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>``, one block a
  call (or, as small models often write it, the bare object alone);
- ``llama3`` (Llama 3.1 and later): a bare JSON object ``{"name": ..., "parameters": {...}}``
  (after ``<|python_tag|>``, a special token that renders as no text);
- ``mistral``: ``[TOOL_CALLS]`` and a JSON list of ``{"name": ..., "arguments": {...}}``.

A marker the model writes as one special token (no text of its own) is read as its text
and asked for as that token in a grammar (:func:`marker_tokens`).

:class:`ToolCallReader` reads an answer as it streams: text that cannot be part of a call
goes out as content at once, a call is given out whole once its text is complete. With
``tool_choice`` ``required`` or a named function, :func:`tool_call_grammar` builds the
grammar (llguidance's Lark, with each function's parameter schema inline) that makes the
model's answer one or more well-formed calls of the offered functions; with ``auto`` and a
``response_format``, the answer is either calls or the asked-for JSON.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from backends.engines.interface import ToolCall

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from backends.engines.interface import ModelEngine, ToolFormat, ToolFunction
    from backends.speculation.types import EmittedToken

HERMES_OPEN = "<tool_call>"
HERMES_CLOSE = "</tool_call>"
MISTRAL_MARKER = "[TOOL_CALLS]"
# The JSON a call's text is written in: as the templates render past calls (Python's
# json.dumps, ", " and ": "), so the model reads and writes the same spacing.
CALL_JSON_STYLE: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
# The markers each format writes around its calls.
MARKERS: dict[ToolFormat, tuple[str, ...]] = {
    "hermes": (HERMES_OPEN, HERMES_CLOSE),
    "llama3": (),
    "mistral": (MISTRAL_MARKER,),
}
# The JSON of a response_format's answer: compact, as compile_grammar writes it.
COMPACT_JSON_STYLE: dict[str, Any] = {"whitespace_flexible": False}
# The key each format keeps a call's arguments under.
ARGUMENTS_KEY: dict[ToolFormat, str] = {
    "hermes": "arguments",
    "llama3": "parameters",
    "mistral": "arguments",
}
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolChoice:
    """OpenAI's ``tool_choice``: ``auto``, ``none``, ``required``, or one named function."""

    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None  # mode "function": the function the answer must call

    @property
    def forces_a_call(self) -> bool:
        """Whether the answer must be calls (``required`` or a named function)."""
        return self.mode in ("required", "function")


def marker_tokens(engine: ModelEngine) -> dict[str, int]:
    """The format's markers that the model writes as one special token, by their text.

    Such a token renders as no text (Mistral's ``[TOOL_CALLS]`` is one; Qwen2.5's
    ``<tool_call>`` is not, it keeps its text), so the reader is fed its text in its place,
    and a grammar asks for the token itself.
    """
    found: dict[str, int] = {}
    for marker in MARKERS[engine.tool_format]:
        ids = engine.tokenize(marker, add_special=False, parse_special=True)
        if len(ids) == 1 and not engine.token_bytes(ids[0]):
            found[marker] = ids[0]
    return found


def new_call_id(tool_format: ToolFormat) -> str:
    """A fresh call id, as the format's templates accept it (Mistral's: 9 letters and digits)."""
    if tool_format == "mistral":
        return uuid.uuid4().hex[:9]
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call_grammar(
    tool_format: ToolFormat,
    functions: Sequence[ToolFunction],
    choice: ToolChoice,
    response_schema: Mapping[str, Any] | bool | None = None,
    *,
    parallel: bool = True,
    markers: Mapping[str, int] | None = None,
) -> str | None:
    """The Lark grammar an answer must follow, or None where the answer is free.

    ``required``: one or more calls of the offered functions (one alone unless
    ``parallel``); a named function: one call of it; ``auto`` with ``response_schema``
    (a ``response_format``): calls, or JSON that follows the schema; ``auto`` without one
    and ``none``: free text (None). ``markers`` (:func:`marker_tokens`): the markers the
    model writes as one special token, asked for as that token.
    """
    if choice.mode == "none" or not functions:
        return None
    if not choice.forces_a_call and response_schema is None:
        return None
    offered = [f for f in functions if choice.mode != "function" or f.name == choice.name]
    key = ARGUMENTS_KEY[tool_format]
    alternatives = [
        {
            "type": "object",
            "properties": {
                "name": {"const": function.name},
                key: dict(function.parameters) or NO_PARAMETERS,
            },
            "required": ["name", key],
            "additionalProperties": False,
        }
        for function in offered
    ]
    call_schema: dict[str, Any] = (
        alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    )
    markers = markers or {}
    single = not parallel or choice.mode == "function"  # a named function: one call of it

    def marker(text: str) -> str:
        token = markers.get(text)
        return f"<[{token}]>" if token is not None else json.dumps(text)

    if tool_format == "hermes":
        rules = [
            "calls: call" if single else 'calls: call ("\\n" call)*',
            f'call: {marker(HERMES_OPEN)} "\\n" call_json "\\n" {marker(HERMES_CLOSE)}',
            f"call_json: %json {_styled(call_schema)}",
        ]
    elif tool_format == "llama3":
        rules = [f"calls: %json {_styled(call_schema)}"]
    else:  # mistral: [TOOL_CALLS] (where it is one token) and a list
        listed = {"type": "array", "items": call_schema, "minItems": 1}
        if single:
            listed["maxItems"] = 1
        opening = f"{marker(MISTRAL_MARKER)} " if MISTRAL_MARKER in markers else ""
        rules = [f"calls: {opening}call_list", f"call_list: %json {_styled(listed)}"]
    if choice.forces_a_call or response_schema is None:
        start = "start: calls"
    else:
        start = "start: calls | answer"
        if tool_format == "hermes":  # a call's bare object too, as small models write it
            start += " | call_json"
        # The answer as response_format alone writes it: compact.
        # (A schema that is not an object, JSON schema's ``true``, allows any JSON.)
        answer = dict(response_schema) if isinstance(response_schema, Mapping) else {}
        rules.append(f"answer: %json {_styled(answer, COMPACT_JSON_STYLE)}")
    return "\n".join([start, *rules])


def _styled(schema: dict[str, Any], style: dict[str, Any] = CALL_JSON_STYLE) -> str:
    """A JSON schema for Lark's ``%json``, with the JSON spacing ``style`` gives."""
    return json.dumps({**schema, "x-guidance": style})


class ToolCallReader:
    """Reads an answer as it streams: content out at once, each call out once it is whole.

    ``names`` are the offered functions: a "call" of any other name stays content, as do
    calls that do not parse. ``markers`` (token id: text) are the markers that are special
    tokens, which have no text of their own (:func:`marker_tokens`, turned around).
    """

    def __init__(
        self,
        tool_format: ToolFormat,
        names: Sequence[str],
        markers: Mapping[int, str] | None = None,
    ) -> None:
        self.tool_format = tool_format
        self.names = frozenset(names)
        self.markers = dict(markers or {})
        self.calls: list[ToolCall] = []
        self._pending = ""  # text held back: maybe the start of a call
        self._in_call = False  # hermes: inside <tool_call> ... </tool_call>
        self._json_first: bool | None = None  # the answer opened with JSON (None: not yet known)
        self._spaces = ""  # whitespace after a call, content only if more content follows

    def text_of(self, tokens: Iterable[EmittedToken]) -> str:
        """Generated tokens' text as the reader reads it: the special markers written out."""
        return "".join(self.markers.get(token.token_id, token.text) for token in tokens)

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        """The next piece of the answer; returns the content to send and calls completed."""
        self._pending += text
        return self._read(final=False)

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The answer ended: what was held back, as content or calls."""
        return self._read(final=True)

    def _read(self, final: bool) -> tuple[str, list[ToolCall]]:
        if self._json_first is None:
            self._json_first = self._opens_with_json(final)
            if self._json_first is None:
                return "", []  # too little yet to tell
        if self.tool_format == "hermes" and not self._json_first:
            return self._feed_hermes(final)
        return self._feed_json_first(final)

    def _opens_with_json(self, final: bool) -> bool | None:
        """Whether the answer opens with its calls' JSON (None: cannot tell yet).

        Llama 3 and Mistral write calls as JSON from the first character; small models
        often leave Hermes' <tool_call> tags out and write the bare object (Qwen2.5-Coder
        0.5B), or the object in a ```json fence (Qwen2.5-Coder 1.5B). Such an answer is
        held back whole, then read as calls or, if it is not one, sent as content.
        """
        head = self._pending.lstrip()
        if head.startswith(MISTRAL_MARKER):
            head = head[len(MISTRAL_MARKER) :].lstrip()
        opening = "[" if self.tool_format == "mistral" else "{"
        if head.startswith(opening):
            return True
        if head.startswith("```"):
            first_line, newline, rest = head.partition("\n")
            rest = rest.lstrip()
            if newline and rest:
                return first_line[3:].strip() in ("", "json") and rest.startswith(opening)
        elif head and not (MISTRAL_MARKER.startswith(head) or "```".startswith(head)):
            return False
        return False if final else None

    # -- hermes ------------------------------------------------------------------------------

    def _feed_hermes(self, final: bool) -> tuple[str, list[ToolCall]]:
        content: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if self._in_call:
                end = self._pending.find(HERMES_CLOSE)
                if end < 0:
                    if final:  # the answer ended inside a block: a call if its JSON is whole
                        call = self._call_from_text(self._pending)
                        if call is None:
                            content.append(self._content(HERMES_OPEN + self._pending))
                        else:
                            self._called(call, calls)
                        self._pending = ""
                    break
                body, self._pending = self._pending[:end], self._pending[end + len(HERMES_CLOSE) :]
                self._in_call = False
                call = self._call_from_text(body)
                if call is None:
                    content.append(self._content(HERMES_OPEN + body + HERMES_CLOSE))
                else:
                    self._called(call, calls)
                continue
            start = self._pending.find(HERMES_OPEN)
            if start >= 0:
                content.append(self._content(self._pending[:start]))
                self._pending = self._pending[start + len(HERMES_OPEN) :]
                self._in_call = True
                continue
            keep = 0 if final else _partial_suffix(self._pending, HERMES_OPEN)
            content.append(self._content(self._pending[: len(self._pending) - keep]))
            self._pending = self._pending[len(self._pending) - keep :]
            break
        return "".join(content), calls

    def _called(self, call: ToolCall, calls: list[ToolCall]) -> None:
        calls.append(call)
        self.calls.append(call)

    # -- llama3 and mistral -------------------------------------------------------------------

    def _feed_json_first(self, final: bool) -> tuple[str, list[ToolCall]]:
        if not self._json_first:
            text, self._pending = self._pending, ""
            return text, []
        if not final:
            return "", []
        text, self._pending = self._pending, ""
        calls = self._calls_from_json(text)
        if calls is None:
            return text, []
        self.calls.extend(calls)
        return "", calls

    def _calls_from_json(self, text: str) -> list[ToolCall] | None:
        """Calls from JSON: objects (one, or several in a row or split by ';'), or a list."""
        text = text.strip()
        if text.startswith(MISTRAL_MARKER):
            text = text[len(MISTRAL_MARKER) :].strip()
        if text.startswith("```") and text.endswith("```"):  # a fenced block, fences off
            text = text.partition("\n")[2].removesuffix("```").strip()
        decoder = json.JSONDecoder()
        objects: list[Any] = []
        position = 0
        while position < len(text):
            try:
                value, position = decoder.raw_decode(text, position)
            except json.JSONDecodeError:
                return None
            objects.extend(value if isinstance(value, list) else [value])
            while position < len(text) and text[position] in " \t\r\n;":
                position += 1
        calls = [self._call_from_object(item) for item in objects]
        if not calls or any(call is None for call in calls):
            return None
        return [call for call in calls if call is not None]

    # -- one call ------------------------------------------------------------------------------

    def _call_from_text(self, text: str) -> ToolCall | None:
        try:
            value = json.loads(text.strip())
        except json.JSONDecodeError:
            return None
        return self._call_from_object(value)

    def _call_from_object(self, value: Any) -> ToolCall | None:
        """A call from ``{"name": ..., "arguments" or "parameters": {...}}``; None if not one."""
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        if "arguments" not in value and "parameters" not in value:
            return None
        if self.names and value["name"] not in self.names:
            return None
        arguments = value.get("arguments", value.get("parameters"))
        if isinstance(arguments, str):  # some models write the arguments' JSON as a string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None
        if not isinstance(arguments, dict):
            return None
        return ToolCall(
            id=new_call_id(self.tool_format),
            name=value["name"],
            arguments=json.dumps(arguments, ensure_ascii=False),
        )

    def _content(self, text: str) -> str:
        """Content to send: whitespace right after a call waits until more content follows."""
        if not text:
            return ""
        if (self.calls or self._in_call) and not text.strip():
            self._spaces += text
            return ""
        text, self._spaces = self._spaces + text, ""
        return text


def _partial_suffix(text: str, marker: str) -> int:
    """How many of ``text``'s last characters could be the start of ``marker``."""
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0


def split_tool_calls(
    tool_format: ToolFormat, names: Sequence[str], text: str
) -> tuple[str, list[ToolCall]]:
    """A whole answer's content (stripped where it has calls) and its calls."""
    reader = ToolCallReader(tool_format, names)
    content, calls = reader.feed(text)
    rest, more = reader.finish()
    content += rest
    calls += more
    return (content.strip() if calls else content), calls
