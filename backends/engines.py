"""Choosing an engine by name: each is imported only when picked, so a missing one fails alone."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from backends.errors import SettingsError
from backends.load_guard import SAFEST, RiskySettings, checkpoint

if TYPE_CHECKING:
    from pathlib import Path

    from backends.engine import ModelEngine
    from backends.engine_protocol import EngineKind
    from backends.llama_engine import LoadProgress
    from backends.weight_placement import WeightRepacking


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
    gpu_layers: int = -1,
    n_threads: int | None = None,
    weight_repacking: WeightRepacking = "auto",
    is_draft: bool = False,
    progress: LoadProgress | None = None,
) -> ModelEngine:
    """Load ``path`` with the engine ``kind``; the draft always goes fully onto the GPU.

    llama.cpp loads GGUF files; MLX loads MLX model folders (config.json, safetensors,
    tokenizer.json), which ``backends.gguf_to_mlx`` can make from a GGUF file.
    """
    risky = RiskySettings(weight_repacking, gpu_layers, n_threads)
    checkpoint("draft-model" if is_draft else "main-model", path, safe=risky == SAFEST)
    if kind == "llama.cpp":
        from backends.llama_engine import LlamaEngine, LlamaLoadSettings

        settings = LlamaLoadSettings(
            n_ctx=n_ctx,
            gpu_layers=gpu_layers,
            n_threads=n_threads,
            weight_repacking=weight_repacking,
        )
        return LlamaEngine(path, settings, is_draft=is_draft, progress=progress)
    if kind == "mlx":
        if importlib.util.find_spec("mlx_lm") is None:
            raise SettingsError(
                "the MLX engine needs mlx-lm (Apple Silicon, or mlx[cpu] on Linux); "
                "choose llama.cpp or install SpecDeck's mlx-cpu extra"
            )
        from backends.mlx_engine import MlxEngine

        # gpu_layers, n_threads and weight repacking do not apply: MLX keeps every layer on
        # its one device.
        return MlxEngine(path, n_ctx=n_ctx, is_draft=is_draft, progress=progress)
    raise SettingsError(f"unknown engine {kind!r}; choose llama.cpp or mlx")
