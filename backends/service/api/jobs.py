"""What the HTTP side hands the generating side: jobs, their events, the backend, admission.

A handler turns a checked request into an :class:`ApiJob` and submits it to a
:class:`GenerationBackend` (``specdeck serve``'s worker thread, or the engine process
behind the window); the backend runs jobs one at a time and delivers each one's events
(:class:`JobStarted`, the generation's updates, or :class:`JobFailed`) back to the handler.
:class:`RequestCounts` bounds the queue and counts how requests ended.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from backends.errors import ContextOverflowError, SpecDeckError
from backends.service.api.errors import ApiError
from backends.speculation.types import GenerationUpdate

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from backends.engines.interface import ChatMessage, ModelEngine, ToolFormat, ToolFunction
    from backends.speculation.methods import SpeculationMethod
    from backends.speculation.types import GenerationSettings, SpeculationStats

MAX_QUEUED_REQUESTS = 16


@dataclass(frozen=True)
class ServedModel:
    """A model the API answers with: its id, display name and file."""

    id: str
    name: str
    path: str
    tool_format: ToolFormat = "hermes"  # how the model writes tool calls
    # Tool-call markers the model writes as one special token (no text): text -> token id.
    tool_markers: Mapping[str, int] = field(default_factory=dict)

    def is_named_by(self, text: str) -> bool:
        """Whether a request's ``model`` or ``draft_model`` field means this model."""
        return text in (self.id, self.name, self.path)

    @classmethod
    def of(cls, path: str, name: str, tool_format: ToolFormat = "hermes") -> ServedModel:
        """How the API names a loaded model: its file or folder name without ``.gguf``."""
        stem = Path(path).name
        if stem.lower().endswith(".gguf"):
            stem = stem[: -len(".gguf")]
        return cls(id=stem, name=name, path=path, tool_format=tool_format)

    @classmethod
    def of_engine(cls, path: str, engine: ModelEngine) -> ServedModel:
        """A loaded engine as the API names it, with how it writes tool calls."""
        from backends.service.api.tool_calls import marker_tokens

        return replace(
            cls.of(path, engine.name, engine.tool_format), tool_markers=marker_tokens(engine)
        )


@dataclass(frozen=True)
class JobStarted:
    """The prompt fits and generation begins."""

    prompt_tokens: int


@dataclass(frozen=True)
class JobFailed:
    """The job could not run (an ApiError to send as it is)."""

    error: ApiError


JobEvent = JobStarted | GenerationUpdate | JobFailed


@dataclass
class ApiJob:
    """One request for the backend: what to generate and where its events go.

    ``deliver`` is called on the backend's thread; ``cancel`` is set by the HTTP side when
    the client went away.
    """

    messages: tuple[ChatMessage, ...] | None  # chat completions
    text: str | None  # completions: a raw prompt, no chat template
    settings: GenerationSettings
    method: SpeculationMethod | None
    deliver: Callable[[JobEvent], None]
    cancel: threading.Event = field(default_factory=threading.Event)
    tools: tuple[ToolFunction, ...] = ()  # chat completions: the functions offered


class GenerationBackend(Protocol):
    """What the API needs from whatever holds the loaded pair."""

    @property
    def main(self) -> ServedModel | None:
        """The loaded main model (None while none is loaded)."""
        ...

    @property
    def draft(self) -> ServedModel | None:
        """The loaded draft model, if any."""
        ...

    @property
    def n_ctx(self) -> int:
        """The main model's context size (0 while none is loaded)."""
        ...

    @property
    def method(self) -> SpeculationMethod:
        """The speculation method requests get unless they ask for another."""
        ...

    @property
    def counts(self) -> RequestCounts:
        """Requests waiting or running, and how those that ran ended."""
        ...

    @property
    def unavailable(self) -> str | None:
        """Why no request can run now (loading, failed), or None."""
        ...

    def submit(self, job: ApiJob) -> None:
        """Queue a job; raises ApiError when it cannot be queued."""
        ...


class RequestCounts:
    """A backend's requests: how many wait or run (bounded), and how those that ran ended."""

    def __init__(self, limit: int = MAX_QUEUED_REQUESTS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self.queued = 0
        self.served = 0  # answered to the end
        self.cancelled = 0  # their client went away first

    def admit(self) -> None:
        """Count a new request in; ApiError 429 when the queue is full."""
        with self._lock:
            if self.queued >= self.limit:
                raise ApiError(
                    429,
                    "too many requests are waiting; try again shortly",
                    error_type="server_error",
                )
            self.queued += 1

    def finished(self, stats: SpeculationStats | None) -> None:
        """A request left the queue: answered (its final stats) or failed (None)."""
        with self._lock:
            self.queued -= 1
            if stats is not None and stats.stop_reason == "cancelled":
                self.cancelled += 1
            elif stats is not None:
                self.served += 1


def job_failed(error: BaseException) -> JobFailed:
    """The event for an exception raised while running a job."""
    if isinstance(error, ApiError):
        return JobFailed(error)
    if isinstance(error, ContextOverflowError):
        return JobFailed(ApiError(400, str(error), code="context_length_exceeded"))
    if isinstance(error, SpecDeckError):
        return JobFailed(ApiError(400, str(error)))
    return JobFailed(
        ApiError(
            500, f"generation failed: {type(error).__name__}: {error}", error_type="server_error"
        )
    )
