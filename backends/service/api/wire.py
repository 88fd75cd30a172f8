"""OpenAI's wire format: envelopes and choices, usage, LM Studio's stats, llama.cpp's timings, SSE.

Pure functions of a request and its generation's updates; the handlers in :mod:`.app`
write what they build.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.engines.interface import ToolCall
    from backends.service.api.jobs import ServedModel
    from backends.service.api.parsing import Endpoint
    from backends.speculation.types import GenerationUpdate, SpeculationStats, StopReason

# OpenAI's finish reasons for SpecDeck's stop reasons.
FINISH_REASONS: dict[StopReason, str] = {
    "eos": "stop",
    "stop_string": "stop",
    "max_tokens": "length",
    "context_full": "length",
    "cancelled": "stop",
}
# LM Studio's stop reasons (its REST API's stats.stop_reason).
LMSTUDIO_STOP_REASONS: dict[StopReason, str] = {
    "eos": "eosFound",
    "stop_string": "stopStringFound",
    "max_tokens": "maxPredictedTokensReached",
    "context_full": "contextLengthReached",
    "cancelled": "userStopped",
}


def finish_reason(stats: SpeculationStats, called: bool = False) -> str:
    """OpenAI's ``finish_reason`` for how a generation stopped (``called``: with tool calls)."""
    if called:
        return "tool_calls"
    return FINISH_REASONS.get(stats.stop_reason or "eos", "stop")


def tool_call_dicts(
    calls: Sequence[ToolCall], first_index: int | None = None
) -> list[dict[str, Any]]:
    """Calls as OpenAI writes them: in a message, or (``first_index`` given) in a delta."""
    dicts = []
    for number, call in enumerate(calls):
        entry: dict[str, Any] = {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        if first_index is not None:
            entry = {"index": first_index + number, **entry}
        dicts.append(entry)
    return dicts


def lmstudio_stats(stats: SpeculationStats, draft: ServedModel | None) -> dict[str, Any]:
    """LM Studio's ``stats`` object (its REST API's names)."""
    result: dict[str, Any] = {
        "tokens_per_second": stats.tokens_per_second,
        "time_to_first_token": stats.time_to_first_token_sec,
        "generation_time": stats.generation_seconds,
        "stop_reason": LMSTUDIO_STOP_REASONS.get(stats.stop_reason or "eos", "eosFound"),
        "total_draft_tokens_count": stats.total_draft_tokens_count,
        "accepted_draft_tokens_count": stats.accepted_draft_tokens_count,
        "rejected_draft_tokens_count": stats.rejected_draft_tokens_count,
        "ignored_draft_tokens_count": stats.ignored_draft_tokens_count,
        # SpecDeck's own: under a grammar, the tokens it allowed alone (never drafted).
        "grammar_tokens_count": stats.grammar_tokens_count,
    }
    if draft is not None:
        result["draft_model"] = draft.id
    return result


def llama_timings(stats: SpeculationStats) -> dict[str, Any]:
    """llama.cpp server's ``timings`` object."""
    prompt_ms = 1000.0 * (stats.time_to_first_token_sec or 0.0)
    predicted_ms = 1000.0 * stats.generation_seconds
    return {
        "prompt_n": stats.prompt_tokens,
        "prompt_ms": prompt_ms,
        "prompt_per_second": stats.prompt_tokens / (prompt_ms / 1000.0) if prompt_ms else 0.0,
        "predicted_n": stats.generated_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / max(1, stats.generated_tokens - 1),
        "predicted_per_second": stats.tokens_per_second,
        "draft_n": stats.total_draft_tokens_count,
        "draft_n_accepted": stats.accepted_draft_tokens_count,
    }


def usage(stats: SpeculationStats) -> dict[str, int]:
    """OpenAI's token counts."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
    }


def origins(update: GenerationUpdate) -> list[dict[str, Any]]:
    """Each released token of a round: id, text and who produced it."""
    return [
        {"id": token.token_id, "text": token.text, "origin": token.origin.value}
        for token in update.tokens
    ]


class Answer:
    """The response envelope shared by a request's chunks or its one body."""

    def __init__(self, endpoint: Endpoint, model: ServedModel) -> None:
        self.endpoint = endpoint
        self.model = model
        prefix = "chatcmpl" if endpoint == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.object = "chat.completion" if endpoint == "chat" else "text_completion"

    def envelope(self, chunk: bool) -> dict[str, Any]:
        """The fields every body or chunk of this answer starts with."""
        kind = self.object + (".chunk" if chunk and self.endpoint == "chat" else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model.id}

    def choice(
        self,
        text: str,
        finish: str | None,
        *,
        chunk: bool,
        first: bool,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The one choice: a message (a whole chat answer), a delta (a chat chunk) or text.

        ``tool_calls`` (from :func:`tool_call_dicts`): the calls the message or delta holds.
        """
        if self.endpoint == "completion":
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        if chunk:
            delta: dict[str, Any] = {"content": text}
            if first:
                delta["role"] = "assistant"
            if tool_calls:
                delta["tool_calls"] = tool_calls
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if tool_calls:
            message["content"] = text or None
            message["tool_calls"] = tool_calls
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` (or ``data: [DONE]``) and a blank line."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n".encode()
