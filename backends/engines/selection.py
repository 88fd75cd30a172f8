"""Choosing an engine by name: each is imported only when picked, so a missing one fails alone."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Literal

from backends.engines.load_guard import SAFEST, RiskySettings, checkpoint
from backends.errors import SettingsError

if TYPE_CHECKING:
    from pathlib import Path

    from backends.engines.draft_weights import DraftWeights
    from backends.engines.interface import ModelEngine
    from backends.engines.llama import LoadProgress

# The engines a model can be loaded with (backends.service.protocol re-exports both names).
EngineKind = Literal["llama.cpp", "mlx"]
ENGINE_KINDS: tuple[EngineKind, ...] = ("llama.cpp", "mlx")

DEFAULT_SETTINGS = RiskySettings()  # as llama.cpp loads: all layers on the GPU, repacking


def installed_engines() -> list[EngineKind]:
    """The engines whose Python packages are installed here (llama.cpp first)."""
    engines: list[EngineKind] = []
    if importlib.util.find_spec("llama_cpp") is not None:
        engines.append("llama.cpp")
    if importlib.util.find_spec("mlx_lm") is not None:
        engines.append("mlx")
    return engines


def open_engine(
    kind: EngineKind,
    path: Path,
    *,
    n_ctx: int,
    settings: RiskySettings = DEFAULT_SETTINGS,
    is_draft: bool = False,
    progress: LoadProgress | None = None,
    workers: tuple[str, ...] = (),
    layer_split: tuple[float, ...] = (),
    draft_weights: DraftWeights = "auto",
) -> ModelEngine:
    """Load ``path`` with the engine ``kind``; the draft always goes fully onto the GPU.

    llama.cpp loads GGUF files; MLX loads MLX model folders (config.json, safetensors,
    tokenizer.json), which ``backends.models.gguf_to_mlx`` can make from a GGUF file.
    ``settings`` holds the main model's GPU layers (a draft goes fully onto the GPU), the
    threads and weight repacking; ``workers`` (llama.cpp RPC, "host:port") hold part of a
    main model, split by ``layer_split`` or by free memory. ``draft_weights`` says whether a
    llama.cpp draft drafts with a Q4_0 copy (``backends.engines.draft_weights``).
    """
    checkpoint("draft-model" if is_draft else "main-model", path, safe=settings == SAFEST)
    if kind == "llama.cpp":
        from backends.engines.llama import LlamaEngine, LlamaLoadSettings

        load = LlamaLoadSettings(
            n_ctx=n_ctx,
            gpu_layers=settings.gpu_layers,
            n_threads=settings.n_threads,
            weight_repacking=settings.weight_repacking,
            workers=() if is_draft else workers,
            layer_split=() if is_draft else layer_split,
            draft_weights=draft_weights,
        )
        return LlamaEngine(path, load, is_draft=is_draft, progress=progress)
    if kind == "mlx":
        if workers:
            raise SettingsError("workers need the llama.cpp engine (MLX runs on one machine)")
        if importlib.util.find_spec("mlx_lm") is None:
            raise SettingsError(
                "the MLX engine needs mlx-lm (Apple Silicon, or mlx[cpu] on Linux); "
                "choose llama.cpp or install SpecDeck's mlx-cpu extra"
            )
        from backends.engines.mlx import MlxEngine

        # gpu_layers, n_threads and weight repacking do not apply: MLX keeps every layer on
        # its one device.
        return MlxEngine(path, n_ctx=n_ctx, is_draft=is_draft, progress=progress)
    raise SettingsError(f"unknown engine {kind!r}; choose llama.cpp or mlx")
