"""The MLX engine: an mlx-lm model folder behind the ModelEngine interface."""

from __future__ import annotations

import json
import logging
import time
from importlib import metadata
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.engines.base import EngineBase
from backends.engines.chat_template import ChatTemplate
from backends.engines.exactness_memory import (
    ExactnessMemory,
    fingerprint_key,
    folder_content_identity,
    kernel_environment,
)
from backends.engines.hardware import physical_cores
from backends.engines.interface import (
    DEFAULT_CONTEXT_SIZE,
    LogitRows,
    VocabFacts,
    probe_exact_batch_limit,
)
from backends.engines.pass_delay import PassDelay
from backends.errors import EngineError, ModelFileError, SettingsError
from backends.models.mlx_info import MLX_TOKENIZER_FILE, read_mlx_model_info

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path


log = logging.getLogger(__name__)

# Prompts are evaluated in chunks this long, which bounds the memory of a long prompt; only
# the rows asked for go through the output layer.
PREFILL_CHUNK = 512
_PROBE_MAX_BATCH = 17  # batch sizes probed for exactness: 2 .. this (a 16-token lookup + 1)
_FLOAT32_NOTE = "CPU: float32 activations (MLX's quantized matmuls are ~30x slower in float16)"
# Special tokens that end a turn, as llama.cpp's vocabulary loader marks them (EOG).
END_OF_GENERATION_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    }
)


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-to-printable-character map, inverted (byte-level BPE token texts)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    codes = list(printable)
    shifted = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + shifted)
            shifted += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


class MlxEngine(EngineBase):
    """An MLX model folder loaded with mlx-lm, with one KV cache."""

    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx: int = DEFAULT_CONTEXT_SIZE,
        is_draft: bool = False,
        progress: Callable[[float], None] | None = None,
        probe_exact_batch: bool = True,
    ) -> None:
        if n_ctx < 0:
            raise SettingsError(f"context size must be >= 0, got {n_ctx}")
        super().__init__(path)
        self.info = read_mlx_model_info(self.path)  # clear errors for missing/broken folders
        self._pass_delay = PassDelay.from_environment("draft" if is_draft else "main")
        started = time.perf_counter()
        import mlx.core as mx
        from mlx.utils import tree_map
        from mlx_lm.models.cache import make_prompt_cache
        from mlx_lm.utils import load_model

        self._mx = mx
        self._make_cache = make_prompt_cache
        if progress is not None:
            progress(0.0)
        try:
            model, config = load_model(self.path)
        except (ValueError, KeyError, FileNotFoundError, RuntimeError, OSError) as error:
            detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ModelFileError(f"cannot load MLX model {self.path.name}: {detail}") from None
        self._model: Any = model
        self._config: dict[str, Any] = config
        on_metal = bool(mx.metal.is_available())
        notes: list[str] = []
        if mx.default_device() == mx.cpu:
            # Quantized matmuls on the CPU run ~30x faster with float32 activations.
            model.update(
                tree_map(
                    lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p,
                    model.parameters(),
                )
            )
            mx.eval(model.parameters())
            notes.append(_FLOAT32_NOTE)
        if progress is not None:
            progress(0.8)
        self._cache: list[Any] = make_prompt_cache(model)

        n_layers = len(getattr(model, "layers", ())) or self.info.n_layers or 0
        train_ctx = self.info.context_length or 0
        self._n_ctx = n_ctx or train_ctx or DEFAULT_CONTEXT_SIZE
        if train_ctx > 0:
            self._n_ctx = min(self._n_ctx, train_ctx)
        backend = "MLX (Metal)" if on_metal else f"MLX ({_device_name(mx)})"
        on_gpu = mx.default_device() != mx.cpu
        self._load_tokenizer()
        self._n_vocab = int(self._output_width())
        self._vocab_facts = self._read_vocab_facts()
        self._template = ChatTemplate(self.info.chat_template, self.info.name)
        if probe_exact_batch and not is_draft:
            remembered = self._probe_exactness(device=_device_name(mx))
            if remembered is not None:
                notes.append(remembered)
        if progress is not None:
            progress(1.0)
        self._finish_load(
            started,
            backend=backend,
            n_layers=n_layers,
            gpu_layers=n_layers if on_gpu else 0,
            kv_cache_on_gpu=on_gpu,
            n_threads=physical_cores(),
            notes=tuple(notes),
            unified_memory=on_metal,
        )

    def _probe_exactness(self, *, device: str) -> str | None:
        """The exact-batch limit, probed or read back from the exactness memory.

        The answer is remembered under the model folder's content (not its place: an import
        of the same GGUF file elsewhere is the same model), MLX's and mlx-lm's versions and
        the device (not the context size: MLX's cache grows as it fills, so
        a row is computed alike whatever the context may hold); the load report's line is
        returned when it was read back.
        """
        fingerprint = {
            "engine": "mlx",
            "library": [metadata.version("mlx"), metadata.version("mlx-lm")],
            "device": device,
            "model": folder_content_identity(self.path),
            "environment": kernel_environment(),
            "probe": [_PROBE_MAX_BATCH, PREFILL_CHUNK],
        }
        memory, key = ExactnessMemory(), fingerprint_key(fingerprint)
        remembered = memory.recall(key)
        if remembered is not None:
            self._exact_batch_limit = remembered.limit
            return remembered.note
        self._exact_batch_limit = probe_exact_batch_limit(self, _PROBE_MAX_BATCH, PREFILL_CHUNK)
        memory.remember(key, self._exact_batch_limit)
        return None

    # -- facts -----------------------------------------------------------------------------

    def _output_width(self) -> int:
        probe = self._model(self._mx.array([[0]]), cache=self._make_cache(self._model))
        return int(probe.shape[-1])

    # -- text ------------------------------------------------------------------------------

    def _load_tokenizer(self) -> None:
        from tokenizers import Tokenizer

        tokenizer_path = self.path / MLX_TOKENIZER_FILE
        try:
            self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
            spec = json.loads(tokenizer_path.read_text(encoding="utf-8"))
        except Exception as error:  # noqa: BLE001 - the tokenizers library raises plain Exception
            raise ModelFileError(
                f"cannot load the tokenizer of {self.path.name}: {str(error).splitlines()[0]}"
            ) from None
        self._special_ids = frozenset(
            int(t["id"]) for t in spec.get("added_tokens") or [] if t.get("special")
        )
        decoder = json.dumps(spec.get("decoder") or {})
        self._byte_level = "ByteLevel" in decoder
        self._byte_fallback = bool((spec.get("model") or {}).get("byte_fallback"))
        self._metaspace = "▁" in decoder or "Metaspace" in decoder
        self._byte_map = _byte_level_decoder() if self._byte_level else {}

    def _read_vocab_facts(self) -> VocabFacts:
        vocab = self.info.vocab
        end_ids = {
            token
            for token in self._special_ids
            if self._tokenizer.id_to_token(token) in END_OF_GENERATION_TEXTS
        }
        if vocab.eos_id is not None:
            end_ids.add(vocab.eos_id)
        configured = self._config.get("eos_token_id")
        if isinstance(configured, int):
            end_ids.add(configured)
        elif isinstance(configured, list):
            end_ids.update(int(i) for i in configured)
        return VocabFacts(
            n_vocab=self._n_vocab,
            bos_id=vocab.bos_id,
            eos_id=vocab.eos_id,
            add_bos=vocab.add_bos,
            end_of_generation_ids=frozenset(end_ids),
        )

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Tokenize with the folder's tokenizer.json; BOS/EOS as its tokenizer_config says."""
        tokenizer = self._tokenizer
        tokenizer.encode_special_tokens = not parse_special
        try:
            ids = list(tokenizer.encode(text, add_special_tokens=False).ids)
        finally:
            tokenizer.encode_special_tokens = False
        facts = self._vocab_facts
        if add_special and facts.add_bos and facts.bos_id is not None:
            ids.insert(0, facts.bos_id)
        if add_special and self.info.vocab.add_eos and facts.eos_id is not None:
            ids.append(facts.eos_id)
        return ids

    def _token_piece(self, token: int) -> bytes:
        # Special tokens render as nothing, as in llama.cpp.
        text = self._tokenizer.id_to_token(token)
        if text is None or token in self._special_ids:
            piece = b""
        elif self._byte_level:
            piece = bytes(self._byte_map.get(char, 0x3F) for char in text)
        elif self._byte_fallback and len(text) == 6 and text.startswith("<0x") and text[-1] == ">":
            piece = bytes([int(text[3:5], 16)])
        elif self._metaspace:
            piece = text.replace("▁", " ").encode("utf-8")
        else:
            piece = self._tokenizer.decode([token], skip_special_tokens=False).encode("utf-8")
        return piece

    def _token_text(self, token: int | None) -> str:
        if token is None:
            return ""
        return self._tokenizer.id_to_token(token) or ""

    # -- evaluation ------------------------------------------------------------------------

    def evaluate(self, tokens: Sequence[int], logit_rows: int) -> LogitRows:
        """Run ``tokens`` after the cache; float32 logits of the last ``logit_rows`` tokens."""
        count = len(tokens)
        self._batch_position(count, logit_rows, PREFILL_CHUNK, "chunk")
        mx = self._mx
        began = time.perf_counter()
        try:
            # Tokens before the rows asked for only fill the cache, in chunks. Their logits are
            # never built: MLX is lazy, and the output layer over a long prompt would cost as
            # much as a third of the prompt's pass (the vocabulary is wide).
            head = count - logit_rows
            for start in range(0, head, PREFILL_CHUNK):
                chunk = list(tokens[start : min(head, start + PREFILL_CHUNK)])
                self._model(mx.array([chunk]), cache=self._cache)
                mx.eval([entry.state for entry in self._cache])
                self._tokens.extend(chunk)
            tail = list(tokens[head:])
            logits = self._model(mx.array([tail]), cache=self._cache)
            rows = logits[0].astype(mx.float32)
            mx.eval(rows)
            result = np.array(rows, copy=True)
            if self._pass_delay is not None:
                self._pass_delay.sleep(count)  # fault injection: a slower machine
        except (RuntimeError, ValueError) as error:
            self._reset_cache()
            raise EngineError(f"{self.name}: evaluation failed: {error}") from error
        finally:
            self._decode_seconds += time.perf_counter() - began
        self._tokens.extend(tail)
        return result

    def _roll_back(self, n_tokens: int) -> None:
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        if n_tokens == 0 or not can_trim_prompt_cache(self._cache):
            # Recurrent or rotating caches cannot drop a partial sequence: start over.
            self._reset_cache()
            return
        trim_prompt_cache(self._cache, len(self._tokens) - n_tokens)
        del self._tokens[n_tokens:]

    def _reset_cache(self) -> None:
        self._cache = self._make_cache(self._model)
        del self._tokens[:]

    def _free(self) -> None:
        self._cache = []
        self._model = None
        del self._tokens[:]


def _device_name(mx: Any) -> str:
    device = mx.default_device()
    return "CPU" if device == mx.cpu else "CUDA"
