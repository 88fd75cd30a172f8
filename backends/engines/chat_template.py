"""A model's own chat template (Jinja, sandboxed) turned into the prompt of the next turn.

The template gets what Hugging Face's ``apply_chat_template`` gives it: the messages as
dicts (an assistant's ``tool_calls`` with their arguments as objects, a tool result's
``tool_call_id``), the offered ``tools`` in OpenAI's shape, ``add_generation_prompt``, the
BOS and EOS texts, ``raise_exception``, ``strftime_now`` and a ``tojson`` that writes JSON as
Python's ``json.dumps`` does. A template that knows no tools (ChatML, Gemma's) gets them
in Hermes' words instead: a system prompt listing the functions, past calls as
``<tool_call>`` blocks, results as user turns (:func:`_without_tool_roles`).
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.sandbox

from backends.errors import SettingsError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.engines.interface import ChatMessage, ToolFormat, ToolFunction

log = logging.getLogger(__name__)

# Fallback when a model carries no chat template: ChatML, which most instruct models use.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Hermes' tool prompt, for templates that know no tools (Qwen2.5's words).
HERMES_TOOL_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{tools}\n</tools>\n\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def tool_format_of(source: str | None) -> tuple[ToolFormat, bool]:
    """How a template's model writes tool calls, and whether the template renders tools itself.

    Recognised by the markers each family's template writes; a template that mentions no
    tools gets Hermes' format through SpecDeck's own prompt (False).
    """
    text = source or ""
    knows_tools = "tools" in text
    if "[TOOL_CALLS]" in text:
        return "mistral", knows_tools
    if "<tool_call>" in text:
        return "hermes", knows_tools
    if "<|python_tag|>" in text or ("<|start_header_id|>" in text and knows_tools):
        return "llama3", knows_tools
    return "hermes", False


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """Jinja's ``tojson`` as Hugging Face's templates expect it: plain JSON, no HTML escapes."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format_: str) -> str:
    return datetime.datetime.now().strftime(format_)


class ChatTemplate:
    """Compiles a model's template once (ChatML when it has none or it does not compile)."""

    def __init__(self, source: str | None, model_name: str) -> None:
        self.model_name = model_name
        environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.ChainableUndefined
        )

        def raise_exception(message: str) -> None:
            raise jinja2.TemplateError(message)

        environment.globals["raise_exception"] = raise_exception
        environment.globals["strftime_now"] = _strftime_now
        environment.filters["tojson"] = _tojson
        try:
            self._template = environment.from_string(source or CHATML_TEMPLATE)
        except jinja2.TemplateError as error:
            log.warning(
                "chat template of %s does not compile (%s); using ChatML", model_name, error
            )
            self._template = environment.from_string(CHATML_TEMPLATE)
            source = None
        self.tool_format, self._renders_tools = tool_format_of(source)

    def render(
        self,
        messages: Sequence[ChatMessage],
        bos_token: str,
        eos_token: str,
        tools: Sequence[ToolFunction] = (),
    ) -> str:
        """The prompt for the next assistant turn (SettingsError when the template fails)."""
        has_tool_turns = any(m.tool_calls or m.role == "tool" for m in messages)
        if self._renders_tools or not (tools or has_tool_turns):
            rendered = [_message_dict(m, messages) for m in messages]
            offered = [_tool_dict(tool) for tool in tools] or None
        else:
            rendered = _without_tool_roles(messages, tools)
            offered = None
        try:
            return self._template.render(
                messages=rendered,
                tools=offered,
                add_generation_prompt=True,
                bos_token=bos_token,
                eos_token=eos_token,
            )
        except jinja2.TemplateError as error:
            raise SettingsError(
                f"the chat template of {self.model_name} failed: {error}"
            ) from error


def _tool_dict(tool: ToolFunction) -> dict[str, Any]:
    """A tool as OpenAI's request gives it, which templates render as they find it."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = dict(tool.parameters) or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def _arguments(text: str) -> Any:
    """A call's arguments as the object templates expect (the text if it is not JSON)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _message_dict(message: ChatMessage, messages: Sequence[ChatMessage]) -> dict[str, Any]:
    """One message as Hugging Face's templates read it."""
    rendered: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
        names = {c.id: c.name for m in messages for c in m.tool_calls}
        if message.tool_call_id in names:  # Llama's and others' templates name the function
            rendered["name"] = names[message.tool_call_id]
    return rendered


def _without_tool_roles(
    messages: Sequence[ChatMessage], tools: Sequence[ToolFunction]
) -> list[dict[str, Any]]:
    """Messages for a template that knows no tools: Hermes' prompt, calls and results as text.

    The tools go into the system message; an assistant's calls follow its text as
    ``<tool_call>`` blocks; a tool's result becomes a user turn in ``<tool_response>``; turns
    of one role in a row are joined, for templates that insist on alternating roles.
    """
    rendered: list[dict[str, Any]] = []

    def add(role: str, content: str) -> None:
        if rendered and rendered[-1]["role"] == role:
            rendered[-1]["content"] += "\n\n" + content
        else:
            rendered.append({"role": role, "content": content})

    if tools:
        listed = "".join("\n" + json.dumps(_tool_dict(tool)) for tool in tools)
        prompt = HERMES_TOOL_PROMPT.format(tools=listed)
        if messages and messages[0].role == "system":
            prompt = messages[0].content + "\n\n" + prompt
            messages = messages[1:]
        add("system", prompt)
    for message in messages:
        if message.role == "tool":
            add("user", f"<tool_response>\n{message.content}\n</tool_response>")
            continue
        content = message.content
        for call in message.tool_calls:
            block = json.dumps({"name": call.name, "arguments": _arguments(call.arguments)})
            content += ("\n" if content else "") + f"<tool_call>\n{block}\n</tool_call>"
        add(message.role, content)
    return rendered
