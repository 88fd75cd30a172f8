"""The Responses API (``POST /v1/responses``) through the real openai client: text, JSON, tools."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import openai
import pytest

from backends.engines.interface import ToolCall
from backends.service.api.jobs import ServedModel
from backends.service.api.responses import ResponseAnswer, ResponseStream
from tests.test_api_server import MESSAGES, QUESTION, Served
from tests.test_api_tools import model_of
from tests.test_grammar import PERSON_PROMPT, PERSON_SCHEMA, assert_person

if TYPE_CHECKING:
    from openai.types.responses import FunctionToolParam

WEATHER_TOOL: FunctionToolParam = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city now",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def chat_text(server: Served, **fields: Any) -> str:
    """What the chat completions endpoint answers to the same request."""
    answer = server.client().chat.completions.create(model=model_of(server), **fields)
    return answer.choices[0].message.content or ""


def test_a_text_input_is_answered_as_chat_would_with_usage_and_stats(
    smollm_server: Served,
) -> None:
    client = smollm_server.client()
    response = client.responses.create(
        model=model_of(smollm_server),
        instructions="Be brief.",
        input=QUESTION,
        max_output_tokens=24,
        temperature=0,
    )
    expected = chat_text(
        smollm_server,
        messages=[{"role": "system", "content": "Be brief."}, *MESSAGES],
        max_tokens=24,
        temperature=0,
    )
    assert response.output_text == expected
    assert response.status in ("completed", "incomplete")
    assert response.model_dump()["store"] is False
    assert response.usage is not None
    assert response.usage.output_tokens == len((response.model_extra or {})["specdeck"]["tokens"])
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    stats = (response.model_extra or {})["specdeck"]["stats"]
    assert stats["total_draft_tokens_count"] >= stats["accepted_draft_tokens_count"]
    if response.status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"


def test_the_stream_has_the_standard_events_in_order(smollm_server: Served) -> None:
    client = smollm_server.client()
    request: dict[str, Any] = {
        "model": model_of(smollm_server),
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}],
        "max_output_tokens": 16,
        "temperature": 0,
    }
    whole = client.responses.create(**request)
    kinds = []
    deltas = ""
    numbers = []
    final = None
    for event in client.responses.create(**request, stream=True):
        kinds.append(event.type)
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            deltas += event.delta
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert numbers == list(range(len(numbers)))
    assert deltas == whole.output_text
    assert final is not None
    assert final.output_text == whole.output_text


def test_text_format_json_schema_shapes_the_answer(smollm_server: Served) -> None:
    response = smollm_server.client().responses.create(
        model=model_of(smollm_server),
        input=PERSON_PROMPT,
        max_output_tokens=200,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON_SCHEMA}},
    )
    assert_person(response.output_text)


def test_function_calls_and_their_outputs_round_trip(smollm_server: Served) -> None:
    client = smollm_server.client()
    ask: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    response = client.responses.create(
        model=model_of(smollm_server),
        input=ask,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        temperature=0,
        max_output_tokens=60,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert [call.name for call in calls] == ["get_weather"]
    assert set(json.loads(calls[0].arguments)) == {"city"}
    assert calls[0].call_id
    # Streamed, the same call, with its arguments' events.
    kinds = []
    streamed = None
    for event in client.responses.create(
        model=model_of(smollm_server),
        input=ask,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        temperature=0,
        max_output_tokens=60,
        stream=True,
    ):
        kinds.append(event.type)
        if event.type == "response.function_call_arguments.done":
            streamed = event.arguments
    assert streamed == calls[0].arguments
    assert "response.function_call_arguments.delta" in kinds
    # The call and its output go back as items; the answer is text now.
    follow_up = client.responses.create(
        model=model_of(smollm_server),
        input=[
            *ask,
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": "get_weather",
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "17 C"},
        ],
        tools=[WEATHER_TOOL],
        tool_choice="none",
        temperature=0,
        max_output_tokens=24,
    )
    assert follow_up.output_text
    assert not [item for item in follow_up.output if item.type == "function_call"]


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "stores no responses"),
        ({"input": []}, "input", "non-empty list"),
        ({"input": [{"type": "reasoning"}]}, "input", "'reasoning' is not supported"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "only function tools"),
        ({"text": {"format": "json"}}, "text.format", "must be an object"),
        ({"instructions": 3}, "instructions", "must be a string"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c9", "output": "17"}]},
            "input",
            "input[0].call_id 'c9' answers no function_call before it",
        ),
    ],
)
def test_a_bad_responses_request_is_a_400_naming_it(
    smollm_server: Served,
    fields: dict[str, Any],
    param: str,
    words: str,
) -> None:
    body = json.dumps({"input": "hi", "max_output_tokens": 4, **fields}).encode()
    got, answer = smollm_server.request(
        "POST", "/responses", body, {"Content-Type": "application/json"}
    )
    assert got == 400, answer
    assert answer["error"]["param"] == param
    assert words in answer["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        smollm_server.client().responses.create(
            model=model_of(smollm_server), input="hi", previous_response_id="resp_1"
        )


def test_models_says_responses_are_not_stored(smollm_server: Served) -> None:
    notes = smollm_server.status()["notes"]
    assert any("stateless" in note for note in notes)


class _CollectedEvents:
    """Stands in for the stream's HTTP response: keeps what the stream writes."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def write(self, data: bytes) -> None:
        line = data.decode().split("\n")[1]
        self.events.append(json.loads(line.removeprefix("data: ")))


def test_text_after_a_streamed_call_is_a_message_item_of_its_own() -> None:
    served = ServedModel.of("/models/m.gguf", "m")
    answer = ResponseAnswer({"input": "hi"}, served)
    sink = _CollectedEvents()
    stream = ResponseStream(answer, sink)  # type: ignore[arg-type]

    async def write_all() -> None:
        await stream.text("Let me look. ")
        await stream.call(ToolCall("call_1", "get_weather", '{"city": "Paris"}'))
        await stream.text("It is ")
        await stream.text("sunny.")
        await stream.close_message()

    asyncio.run(write_all())
    kinds = [event["type"] for event in sink.events]
    assert kinds.count("response.output_item.added") == 3
    done = [e for e in sink.events if e["type"] == "response.output_text.done"]
    assert [e["text"] for e in done] == ["Let me look. ", "It is sunny."]
    messages = [item for item in answer.output if item["type"] == "message"]
    assert [m["content"][0]["text"] for m in messages] == ["Let me look. ", "It is sunny."]
    assert messages[0]["id"] != messages[1]["id"]
    assert [item["type"] for item in answer.output] == ["message", "function_call", "message"]
    # Every event of an item names that item's id and place.
    for event in sink.events:
        if "item_id" in event and event["type"].startswith("response.output_text"):
            item = answer.output[event["output_index"]]
            assert event["item_id"] == item["id"]
