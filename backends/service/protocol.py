"""The messages between the window and its engine process: JSON lines, one object per line.

The window sends commands (``load``, ``generate``, ``cancel``, ``unload``, ``quit``) on the
engine process's stdin; the process answers with events on its stdout. Every object has a
``type``; the dataclasses here are the typed form of both directions, so the two sides
cannot drift apart. Stats travel as :class:`SpeculationStats` fields.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from backends.engines.draft_weights import DraftWeights, check_draft_weights
from backends.engines.interface import DEFAULT_CONTEXT_SIZE, ChatMessage
from backends.engines.layer_split import parse_split
from backends.engines.load_guard import RiskySettings
from backends.engines.selection import ENGINE_KINDS, EngineKind
from backends.engines.weight_placement import WEIGHT_REPACKING_MODES, WeightRepacking
from backends.engines.worker_probe import parse_workers
from backends.errors import SettingsError
from backends.service.context_fit import ContextPolicy, parse_policy
from backends.speculation.methods import DEFAULT_METHOD, SpeculationMethod, parse_method
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import (
    EmittedToken,
    GenerationSettings,
    SpeculationStats,
    TokenOrigin,
)

RunKind = Literal["speculative", "plain"]  # plain = the main model alone, for comparison

DEFAULT_CONTEXT = DEFAULT_CONTEXT_SIZE
# Where the local API listens unless told otherwise (``serve_start``, ``specdeck serve``).
DEFAULT_API_HOST = "127.0.0.1"
DEFAULT_API_PORT = 8765
# Listening on every address of the machine (the window's "Other machines too").
ALL_ADDRESSES_HOST = "0.0.0.0"


def is_loopback_host(host: str) -> bool:
    """Whether only programs on this machine can reach ``host`` (127.0.0.1, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class LoadRequest:
    """Load a main model and optionally a draft model, and the speculation method to use."""

    main_path: str
    draft_path: str | None = None
    engine: EngineKind = "llama.cpp"
    method: SpeculationMethod = DEFAULT_METHOD
    n_ctx: int = DEFAULT_CONTEXT
    gpu_layers: int = -1  # main model layers on the GPU; the draft always goes fully there
    n_threads: int | None = None
    weight_repacking: WeightRepacking = "auto"
    # llama.cpp RPC workers ("host:port") for the main model, and the layer split (one
    # share per worker, the last for this computer; empty = by free memory).
    workers: tuple[str, ...] = ()
    layer_split: tuple[float, ...] = ()
    draft_weights: DraftWeights = "auto"  # a Q4_0 copy of a CPU draft where lighter

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_KINDS:
            raise SettingsError(f"unknown engine {self.engine!r}; choose llama.cpp or mlx")
        # JSON brings lists; keep the request hashable and its workers in one spelling.
        workers = tuple(str(worker) for worker in parse_workers(self.workers))
        object.__setattr__(self, "workers", workers)
        object.__setattr__(self, "layer_split", parse_split(self.layer_split, len(workers)))
        if workers and self.engine != "llama.cpp":
            raise SettingsError("workers need the llama.cpp engine (MLX runs on one machine)")
        if self.weight_repacking not in WEIGHT_REPACKING_MODES:
            choices = ", ".join(WEIGHT_REPACKING_MODES)
            raise SettingsError(
                f"weight repacking must be one of {choices}, got {self.weight_repacking!r}"
            )
        parse_method(self.method)
        check_draft_weights(self.draft_weights)
        if self.method == "draft-model" and self.draft_path is None:
            raise SettingsError("'draft model only' needs a draft model; pick one")
        if self.n_ctx < 256:
            raise SettingsError(f"context size must be at least 256 tokens, got {self.n_ctx}")

    @property
    def models(self) -> tuple[str, ...]:
        """The model paths to load, main first."""
        return (self.main_path,) if self.draft_path is None else (self.main_path, self.draft_path)

    @property
    def risky(self) -> RiskySettings:
        """The settings a native crash while loading can depend on."""
        return RiskySettings(self.weight_repacking, self.gpu_layers, self.n_threads)

    def without_worker(self, worker: str) -> LoadRequest:
        """The same request with one worker fewer (and the split by free memory)."""
        return replace(self, workers=tuple(w for w in self.workers if w != worker), layer_split=())

    def with_risky(self, settings: RiskySettings) -> LoadRequest:
        """The same request with other crash-prone settings."""
        return replace(
            self,
            weight_repacking=settings.weight_repacking,
            gpu_layers=settings.gpu_layers,
            n_threads=settings.n_threads,
        )


@dataclass(frozen=True)
class GenerateRequest:
    """Answer a conversation; ``compare`` also answers it with the main model alone."""

    request_id: int
    messages: tuple[ChatMessage, ...]
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    compare: bool = False
    method: SpeculationMethod | None = None  # None: the method chosen at load
    # What to leave out of a conversation that outgrew the context (context_fit.py).
    context_policy: ContextPolicy = "stop"

    def __post_init__(self) -> None:
        if self.method is not None:
            parse_method(self.method)
        parse_policy(self.context_policy)
        if not self.messages:
            raise SettingsError("nothing to answer: the conversation is empty")


@dataclass(frozen=True)
class WorkerReport:
    """A worker of the loaded main model as the window shows it (the ``workers`` event)."""

    address: str
    reachable: bool
    problem: str = ""
    memory_free: int = 0
    memory_total: int = 0
    layers: int = 0  # the main model's repeating layers it holds

    def summary(self) -> str:
        """E.g. "10.0.0.5:50052 ✓ 14 layers, 3.1 of 24.0 GB free" or "… ✗ gone"."""
        if not self.reachable:
            return f"{self.address} ✗ {self.problem}"
        return (
            f"{self.address} ✓ {self.layers} layers, {self.memory_free / 1e9:.1f} of "
            f"{self.memory_total / 1e9:.1f} GB free"
        )


def worker_reports(message: dict[str, Any]) -> tuple[WorkerReport, ...]:
    """The WorkerReports of a ``workers`` event."""
    known = {f.name for f in fields(WorkerReport)}
    return tuple(
        WorkerReport(**{k: v for k, v in item.items() if k in known})
        for item in message.get("workers", ())
    )


# -- encoding --------------------------------------------------------------------------------


def encode(message: dict[str, Any]) -> bytes:
    """One JSON line."""
    return (json.dumps(message, separators=(",", ":")) + "\n").encode("utf-8")


def decode(line: bytes | str) -> dict[str, Any]:
    """Parse one JSON line into a message with a ``type``."""
    message = json.loads(line)
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ValueError(f"not a protocol message: {str(line)[:80]!r}")
    return message


def load_command(request: LoadRequest) -> dict[str, Any]:
    """The ``load`` command for ``request``."""
    return {"type": "load", **asdict(request)}


def parse_load(message: dict[str, Any]) -> LoadRequest:
    """The LoadRequest of a ``load`` command."""
    known = {f.name for f in fields(LoadRequest)}
    return LoadRequest(**{k: v for k, v in message.items() if k in known})


def generate_command(request: GenerateRequest) -> dict[str, Any]:
    """The ``generate`` command for ``request``."""
    settings = request.settings
    return {
        "type": "generate",
        "request_id": request.request_id,
        "messages": [[m.role, m.content] for m in request.messages],
        "settings": {
            **{f.name: getattr(settings, f.name) for f in fields(settings) if f.name != "sampling"},
            "sampling": asdict(settings.sampling),
        },
        "compare": request.compare,
        "method": request.method,
        "context_policy": request.context_policy,
    }


def parse_generate(message: dict[str, Any]) -> GenerateRequest:
    """The GenerateRequest of a ``generate`` command (SettingsError for impossible settings)."""
    raw = dict(message["settings"])
    sampling = SamplingSettings(**raw.pop("sampling"))
    raw["stop_strings"] = tuple(raw.get("stop_strings", ()))
    settings = GenerationSettings(sampling=sampling, **raw)
    messages = tuple(ChatMessage(role, content) for role, content in message["messages"])
    return GenerateRequest(
        int(message["request_id"]),
        messages,
        settings,
        bool(message["compare"]),
        message.get("method"),
        parse_policy(str(message.get("context_policy", "stop"))),
    )


def tokens_to_wire(tokens: tuple[EmittedToken, ...]) -> list[list[Any]]:
    """Tokens as ``[id, text, origin]`` triples."""
    return [[t.token_id, t.text, t.origin.value] for t in tokens]


def tokens_from_wire(raw: list[list[Any]]) -> list[EmittedToken]:
    """The inverse of :func:`tokens_to_wire`."""
    return [EmittedToken(int(i), str(text), TokenOrigin(origin)) for i, text, origin in raw]


# Stats fields keyed by a size (JSON keys are strings).
_COUNTS_BY_SIZE = ("draft_length_counts", "verify_batch_counts")


def stats_to_wire(stats: SpeculationStats) -> dict[str, Any]:
    """Every stats field, JSON-safe."""
    wire = asdict(stats)
    for name in _COUNTS_BY_SIZE:
        wire[name] = {str(k): v for k, v in getattr(stats, name).items()}
    return wire


def stats_from_wire(raw: dict[str, Any]) -> SpeculationStats:
    """The inverse of :func:`stats_to_wire` (unknown fields are ignored)."""
    known = {f.name for f in fields(SpeculationStats)}
    values = {k: v for k, v in raw.items() if k in known}
    for name in _COUNTS_BY_SIZE:
        values[name] = {int(k): int(v) for k, v in values.get(name, {}).items()}
    return SpeculationStats(**values)


__all__ = [
    "DEFAULT_CONTEXT",
    "ENGINE_KINDS",
    "EngineKind",
    "GenerateRequest",
    "LoadRequest",
    "RunKind",
    "decode",
    "encode",
    "generate_command",
    "load_command",
    "parse_generate",
    "parse_load",
    "stats_from_wire",
    "stats_to_wire",
    "tokens_from_wire",
    "tokens_to_wire",
]
