"""The API described for machines: an OpenAPI 3.1 document, served at ``GET /openapi.json``.

It says what each endpoint takes and answers, as :mod:`.parsing` checks it and
:mod:`.wire` and :mod:`.responses` write it: OpenAI's fields SpecDeck reads (others are
ignored, as OpenAI's own servers ignore unknown ones), SpecDeck's ``specdeck`` extension
and llama.cpp's ``grammar``. The fuzz test generates requests from it.
"""

from __future__ import annotations

from typing import Any

from backends.speculation.methods import METHODS

_TEXT_OR_PARTS: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                "required": ["type", "text"],
            },
        },
    ]
}
_TOOL_CALL: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "arguments": {"type": "string", "contentMediaType": "application/json"},
            },
            "required": ["name", "arguments"],
        },
    },
    "required": ["id", "function"],
}
_MESSAGE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {
            **_TEXT_OR_PARTS,
            "description": "may be null on an assistant message with tool_calls",
        },
        "tool_calls": {"type": "array", "items": _TOOL_CALL},
        "tool_call_id": {"type": "string"},
    },
    "required": ["role", "content"],
}
_FUNCTION_NAME: dict[str, Any] = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}
_PARAMETERS: dict[str, Any] = {"type": "object", "description": "a JSON schema"}
_TOOL: dict[str, Any] = {
    "type": "object",
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "properties": {
                "name": _FUNCTION_NAME,
                "description": {"type": "string"},
                "parameters": _PARAMETERS,
            },
            "required": ["name"],
        },
    },
    "required": ["type", "function"],
}
_TOOL_CHOICE: dict[str, Any] = {
    "anyOf": [
        {"enum": ["auto", "none", "required"]},
        {
            "type": "object",
            "properties": {
                "type": {"const": "function"},
                "function": {
                    "type": "object",
                    "properties": {"name": _FUNCTION_NAME},
                    "required": ["name"],
                },
            },
            "required": ["type", "function"],
        },
    ]
}
_RESPONSE_FORMAT: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "properties": {"type": {"enum": ["text", "json_object"]}},
            "required": ["type"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "json_schema"},
                "json_schema": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "schema": {"type": "object"},
                        "strict": {"type": "boolean"},
                    },
                    "required": ["schema"],
                },
            },
            "required": ["type", "json_schema"],
        },
    ]
}
_SPECDECK: dict[str, Any] = {
    "type": "object",
    "description": "SpecDeck's speculation settings for this request",
    "properties": {
        "method": {"enum": list(METHODS)},
        "draft_max": {"type": "integer", "minimum": 0},
        "draft_min": {"type": "integer", "minimum": 0},
        "p_min": {"type": "number", "minimum": 0, "maximum": 1},
        "lookup_draft_max": {"type": "integer", "minimum": 0},
        "verification": {"enum": ["rejection", "sample-match"]},
    },
}
_SAMPLING: dict[str, Any] = {
    "temperature": {"type": "number", "minimum": 0},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 0},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "seed": {"type": "integer"},
}
_COMMON: dict[str, Any] = {
    "model": {"type": "string", "description": "the loaded main model's id, name or path"},
    "draft_model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 1, "description": "at most the context size"},
    "stop": {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4},
        ]
    },
    "n": {"const": 1},
    "stream": {"type": "boolean"},
    "stream_options": {
        "type": "object",
        "properties": {"include_usage": {"type": "boolean"}},
    },
    "response_format": _RESPONSE_FORMAT,
    "grammar": {"type": "string", "minLength": 1, "description": "llama.cpp's GBNF"},
    "specdeck": _SPECDECK,
    **_SAMPLING,
}
CHAT_REQUEST: dict[str, Any] = {
    "type": "object",
    "properties": {
        "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "tools": {"type": "array", "items": _TOOL},
        "tool_choice": _TOOL_CHOICE,
        "parallel_tool_calls": {"type": "boolean"},
        **_COMMON,
    },
    "required": ["messages"],
}
COMPLETION_REQUEST: dict[str, Any] = {
    "type": "object",
    "properties": {
        "prompt": {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
            ]
        },
        **_COMMON,
    },
    "required": ["prompt"],
}
_INPUT_ITEM: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "type": {"const": "message"},
                "role": {"enum": ["system", "developer", "user", "assistant"]},
                "content": {
                    "anyOf": [
                        {"type": "string"},
                        {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "type": {"enum": ["input_text", "output_text"]},
                                    "text": {"type": "string"},
                                },
                                "required": ["type", "text"],
                            },
                        },
                    ]
                },
            },
            "required": ["role", "content"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "function_call"},
                "call_id": {"type": "string"},
                "name": {"type": "string"},
                "arguments": {"type": "string"},
            },
            "required": ["type", "call_id", "name", "arguments"],
        },
        {
            "type": "object",
            "properties": {
                "type": {"const": "function_call_output"},
                "call_id": {"type": "string"},
                "output": {"type": "string"},
            },
            "required": ["type", "call_id", "output"],
        },
    ]
}
RESPONSES_REQUEST: dict[str, Any] = {
    "type": "object",
    "properties": {
        "model": {"type": "string"},
        "input": {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "items": _INPUT_ITEM, "minItems": 1},
            ]
        },
        "instructions": {"type": "string"},
        "max_output_tokens": {"type": "integer", "minimum": 1},
        "temperature": _SAMPLING["temperature"],
        "top_p": _SAMPLING["top_p"],
        "stream": {"type": "boolean"},
        "store": {"type": "boolean", "description": "accepted; nothing is ever stored"},
        "text": {
            "type": "object",
            "properties": {
                "format": {
                    "type": "object",
                    "properties": {
                        "type": {"enum": ["text", "json_object", "json_schema"]},
                        "name": {"type": "string"},
                        "schema": {"type": "object"},
                        "strict": {"type": "boolean"},
                    },
                    "required": ["type"],
                }
            },
        },
        "tools": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"const": "function"},
                    "name": _FUNCTION_NAME,
                    "description": {"type": "string"},
                    "parameters": _PARAMETERS,
                    "strict": {"type": "boolean"},
                },
                "required": ["type", "name"],
            },
        },
        "tool_choice": {
            "anyOf": [
                {"enum": ["auto", "none", "required"]},
                {
                    "type": "object",
                    "properties": {"type": {"const": "function"}, "name": _FUNCTION_NAME},
                    "required": ["type", "name"],
                },
            ]
        },
        "parallel_tool_calls": {"type": "boolean"},
        "specdeck": _SPECDECK,
    },
    "required": ["input"],
}
ERROR: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}
_ANSWER: dict[str, Any] = {
    "type": "object",
    "description": "OpenAI's answer object, with LM Studio's stats, llama.cpp's timings and "
    "SpecDeck's per-token origins",
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string"},
        "model": {"type": "string"},
        "choices": {"type": "array"},
        "usage": {"type": "object"},
        "stats": {"type": "object"},
        "timings": {"type": "object"},
        "specdeck": {"type": "object"},
    },
    "required": ["id", "object", "model", "choices"],
}
_RESPONSE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "response"},
        "status": {"enum": ["completed", "incomplete"]},
        "output": {"type": "array"},
        "usage": {"type": "object"},
        "store": {"const": False},
    },
    "required": ["id", "object", "status", "output"],
}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "a bad request, the field named in param",
        401: "missing or wrong API key",
        404: "no such endpoint",
        413: "the body is too large",
        429: "too many requests waiting",
        499: "the client went away before its turn",
        503: "no model is loaded yet, or it could not be loaded",
    }
    return {
        str(code): {
            "description": words[code],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for code in codes
    }


def _completion(summary: str, request: str, answer: str, stream_events: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{request}"}}
                },
            },
            "responses": {
                "200": {
                    "description": f"the answer (stream: {stream_events})",
                    "content": {
                        "application/json": {"schema": {"$ref": f"#/components/schemas/{answer}"}},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                **_errors(400, 401, 413, 429, 503),
            },
        }
    }


def openapi_document(version: str) -> dict[str, Any]:
    """The whole API, as OpenAPI 3.1 describes one."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "SpecDeck local API",
            "version": version,
            "description": "OpenAI-compatible answers by speculative decoding on the loaded "
            "pair. /v1/responses is stateless: nothing is stored.",
        },
        "paths": {
            "/v1/models": {
                "get": {
                    "summary": "The loaded main model and its draft, and the server's state",
                    "responses": {
                        "200": {
                            "description": "OpenAI's model list, with SpecDeck's status",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        **_errors(401),
                    },
                }
            },
            "/v1/chat/completions": _completion(
                "A chat answer", "ChatRequest", "Answer", "chat.completion.chunk events"
            ),
            "/v1/completions": _completion(
                "A raw prompt's continuation", "CompletionRequest", "Answer", "text chunks"
            ),
            "/v1/responses": _completion(
                "A response (OpenAI's Responses API, stateless)",
                "ResponsesRequest",
                "Response",
                "response.* events",
            ),
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {
                        "200": {
                            "description": "OpenAPI 3.1",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        **_errors(401),
                    },
                }
            },
        },
        "components": {
            "schemas": {
                "ChatRequest": CHAT_REQUEST,
                "CompletionRequest": COMPLETION_REQUEST,
                "ResponsesRequest": RESPONSES_REQUEST,
                "Answer": _ANSWER,
                "Response": _RESPONSE,
                "Error": ERROR,
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
