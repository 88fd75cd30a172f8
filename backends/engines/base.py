"""What every engine shares: the facts the loop reads, text helpers, batch checks, lifetime.

:class:`EngineBase` implements the parts of :class:`~backends.engines.interface.ModelEngine`
that do not depend on the engine library. An engine sets, while it loads, ``info``,
``_vocab_facts``, ``_n_ctx`` and ``_template``, calls :meth:`_finish_load` at the end, and
implements ``tokenize``, ``evaluate``, :meth:`_token_piece`, :meth:`_token_text`,
:meth:`_roll_back` and :meth:`_free`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Self

from backends.engines.interface import LoadReport
from backends.errors import ContextOverflowError, EngineError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.engines.chat_template import ChatTemplate
    from backends.engines.interface import (
        ChatMessage,
        LogitRows,
        ToolFormat,
        ToolFunction,
        VocabFacts,
    )
    from backends.engines.worker_probe import WorkerStatus
    from backends.models.gguf_info import ModelInfo

log = logging.getLogger(__name__)


class EngineBase:
    """A loaded model with one KV-cache sequence: the engine-independent half."""

    info: ModelInfo
    _vocab_facts: VocabFacts
    _n_ctx: int
    _template: ChatTemplate
    _load_report: LoadReport

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._tokens: list[int] = []  # what the KV cache holds
        self._decode_seconds = 0.0
        self._exact_batch_limit: int | None = None
        self._exact_siblings = False
        self._piece_cache: dict[int, bytes] = {}
        self._closed = False

    # -- facts -----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The model's display name."""
        return self.info.name

    @property
    def vocab(self) -> VocabFacts:
        """Tokenizer facts."""
        return self._vocab_facts

    @property
    def n_ctx(self) -> int:
        """Context size in tokens."""
        return self._n_ctx

    @property
    def cached_tokens(self) -> Sequence[int]:
        """The tokens in the KV cache."""
        return self._tokens

    @property
    def load_report(self) -> LoadReport:
        """Where the model went."""
        return self._load_report

    @property
    def decode_seconds(self) -> float:
        """Time spent in forward passes since load."""
        return self._decode_seconds

    @property
    def exact_batch_limit(self) -> int | None:
        """Largest batch whose logits equal single-token logits bitwise (None: not probed)."""
        return self._exact_batch_limit

    @property
    def exact_siblings(self) -> bool:
        """Whether sibling branches are available and probed exact (never by default)."""
        return self._exact_siblings

    def _finish_load(
        self,
        started: float,
        *,
        backend: str,
        n_layers: int,
        gpu_layers: int,
        kv_cache_on_gpu: bool,
        n_threads: int,
        notes: tuple[str, ...] = (),
        unified_memory: bool = False,
        weight_buffers: tuple[str, ...] = (),
        layer_placement: tuple[tuple[str, int], ...] = (),
        gpu_device: str = "",
    ) -> None:
        """Record the load report; the load time is everything since ``started``."""
        self._load_report = LoadReport(
            model_name=self.info.name,
            backend=backend,
            n_layers=n_layers,
            gpu_layers=gpu_layers,
            kv_cache_on_gpu=kv_cache_on_gpu,
            n_ctx=self._n_ctx,
            n_threads=n_threads,
            load_seconds=time.perf_counter() - started,  # the probe included: the whole wait
            notes=notes,
            unified_memory=unified_memory,
            weight_buffers=weight_buffers,
            layer_placement=layer_placement,
            gpu_device=gpu_device,
        )
        log.info("loaded %s: %s", self.info.name, self._load_report.placement)

    # -- text ------------------------------------------------------------------------------

    def token_bytes(self, token: int) -> bytes:
        """One token's text as bytes (special tokens render as nothing)."""
        cached = self._piece_cache.get(token)
        if cached is None:
            cached = self._piece_cache[token] = self._token_piece(token)
        return cached

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Token ids back to text."""
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    @property
    def tool_format(self) -> ToolFormat:
        """How the model writes a tool call (from its chat template)."""
        return self._template.tool_format

    def chat_prompt(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolFunction] = ()
    ) -> str:
        """Render the model's own chat template for the next assistant turn."""
        return self._template.render(
            messages,
            self._token_text(self.vocab.bos_id),
            self._token_text(self.vocab.eos_id),
            tools,
        )

    def _token_piece(self, token: int) -> bytes:
        """One token's bytes, as the engine's tokenizer renders it (cached by the caller)."""
        raise NotImplementedError

    def _token_text(self, token: int | None) -> str:
        """A special token's text as the chat template writes it ("" for None)."""
        raise NotImplementedError

    # -- evaluation ------------------------------------------------------------------------

    def _batch_position(self, count: int, logit_rows: int, row_limit: int, what: str) -> int:
        """Check an ``evaluate`` call; the cache position its first token goes to.

        ``row_limit`` bounds the logit rows one call can return (``what`` names it).
        """
        if not 1 <= logit_rows <= min(count, row_limit):
            raise ValueError(f"logit_rows={logit_rows} for {count} tokens ({what} {row_limit})")
        position = len(self._tokens)
        if position + count > self._n_ctx:
            raise ContextOverflowError(
                f"{position + count} tokens do not fit the context of {self._n_ctx} tokens"
            )
        return position

    def evaluate_with_sibling(
        self, tokens: Sequence[int], logit_rows: int, sibling_at: int, sibling: int
    ) -> LogitRows:
        """Not available unless an engine says so (:attr:`exact_siblings`)."""
        raise EngineError(f"{self.name}: this engine does not verify sibling branches")

    def truncate(self, n_tokens: int) -> None:
        """Drop cached tokens from position ``n_tokens`` on."""
        if n_tokens >= len(self._tokens):
            return
        self._roll_back(max(0, n_tokens))

    def _roll_back(self, n_tokens: int) -> None:
        """Make the cache hold its first ``n_tokens`` tokens (fewer than it holds)."""
        raise NotImplementedError

    # -- lifetime --------------------------------------------------------------------------

    def worker_statuses(self) -> tuple[WorkerStatus, ...]:
        """No workers: the model is on this machine."""
        return ()

    def close(self) -> None:
        """Free the model and its context (safe to call twice)."""
        if self._closed:
            return
        self._closed = True
        self._free()

    def _free(self) -> None:
        """Free what the engine library holds."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
