"""Tool calls: each format's calls read back from streamed text, and the grammars forcing them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from llguidance import LLMatcher

from backends.engines.interface import ToolFunction
from backends.service.api.tool_calls import (
    ToolCallReader,
    ToolChoice,
    new_call_id,
    split_tool_calls,
    tool_call_grammar,
)
from backends.speculation.grammar import GrammarMatcher, compile_grammar

if TYPE_CHECKING:
    from backends.engines.interface import ToolFormat
    from backends.engines.llama import LlamaEngine

WEATHER = ToolFunction(
    "get_weather",
    "The weather in a city now",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    },
)
TIME = ToolFunction("get_time", "The time now", {})
NAMES = ("get_weather", "get_time")


def streamed(tool_format: ToolFormat, text: str, piece: int) -> tuple[str, list[Any]]:
    """``text`` fed ``piece`` characters at a time: the content sent and the calls, in order."""
    reader = ToolCallReader(tool_format, NAMES)
    content, calls = "", []
    for start in range(0, len(text), piece):
        sent, done = reader.feed(text[start : start + piece])
        content += sent
        calls += done
    sent, done = reader.finish()
    return content + sent, calls + done


@pytest.mark.parametrize("piece", [1, 3, 7, 1000])
def test_hermes_calls_come_out_whole_and_the_prose_around_them_at_once(piece: int) -> None:
    text = (
        "Let me look that up.\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    content, calls = streamed("hermes", text, piece)
    assert content == "Let me look that up.\n"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {}),
    ]
    assert len({c.id for c in calls}) == 2
    assert all(c.id.startswith("call_") for c in calls)


def test_hermes_content_goes_out_before_the_call_is_complete() -> None:
    reader = ToolCallReader("hermes", NAMES)
    assert reader.feed("Sure. <tool") == ("Sure. ", [])  # "<tool" may open a call: held back
    assert reader.feed('_call>\n{"name": "get_time", ') == ("", [])
    content, calls = reader.feed('"arguments": {}}\n</tool_call>')
    assert content == ""
    assert [c.name for c in calls] == ["get_time"]
    assert reader.finish() == ("", [])


def test_text_that_only_looks_like_a_call_stays_content() -> None:
    # A held-back "<tool" that turns out to be prose, an unknown function, broken JSON.
    assert split_tool_calls("hermes", NAMES, "a <tooltip> b") == ("a <tooltip> b", [])
    unknown = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    assert split_tool_calls("hermes", NAMES, unknown) == (unknown, [])
    broken = '<tool_call>\n{"name": "get_time", "arguments": \n</tool_call>'
    assert split_tool_calls("hermes", NAMES, broken) == (broken, [])
    # The answer ended before the closing tag, its JSON whole: still a call.
    content, calls = split_tool_calls(
        "hermes", NAMES, '<tool_call>\n{"name": "get_time", "arguments": {}}'
    )
    assert content == ""
    assert [c.name for c in calls] == ["get_time"]


@pytest.mark.parametrize("piece", [1, 5, 1000])
def test_llama3_and_mistral_calls_are_json_from_the_first_character(piece: int) -> None:
    llama = (
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
        '{"name": "get_time", "parameters": {}}'
    )
    content, calls = streamed("llama3", llama, piece)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {}),
    ]
    mistral = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome"}}]'
    content, calls = streamed("mistral", mistral, piece)
    assert content == ""
    assert [c.name for c in calls] == ["get_weather"]
    assert len(calls[0].id) == 9
    assert calls[0].id.isalnum()
    prose = "It is sunny in Rome."
    assert streamed("mistral", prose, piece) == (prose, [])
    assert streamed("llama3", "{not json", piece) == ("{not json", [])


def test_call_ids_are_fresh() -> None:
    assert new_call_id("hermes") != new_call_id("hermes")
    assert len(new_call_id("mistral")) == 9


@pytest.mark.parametrize("tool_format", ["hermes", "llama3", "mistral"])
def test_the_grammars_compile_for_every_format_and_choice(tool_format: ToolFormat) -> None:
    functions = (WEATHER, TIME)
    assert tool_call_grammar(tool_format, functions, ToolChoice("none")) is None
    assert tool_call_grammar(tool_format, functions, ToolChoice("auto")) is None
    assert tool_call_grammar(tool_format, (), ToolChoice("required")) is None
    for choice, schema in (
        (ToolChoice("auto"), True),  # JSON schema's "anything"
        (ToolChoice("required"), None),
        (ToolChoice("function", "get_weather"), None),
        (ToolChoice("auto"), {"type": "object", "properties": {"answer": {"type": "string"}}}),
    ):
        grammar = tool_call_grammar(tool_format, functions, choice, schema)
        assert grammar is not None
        is_error, messages = LLMatcher.validate_grammar_with_warnings(
            LLMatcher.grammar_from_lark(grammar)
        )
        assert not is_error, messages


def follows(engine: LlamaEngine, grammar: str, text: str) -> bool:
    """Whether ``text`` is a whole answer of ``grammar`` (the end allowed right after it)."""
    matcher = GrammarMatcher(engine, compile_grammar("lark", grammar))
    tokens = engine.tokenize(text, add_special=False, parse_special=False)
    if matcher.allowed_prefix(tokens) != len(tokens):
        return False
    for token in tokens:
        matcher.consume(token)
    allowed = matcher.allowed()
    return any(allowed[end] for end in engine.vocab.end_of_generation_ids)


def test_a_forced_call_follows_the_function_s_schema(smollm_target: LlamaEngine) -> None:
    weather = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    time = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    required = tool_call_grammar("hermes", (WEATHER, TIME), ToolChoice("required"))
    named = tool_call_grammar("hermes", (WEATHER, TIME), ToolChoice("function", "get_weather"))
    assert required is not None
    assert named is not None
    assert follows(smollm_target, required, weather)
    assert follows(smollm_target, required, time)
    assert follows(smollm_target, required, weather + "\n" + time)  # parallel calls
    assert follows(smollm_target, named, weather)
    assert not follows(smollm_target, named, time)  # another function than the named one
    assert not follows(smollm_target, required, "It is sunny.")  # no call
    assert not follows(  # the city is required
        smollm_target, required, weather.replace('{"city": "Paris"}', "{}")
    )
    assert not follows(  # an unit outside the enum
        smollm_target, required, weather.replace('"Paris"}', '"Paris", "unit": "kelvin"}')
    )
    assert not follows(  # the spacing the template renders calls with, and no other
        smollm_target, required, weather.replace('", "arguments"', '","arguments"')
    )
    # auto with a response format: calls, or the asked-for JSON.
    answer = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
    }
    either = tool_call_grammar("hermes", (WEATHER,), ToolChoice("auto"), answer)
    assert either is not None
    assert follows(smollm_target, either, weather)
    assert follows(smollm_target, either, '{"name": "get_weather", "arguments": {"city": "P"}}')
    assert follows(smollm_target, either, '{"answer":"sunny"}')  # compact, as response_format's
    assert not follows(smollm_target, either, "sunny")
    llama = tool_call_grammar("llama3", (WEATHER,), ToolChoice("required"))
    assert llama is not None
    assert follows(smollm_target, llama, '{"name": "get_weather", "parameters": {"city": "Oslo"}}')
    mistral = tool_call_grammar("mistral", (WEATHER,), ToolChoice("required"))
    assert mistral is not None
    assert follows(
        smollm_target, mistral, '[{"name": "get_weather", "arguments": {"city": "Rome"}}]'
    )


@pytest.mark.parametrize("piece", [1, 4, 1000])
def test_hermes_models_that_leave_the_tags_out_are_read_too(piece: int) -> None:
    bare = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    fenced = '```json\n{\n  "name": "get_time",\n  "arguments": {}\n}\n```'
    for text, name in ((bare, "get_weather"), (fenced, "get_time")):
        content, calls = streamed("hermes", text, piece)
        assert content == ""
        assert [c.name for c in calls] == [name]
    # A code answer streams at once; JSON that is no call comes out whole at the end.
    code = "```python\ndef f():\n    return 1\n```"
    reader = ToolCallReader("hermes", NAMES)
    assert reader.feed(code[:12]) == (code[:12], [])
    assert streamed("hermes", code, piece) == (code, [])
    answer = '```json\n{"answer": 4}\n```'
    assert streamed("hermes", answer, piece) == (answer, [])
    assert streamed("hermes", '{"name": "get_time"}', piece) == ('{"name": "get_time"}', [])
