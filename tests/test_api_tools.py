"""Tool calls through the local API: a live ``specdeck serve``, driven by the openai client.

Qwen2.5-Coder 1.5B's own template renders the tools (the model answers with its call in a
```json fence, no ``<tool_call>`` tags); SmolLM2's template knows no tools, so SpecDeck's
Hermes prompt stands in for it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageFunctionToolCall

from backends.engines.interface import ChatMessage, ToolCall
from tests.test_api_server import Served, serve
from tests.test_tool_calls import WEATHER

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

    from backends.engines.llama import LlamaEngine

TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": WEATHER.description,
            "parameters": dict(WEATHER.parameters),
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "The time now in a city"},
    },
]
ASK: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the weather in Paris? Use the tool."}
]


@pytest.fixture(scope="module")
def qwen_server(qwen_main_path: Path) -> Iterator[Served]:
    with serve("--main", str(qwen_main_path), "--ctx", "2048") as served:
        yield served


def model_of(server: Served) -> str:
    return str(server.request("GET", "/models")[1]["data"][0]["id"])


def calls_of(message: ChatCompletionMessage) -> list[ChatCompletionMessageFunctionToolCall]:
    """A message's tool calls, each a function call."""
    calls = list(message.tool_calls or ())
    assert all(isinstance(call, ChatCompletionMessageFunctionToolCall) for call in calls)
    return [call for call in calls if isinstance(call, ChatCompletionMessageFunctionToolCall)]


def arguments(call: Any) -> dict[str, Any]:
    parsed = json.loads(call.function.arguments)
    assert isinstance(parsed, dict)
    return parsed


@pytest.mark.default_pair
def test_a_required_call_follows_the_function_s_schema_whole_and_streamed(
    qwen_server: Served,
) -> None:
    client = qwen_server.client()
    model = model_of(qwen_server)
    answer = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = calls_of(choice.message)
    assert [call.function.name for call in calls] == ["get_weather"]
    assert calls[0].type == "function"
    assert calls[0].id
    assert "Paris" in arguments(calls[0])["city"]
    assert set(arguments(calls[0])) <= {"city", "unit"}
    stats = (answer.model_extra or {})["stats"]
    # The call's scaffolding (<tool_call>, the name, "arguments", the keys) came from the
    # grammar alone, with no drafting.
    assert stats["grammar_tokens_count"] >= 5
    # Streamed: the same call, as delta.tool_calls, and the same finish.
    stream = client.chat.completions.create(
        model=model,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        stream=True,
    )
    streamed: dict[int, dict[str, str]] = {}
    finishes = []
    content = ""
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or ():
            entry = streamed.setdefault(part.index, {"name": "", "arguments": "", "id": ""})
            entry["id"] += part.id or ""
            assert part.function is not None
            entry["name"] += part.function.name or ""
            entry["arguments"] += part.function.arguments or ""
        finishes.append(chunk.choices[0].finish_reason)
    assert content == ""
    assert [(e["name"], json.loads(e["arguments"])) for e in streamed.values()] == [
        ("get_weather", arguments(calls[0]))
    ]
    assert finishes[-1] == "tool_calls"


@pytest.mark.default_pair
def test_a_named_function_is_the_one_called(qwen_server: Served) -> None:
    answer = qwen_server.client().chat.completions.create(
        model=model_of(qwen_server),
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=64,
    )
    calls = calls_of(answer.choices[0].message)
    assert [call.function.name for call in calls] == ["get_time"]
    assert answer.choices[0].finish_reason == "tool_calls"


@pytest.mark.default_pair
def test_auto_lets_the_model_choose_and_a_tool_result_gets_an_answer(
    qwen_server: Served,
) -> None:
    client = qwen_server.client()
    model = model_of(qwen_server)
    # Asked to use the tool, the model writes the call of its own (no grammar).
    answer = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, temperature=0, max_tokens=80
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    calls = calls_of(choice.message)
    assert [call.function.name for call in calls] == ["get_weather"]
    assert (answer.model_extra or {})["stats"]["grammar_tokens_count"] == 0
    # The call and its result go back; the model answers from the result.
    follow_up: list[ChatCompletionMessageParam] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0].id,
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": calls[0].function.arguments,
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": calls[0].id,
            "content": '{"temperature": 17, "unit": "celsius", "sky": "cloudy"}',
        },
    ]
    answer = client.chat.completions.create(
        model=model,
        messages=follow_up,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=60,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    assert not choice.message.tool_calls
    assert "17" in (choice.message.content or "")


@pytest.mark.default_pair
def test_auto_with_a_response_format_answers_calls_or_the_json(qwen_server: Served) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 40}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    client = qwen_server.client()
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
    ask: dict[str, Any] = {
        "model": model_of(qwen_server),
        "messages": ASK,
        "tools": TOOLS[:1],
        "response_format": response_format,
        "temperature": 0,
        "max_tokens": 60,
    }
    # The grammar lets the model choose between a call and the JSON; asked, it calls.
    message = client.chat.completions.create(**ask).choices[0].message
    assert [c.function.name for c in calls_of(message)] == ["get_weather"]
    # With tool_choice "none" the answer is the response format's JSON.
    message = client.chat.completions.create(**ask, tool_choice="none").choices[0].message
    assert not message.tool_calls
    assert set(json.loads(message.content or "")) == {"answer"}


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tools": {"a": 1}}, "tools", "must be a list"),
        ({"tools": [{"type": "function"}]}, "tools[0].function", "must be an object"),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name",
            "letters, digits",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
            "tools[0].function.parameters",
            "invalid json schema",
        ),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "twice"),
        ({"tool_choice": "required"}, "tool_choice", "only with 'tools'"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "'auto', 'none'"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "'nope' is not among the tools",
        ),
        ({"tools": TOOLS, "grammar": 'root ::= "x"'}, "grammar", "tool_choice 'none'"),
        (
            {"messages": [{"role": "tool", "content": "17"}]},
            "messages",
            "messages[0].tool_call_id",
        ),
        (
            {"messages": [*ASK, {"role": "tool", "content": "17", "tool_call_id": "c9"}]},
            "messages",
            "messages[1].tool_call_id 'c9' answers no tool call",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "x", "function": {"name": "f", "arguments": "{"}}],
                    }
                ]
            },
            "messages",
            "arguments must be a JSON object",
        ),
    ],
)
def test_a_bad_tool_request_is_a_400_naming_it(
    smollm_server: Served, fields: dict[str, Any], param: str, words: str
) -> None:
    body = json.dumps({"messages": ASK, "max_tokens": 8, **fields}).encode()
    got, answer = smollm_server.request(
        "POST", "/chat/completions", body, {"Content-Type": "application/json"}
    )
    assert got == 400, answer
    assert words in answer["error"]["message"]
    assert answer["error"]["param"] == param
    assert "\n" not in answer["error"]["message"]


def test_the_server_still_answers_after_bad_requests(smollm_server: Served) -> None:
    answer = smollm_server.client().chat.completions.create(
        model=model_of(smollm_server), messages=ASK, max_tokens=4, temperature=0
    )
    assert answer.choices[0].message.content


@pytest.mark.default_pair
def test_qwen_s_template_renders_tools_calls_and_results_as_hugging_face_does(
    qwen_draft: LlamaEngine,
) -> None:
    assert qwen_draft.tool_format == "hermes"
    messages = [
        ChatMessage("user", "Weather?"),
        ChatMessage(
            "assistant", "", tool_calls=(ToolCall("c1", "get_weather", '{"city": "Paris"}'),)
        ),
        ChatMessage("tool", "17 °C", tool_call_id="c1"),
    ]
    prompt = qwen_draft.chat_prompt(messages, tools=(WEATHER,))
    tool_json = json.dumps(
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER.description,
                "parameters": dict(WEATHER.parameters),
            },
        },
        ensure_ascii=False,
    )
    assert f"<tools>\n{tool_json}\n</tools>" in prompt  # plain JSON: no HTML escapes
    assert prompt.endswith(
        "<|im_start|>user\nWeather?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n17 °C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    plain = qwen_draft.chat_prompt([ChatMessage("user", "Weather?")])
    assert "<tools>" not in plain  # no tools offered: the template's plain system prompt


def test_a_template_without_tools_gets_hermes_words(smollm_target: LlamaEngine) -> None:
    assert smollm_target.tool_format == "hermes"
    messages = [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", "", tool_calls=(ToolCall("c1", "get_weather", "{}"),)),
        ChatMessage("tool", "17", tool_call_id="c1"),
    ]
    prompt = smollm_target.chat_prompt(messages, tools=(WEATHER,))
    assert prompt.count("<|im_start|>system\nBe brief.\n\n# Tools") == 1
    assert '"name": "get_weather"' in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>' in prompt
    assert "<|im_start|>user\n<tool_response>\n17\n</tool_response><|im_end|>" in prompt
    assert "tool" not in smollm_target.chat_prompt([ChatMessage("user", "Weather?")])


def test_a_forced_call_works_where_the_template_knows_no_tools(smollm_server: Served) -> None:
    answer = smollm_server.client().chat.completions.create(
        model=model_of(smollm_server),
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=60,
    )
    calls = calls_of(answer.choices[0].message)
    assert len(calls) >= 1
    assert {call.function.name for call in calls} <= {"get_weather", "get_time"}
    assert answer.choices[0].finish_reason == "tool_calls"


@pytest.mark.default_pair
def test_an_agent_of_the_openai_agents_sdk_calls_the_tool_and_answers_with_its_result(
    qwen_server: Served,
) -> None:
    """A real agent library over /v1/responses, to the end of a two-step tool call: the
    model's call runs the tool, its result goes back as a function_call_output, and the
    model answers with it."""
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no traces sent to OpenAI's servers
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather now in a city."""
        cities.append(city)
        return "Rain, 9 degrees Celsius"

    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{qwen_server.port}/v1", api_key="none")
    agent = Agent(
        name="Weather",
        instructions="Answer the question in one sentence, using the tool's result.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=model_of(qwen_server), openai_client=client),
        # The first turn must call the tool; the SDK then lets the model choose ("auto").
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=80),
    )
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=3)
    assert cities == ["Paris"]
    assert isinstance(result.final_output, str)
    assert "9" in result.final_output or "rain" in result.final_output.lower()
