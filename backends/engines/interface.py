"""The engine-neutral model interface: what an engine must do for the speculative loop."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from backends.errors import EngineError

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

log = logging.getLogger(__name__)

Role = Literal["system", "user", "assistant", "tool"]
# How a model writes a tool call, as its chat template shows it (Hermes' <tool_call> blocks,
# Llama 3's bare JSON, Mistral's [TOOL_CALLS] list; backends.service.api.tool_calls).
ToolFormat = Literal["hermes", "llama3", "mistral"]
# The context (KV cache) size a model is loaded with unless asked otherwise, everywhere.
DEFAULT_CONTEXT_SIZE = 4096


@dataclass(frozen=True)
class ToolCall:
    """A function the assistant called: the call's id, the function and its arguments.

    ``arguments`` is the text of a JSON object, as OpenAI's API carries it.
    """

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolFunction:
    """A function offered to the model: its name, what it does, its parameters' JSON schema."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation.

    An assistant's turn may call tools (``tool_calls``); a ``tool`` turn is one call's
    result, ``tool_call_id`` naming the call.
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True)
class VocabFacts:
    """What the loop needs to know about a model's tokenizer."""

    n_vocab: int
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    end_of_generation_ids: frozenset[int]


# How a load report names this machine's CPU beside workers in ``layer_placement``.
LOCAL_CPU_PLACE = "this computer (CPU)"


@dataclass(frozen=True)
class LoadReport:
    """Where a loaded model went: backend, layers on the GPU, threads, context."""

    model_name: str
    backend: str  # "CUDA", "Vulkan", "Metal", "CPU", "MLX (Metal)", ...
    n_layers: int
    gpu_layers: int  # repeating layers offloaded to the GPU
    kv_cache_on_gpu: bool
    n_ctx: int
    n_threads: int
    load_seconds: float
    notes: tuple[str, ...] = field(default=())
    # Apple Silicon: the GPU works in the memory the CPU shares, so "on GPU" costs no copy.
    unified_memory: bool = False
    # The buffer types the weights went into, as llama.cpp names them ("CPU_REPACK", ...).
    weight_buffers: tuple[str, ...] = field(default=())
    # With workers (llama.cpp's RPC backend): each device and its repeating layers, in
    # order, e.g. (("this computer (CPU)", 4), ("worker 10.0.0.5:50052", 24)).
    layer_placement: tuple[tuple[str, int], ...] = field(default=())
    # The GPU the offloaded layers are on, as ggml names it and in short, e.g.
    # "Vulkan0: llvmpipe" ("" when unknown or nothing is offloaded).
    gpu_device: str = ""

    @property
    def backend_in_use(self) -> str:
        """The backend, and the GPU where layers are on one: "Vulkan (Vulkan0: llvmpipe)"."""
        if self.gpu_device and self.gpu_layers > 0:
            return f"{self.backend} ({self.gpu_device})"
        return self.backend

    @property
    def placement(self) -> str:
        """A one-line description such as "CUDA: all 24 layers on GPU, KV cache on GPU"."""
        if self.layer_placement:
            spread = ", ".join(f"{count} on {where}" for where, count in self.layer_placement)
            return f"{self.n_layers} layers: {spread}"
        if self.gpu_layers <= 0:
            return f"{self.backend}: all {self.n_layers} layers on CPU ({self.n_threads} threads)"
        kv = "KV cache on GPU" if self.kv_cache_on_gpu else "KV cache on CPU"
        shared = " (unified memory)" if self.unified_memory else ""
        gpu = f"GPU ({self.gpu_device})" if self.gpu_device else "GPU"
        if self.gpu_layers >= self.n_layers:
            return f"{self.backend}: all {self.n_layers} layers on {gpu}, {kv}{shared}"
        # A split: llama.cpp keeps each layer's KV cache where the layer is.
        split_kv = "KV cache beside its layers" if self.kv_cache_on_gpu else kv
        on_cpu = self.n_layers - self.gpu_layers
        return (
            f"{self.backend}: {self.gpu_layers} of {self.n_layers} layers on {gpu}, "
            f"{on_cpu} on CPU ({self.n_threads} threads), {split_kv}{shared}"
        )


LogitRows = npt.NDArray[np.float32]


class WorkerState(Protocol):
    """A worker machine holding some of a model's layers, as its engine last saw it.

    What the layers above an engine read of a worker; llama.cpp's RPC workers report it as
    :class:`backends.engines.worker_probe.WorkerStatus`.
    """

    @property
    def address(self) -> object:
        """Where the worker listens; ``str()`` of it is "host:port"."""
        ...

    @property
    def reachable(self) -> bool:
        """Whether the worker answers."""
        ...

    @property
    def problem(self) -> str:
        """Why it does not, in one line (empty when it does)."""
        ...

    @property
    def memory_free(self) -> int:
        """Free bytes over the worker's devices."""
        ...

    @property
    def memory_total(self) -> int:
        """Total bytes over the worker's devices."""
        ...

    def summary(self) -> str:
        """One line: the address and its memory, or the problem."""
        ...


class ModelEngine(Protocol):
    """A loaded model with one KV-cache sequence that the speculative loop drives.

    The engine keeps the list of tokens its cache holds (``cached_tokens``); the loop
    appends with :meth:`evaluate` and rolls back with :meth:`truncate`.
    """

    @property
    def name(self) -> str:
        """A short display name of the model."""
        ...

    @property
    def vocab(self) -> VocabFacts:
        """Tokenizer facts (vocabulary size, BOS/EOS, end-of-generation ids)."""
        ...

    @property
    def n_ctx(self) -> int:
        """How many tokens the context (KV cache) holds."""
        ...

    @property
    def cached_tokens(self) -> Sequence[int]:
        """The tokens currently in the KV cache, in order."""
        ...

    @property
    def load_report(self) -> LoadReport:
        """Where the model's layers went when it was loaded."""
        ...

    @property
    def decode_seconds(self) -> float:
        """Wall time spent inside the engine's forward passes since load (for overhead stats)."""
        ...

    @property
    def exact_batch_limit(self) -> int | None:
        """Largest batch whose logits equal single-token logits bitwise (None: unknown)."""
        ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Text to token ids (``add_special`` adds BOS/EOS as the model wants)."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token's text (may be part of a UTF-8 character)."""
        ...

    @property
    def tool_format(self) -> ToolFormat:
        """How the model writes a tool call, as its chat template shows it."""
        ...

    def chat_prompt(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolFunction] = ()
    ) -> str:
        """The model's own chat template applied to ``messages``, ready for the assistant turn.

        ``tools``: the functions the model may call, rendered as the template renders them.
        """
        ...

    def evaluate(self, tokens: Sequence[int], logit_rows: int) -> LogitRows:
        """Append ``tokens`` to the cache; return logits for the last ``logit_rows`` of them.

        The result has shape ``(logit_rows, n_vocab)`` and is only valid until the next
        call: copy what must be kept.
        """
        ...

    @property
    def exact_siblings(self) -> bool:
        """Whether :meth:`evaluate_with_sibling` works and its rows are plain decoding's."""
        ...

    def evaluate_with_sibling(
        self, tokens: Sequence[int], logit_rows: int, sibling_at: int, sibling: int
    ) -> LogitRows:
        """Like :meth:`evaluate`, with a second branch in the same batch.

        The branch shares the cache and ``tokens[:sibling_at]`` and holds ``sibling`` in place
        of ``tokens[sibling_at]``. Returns ``logit_rows + 1`` rows: those of ``evaluate`` and
        then the sibling's. Afterwards the cache holds ``tokens`` appended, as after
        ``evaluate``, and nothing of the branch. Only where :attr:`exact_siblings` is true.
        """
        ...

    def truncate(self, n_tokens: int) -> None:
        """Roll the KV cache back so that it holds only its first ``n_tokens`` tokens."""
        ...

    def worker_statuses(self) -> tuple[WorkerState, ...]:
        """The workers holding some of the model's layers, now (empty without workers)."""
        ...

    def close(self) -> None:
        """Free the model and its context."""
        ...


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two sequences share."""
    limit = min(len(a), len(b))
    # The usual case in a generation: one extends the other (compared in C, not per token).
    if list(a[:limit]) == list(b[:limit]):
        return limit
    for index in range(limit):
        if a[index] != b[index]:
            return index
    return limit


def extend_cache(
    engine: ModelEngine, context: Sequence[int], logit_rows: int = 1
) -> tuple[LogitRows, int]:
    """Make the engine's cache hold exactly ``context``; return (last logit rows, evaluated).

    Reuses the longest common prefix already in the cache (prompt caching across turns and
    across the rounds of one generation) and evaluates only the rest. At least the last
    ``logit_rows`` tokens are re-evaluated when the whole context is cached already, since
    their logits are needed.
    """
    if not context:
        raise ValueError("extend_cache needs at least one token")
    keep = _reusable_prefix(engine, context, logit_rows)
    if keep < len(engine.cached_tokens):
        engine.truncate(keep)
    return engine.evaluate(context[keep:], logit_rows), len(context) - keep


def extend_cache_with_sibling(
    engine: ModelEngine,
    context: Sequence[int],
    logit_rows: int,
    sibling_at: int,
    sibling: int,
    *,
    batch_limit: int,
) -> tuple[LogitRows, int] | None:
    """:func:`extend_cache`, with ``sibling`` in place of ``context[sibling_at]`` as a branch.

    Returns ``logit_rows + 1`` rows (the sibling's last) and how many tokens of ``context``
    were evaluated; None, with the cache untouched, where the batch would hold more than
    ``batch_limit`` tokens, the sibling included. ``sibling_at`` must fall within the last
    ``logit_rows`` tokens, after the first.
    """
    if not len(context) - logit_rows < sibling_at < len(context):
        raise ValueError(f"sibling_at={sibling_at} outside the last {logit_rows} rows")
    keep = _reusable_prefix(engine, context, logit_rows)
    if len(context) - keep + 1 > batch_limit:
        return None
    if keep < len(engine.cached_tokens):
        engine.truncate(keep)
    rows = engine.evaluate_with_sibling(context[keep:], logit_rows, sibling_at - keep, sibling)
    return rows, len(context) - keep


def _reusable_prefix(engine: ModelEngine, context: Sequence[int], logit_rows: int) -> int:
    """How much of the cache serves ``context`` when its last ``logit_rows`` need logits."""
    return min(common_prefix_length(engine.cached_tokens, context), len(context) - logit_rows)


def sync_cache(engine: ModelEngine, context: Sequence[int], logit_rows: int = 1) -> LogitRows:
    """Make the engine's cache hold exactly ``context`` and return the last logit rows."""
    return extend_cache(engine, context, logit_rows)[0]


def probe_exact_batch_limit(engine: ModelEngine, probe_size: int, all_exact_limit: int) -> int:
    """The largest batch whose logits equal single-token logits bitwise, measured.

    Different batch sizes can take different kernels (repacked or tiled matmuls,
    flash-attention tiles, matrix-vector vs matrix-matrix) whose rounding differs; a changed
    argmax would break the promise that greedy speculative output is plain decoding. Sizes
    2 .. ``probe_size`` are tried; when all are exact, ``all_exact_limit`` is assumed.
    Leaves the cache empty. Costs a few dozen tokens.
    """
    body, singles = _probe_singles(engine, probe_size)
    limit = _exact_batch_limit(engine, body, singles, all_exact_limit)
    engine.truncate(0)
    return limit


def probe_exact_batches_and_siblings(
    engine: ModelEngine, probe_size: int, all_exact_limit: int
) -> tuple[int, bool]:
    """:func:`probe_exact_batch_limit`, and whether sibling branches are exact too.

    A chain of 4 of the probe's tokens with a wrong third token and the right one as its
    sibling (:meth:`ModelEngine.evaluate_with_sibling`): the chain's rows before the branch
    and the sibling's row must equal single-token logits, and so must the logits after the
    branch is dropped (its cells must leave the cache in order). Two passes more.
    """
    body, singles = _probe_singles(engine, max(4, probe_size))
    limit = _exact_batch_limit(engine, body, singles, all_exact_limit)
    engine.truncate(1)
    wrong = (body[2] + 1) % engine.vocab.n_vocab
    try:
        rows = engine.evaluate_with_sibling([body[0], body[1], wrong, body[3]], 4, 2, body[2])
    except EngineError as error:  # the model still decodes chains: load it without siblings
        log.warning("%s: sibling branches off: %s", engine.name, error)
        engine.truncate(0)
        return limit, False
    exact = all(
        np.array_equal(rows[row], singles[single]) for row, single in ((0, 0), (1, 1), (4, 2))
    )
    engine.truncate(3)
    after = engine.evaluate(body[2:4], 2)
    exact = exact and all(np.array_equal(after[i], singles[2 + i]) for i in range(2))
    engine.truncate(0)
    log.info("%s: sibling branches %s", engine.name, "exact" if exact else "not exact: off")
    return limit, exact


def _probe_singles(engine: ModelEngine, probe_size: int) -> tuple[list[int], list[LogitRows]]:
    """A start token, then ``probe_size`` tokens one by one: (those tokens, their logits)."""
    text = "def probe(values):\n    return sorted(set(values))  # exactness probe\n"
    sequence = engine.tokenize(text, add_special=False, parse_special=False)
    sequence = (sequence * (2 + probe_size // max(1, len(sequence))))[: probe_size + 1]
    start, body = sequence[:1], sequence[1:]
    engine.truncate(0)
    engine.evaluate(start, 1)
    return body, [engine.evaluate([token], 1)[0].copy() for token in body]


def _exact_batch_limit(
    engine: ModelEngine, body: list[int], singles: list[LogitRows], all_exact_limit: int
) -> int:
    """The largest batch of ``body`` after the start token that reproduces ``singles``."""
    limit = 1
    for size in range(2, len(body) + 1):
        engine.truncate(1)
        rows = engine.evaluate(body[:size], size)
        if not all(np.array_equal(rows[i], singles[i]) for i in range(size)):
            break
        limit = size
    if limit == len(body):
        limit = all_exact_limit
    log.info("%s: batches up to %d tokens reproduce single-token logits", engine.name, limit)
    return limit
