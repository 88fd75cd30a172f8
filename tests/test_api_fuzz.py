"""The API under generated requests: every answer a 2xx or an OpenAI-shaped 4xx, never a 500.

Requests come from the API's own OpenAPI description (``GET /openapi.json``): bodies that
follow each endpoint's schema, the same with one field replaced by any JSON value, and any
JSON at all. Each must be answered within a minute (no hang) with a status below 500; a
4xx carries OpenAI's error object with a one-line message; a 200 stream ends as its kind
of stream ends. Afterwards the server still answers a normal request (no dead engine).

``SPECDECK_FUZZ_EXAMPLES`` sets how many requests each endpoint gets (100 by default, in the
suite); docs/benchmarks.md ("The API under fuzzing") says what runs by hand found.
"""

from __future__ import annotations

import http.client
import json
import os
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.service.api.openapi import (
    CHAT_REQUEST,
    COMPLETION_REQUEST,
    RESPONSES_REQUEST,
    openapi_document,
)
from tests.test_api_server import Served, serve

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

FUZZ_EXAMPLES = int(os.environ.get("SPECDECK_FUZZ_EXAMPLES", "100"))
# The suite asks the same requests every run (a CI run fails for a change, not for luck);
# SPECDECK_FUZZ_RANDOM=1 draws new ones, as a run by hand should.
FUZZ_DERANDOMIZED = not os.environ.get("SPECDECK_FUZZ_RANDOM")
REQUEST_TIMEOUT_SECONDS = 60
ENDPOINTS: dict[str, dict[str, Any]] = {
    "/chat/completions": CHAT_REQUEST,
    "/completions": COMPLETION_REQUEST,
    "/responses": RESPONSES_REQUEST,
}
STREAM_ENDS = {
    "/chat/completions": (b"data: [DONE]",),
    "/completions": (b"data: [DONE]",),
    "/responses": (b"event: response.completed", b"event: response.incomplete", b"event: error"),
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)


def following(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values that follow ``schema``, for the JSON schema words the API's description uses.

    (hypothesis-jsonschema does this in general, but its release of the day does not run
    with Hypothesis' own.) Optional properties come and go; patterns are regexes.
    """
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([following(option) for option in schema["anyOf"]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([following({**schema, "type": one}) for one in kind])
    if kind == "object":
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        if not properties:
            return st.dictionaries(st.text(max_size=8), json_values, max_size=3)
        return st.fixed_dictionaries(
            {name: following(properties[name]) for name in sorted(required)},
            optional={
                name: following(sub) for name, sub in properties.items() if name not in required
            },
        )
    if kind == "array":
        return st.lists(
            following(schema.get("items", {})),
            min_size=schema.get("minItems", 0),
            max_size=schema.get("maxItems", 3),
        )
    if kind == "string":
        if schema.get("contentMediaType") == "application/json":  # a JSON object's text
            return st.dictionaries(st.text(max_size=8), json_values, max_size=3).map(json.dumps)
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True)
        return st.text(min_size=schema.get("minLength", 0), max_size=40)
    if kind == "integer":  # near the minimum: token counts cost time, and the rest is alike
        low = schema.get("minimum")
        high = schema.get("maximum", None if low is None else low + 24)
        return st.integers(low, high)
    if kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        return st.floats(
            low,
            schema.get("maximum"),
            exclude_min="exclusiveMinimum" in schema,
            allow_nan=False,
            allow_infinity=False,
        )
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return json_values


def requests_for(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Bodies that follow ``schema`` (half), the same with one field changed, and any JSON."""
    # A valid body names no model (or it would have to name the loaded one).
    valid = following(schema).map(
        lambda body: {k: v for k, v in body.items() if k not in ("model", "draft_model")}
    )
    fields = sorted(schema["properties"])
    changed = st.tuples(valid, st.sampled_from(fields), json_values).map(
        lambda body_field_value: {**body_field_value[0], body_field_value[1]: body_field_value[2]}
    )
    return st.one_of(valid, valid, changed, json_values)  # half of them valid


@pytest.fixture(scope="module")
def fuzz_server(smollm_path: Path) -> Iterator[Served]:
    # Short answers (the requests are what is tested): 8 tokens unless a request asks for
    # more, and a small context bounds what any request can ask for.
    with serve("--main", str(smollm_path), "--ctx", "256", "--max-tokens", "8") as served:
        yield served


def post(server: Served, path: str, body: Any) -> tuple[int, str, bytes]:
    """POST ``body`` as JSON; the status, the content type and the whole body."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", server.port, timeout=REQUEST_TIMEOUT_SECONDS
    )
    try:
        connection.request(
            "POST",
            "/v1" + path,
            body=json.dumps(body, allow_nan=True).encode(),
            headers={"Content-Type": "application/json"},
        )
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        connection.close()


def check_answer(path: str, status: int, content_type: str, data: bytes) -> None:
    """What any answer must be: a 2xx of its endpoint's shape, or an OpenAI-shaped 4xx."""
    assert status < 500, (status, data[:500])
    assert 200 <= status < 300 or 400 <= status < 500, status
    if status >= 400:
        error = json.loads(data)["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert error["message"], error
        assert "\n" not in error["message"], error
        return
    if content_type.startswith("text/event-stream"):
        last = data.strip().split(b"\n\n")[-1]
        assert last.startswith(STREAM_ENDS[path]), data[-500:]
    else:
        answer = json.loads(data)
        assert answer["object"] in ("chat.completion", "text_completion", "response")


@pytest.mark.heavy
@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_generated_requests_never_get_a_500_or_hang(fuzz_server: Served, path: str) -> None:
    @settings(
        max_examples=FUZZ_EXAMPLES,
        derandomize=FUZZ_DERANDOMIZED,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(body=requests_for(ENDPOINTS[path]))
    def one_request(body: Any) -> None:
        check_answer(path, *post(fuzz_server, path, body))

    one_request()
    # Still alive, and still answering.
    assert fuzz_server.status()["unavailable"] is None
    status, _, data = post(
        fuzz_server,
        "/chat/completions",
        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert status == 200, data
    assert json.loads(data)["choices"][0]["message"]["content"]


def test_the_description_names_every_route_and_is_served(fuzz_server: Served) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", fuzz_server.port, timeout=30)
    connection.request("GET", "/openapi.json")
    response = connection.getresponse()
    served = json.loads(response.read())
    connection.close()
    assert response.status == 200
    document = openapi_document("x")
    assert served["paths"] == document["paths"]
    assert set(served["paths"]) == {
        "/v1/models",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/openapi.json",
    }
    assert served["openapi"].startswith("3.1")
