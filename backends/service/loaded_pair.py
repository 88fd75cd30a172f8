"""A loaded main model and draft, and how SpecDeck loads them: checked, sized, calibrated.

Shared by the engine process (the window's models) and ``specdeck serve``: the pair's
formats must match the engine, the draft must be compatible with the main model, the pair
must fit the free memory (refused only when clearly hopeless; a compatible GGUF draft for
an MLX main model is imported to MLX first), and with ``auto`` the
planner's batch costs are measured at load. :class:`LoadedPair` keeps one decoder per
method, so what a planner learned carries over from answer to answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from backends.engines.hardware import available_memory, estimate_pair_memory
from backends.engines.load_guard import SAFEST, checkpoint
from backends.engines.selection import open_engine
from backends.errors import SettingsError, SpecDeckError
from backends.models.catalog import read_catalog_model
from backends.models.compat import check_compatibility, compatibility_problem
from backends.speculation.methods import build_decoder
from backends.speculation.planner import CostCache
from backends.speculation.types import DEFAULT_P_MIN

if TYPE_CHECKING:
    from backends.engines.interface import ModelEngine
    from backends.models.gguf_info import ModelFormat, ModelInfo
    from backends.models.gguf_to_mlx import ImportProgress
    from backends.service.protocol import EngineKind, LoadRequest
    from backends.speculation.loop import SpeculativeDecoder
    from backends.speculation.methods import SpeculationMethod

# Loading beyond what is available is refused only when clearly hopeless: the OS can page
# out other programs, and the estimate is an estimate.
MEMORY_REFUSAL_FACTOR = 1.5
_FORMAT_OF_ENGINE: dict[EngineKind, ModelFormat] = {"llama.cpp": "gguf", "mlx": "mlx"}
_FORMAT_NAMES: dict[ModelFormat, str] = {"gguf": "a GGUF", "mlx": "an MLX"}
IMPORT_SHARE = 0.4  # of the load's progress bar, when a GGUF draft is imported to MLX first


@dataclass
class LoadedPair:
    """The models in memory and the decoders built on them."""

    request: LoadRequest
    main: ModelEngine
    draft: ModelEngine | None
    costs: CostCache = field(default_factory=CostCache)
    decoders: dict[tuple[SpeculationMethod, float], SpeculativeDecoder] = field(
        default_factory=dict
    )

    def decoder(self, method: SpeculationMethod, p_min: float) -> SpeculativeDecoder:
        """The decoder for a method, kept so that what its planner learned carries over.

        ``auto`` adapts what and how much to draft every round; a forced method drafts the
        full length every round, as LM Studio and llama.cpp do.
        """
        key = (method, p_min)
        decoder = self.decoders.get(key)
        if decoder is None:
            decoder = build_decoder(
                method,
                self.main,
                self.draft,
                adaptive=method == "auto",
                p_min=p_min,
                cost_cache=self.costs,
            )
            self.decoders[key] = decoder
        return decoder

    def close(self) -> None:
        if self.draft is not None:
            self.draft.close()
        self.main.close()


LoadProgressReport = Callable[[float, str], None]  # (fraction 0..1, what is being done)


def open_pair(request: LoadRequest, progress: LoadProgressReport | None = None) -> LoadedPair:
    """Check and load the pair a request names; calibrate auto's planner on it.

    Raises a one-line SpecDeckError for a wrong model format, an incompatible pair or a
    pair far bigger than the free memory. ``progress`` hears of both loads (0..0.9) and of
    the calibration (0.92).
    """
    main_info = read_catalog_model(request.main_path)
    draft_info = read_catalog_model(request.draft_path) if request.draft_path else None
    draft_path = request.draft_path
    loads_start = 0.0  # where the loads begin on the progress scale (after an import)
    # A compatible GGUF draft for an MLX main model: imported (once; later loads reuse it).
    if (
        request.engine == "mlx"
        and draft_info is not None
        and draft_info.format == "gguf"
        and compatibility_problem(main_info, draft_info) is None
    ):
        draft_path = str(_import_for_mlx(draft_info, progress))
        draft_info = read_catalog_model(draft_path)
        loads_start = IMPORT_SHARE
    for info in (main_info, draft_info):
        if info is not None and info.format != _FORMAT_OF_ENGINE[request.engine]:
            wanted = _FORMAT_OF_ENGINE[request.engine]
            raise SettingsError(
                f"{info.path.name} is {_FORMAT_NAMES[info.format]} model; the "
                f"{request.engine} engine reads {wanted.upper()} models"
            )
    if draft_info is not None:
        check_compatibility(main_info, draft_info)
    needed = estimate_pair_memory(main_info, draft_info, request.n_ctx)
    if request.workers:
        # The main model's layers are partly elsewhere: this computer's share of them (by
        # the split; by free memory it is known only once the workers are asked).
        local_share = (
            request.layer_split[-1] / sum(request.layer_split) if request.layer_split else 0.0
        )
        main_part = estimate_pair_memory(main_info, None, request.n_ctx)
        needed -= int(main_part * (1.0 - local_share))
    free = available_memory()
    if needed > free * MEMORY_REFUSAL_FACTOR:
        raise SpecDeckError(
            f"not enough memory: the models need about {needed / 2**30:.1f} GB here, "
            f"{free / 2**30:.1f} GB is available; choose smaller models or a smaller context"
        )
    main_share = main_info.file_size / (
        main_info.file_size + (draft_info.file_size if draft_info else 0)
    )

    def part(start: float, share: float, what: str) -> Callable[[float], None] | None:
        if progress is None:
            return None
        report = progress
        span = 0.9 - loads_start
        return lambda fraction: report(loads_start + span * (start + share * fraction), what)

    main = open_engine(
        request.engine,
        Path(request.main_path),
        n_ctx=request.n_ctx,
        settings=request.risky,
        progress=part(0.0, main_share, f"loading {main_info.name}"),
        workers=request.workers,
        layer_split=request.layer_split,
    )
    draft: ModelEngine | None = None
    try:
        if draft_info is not None and draft_path is not None:
            draft = open_engine(
                request.engine,
                Path(draft_path),
                n_ctx=request.n_ctx,
                settings=request.risky,
                is_draft=True,
                progress=part(main_share, 1.0 - main_share, f"loading {draft_info.name}"),
                draft_weights=request.draft_weights,
            )
        pair = LoadedPair(request, main, draft)
        if request.method == "auto":
            if progress is not None:
                progress(0.92, "measuring batch costs")
            checkpoint("calibration", request.main_path, safe=request.risky == SAFEST)
            pair.decoder(request.method, DEFAULT_P_MIN).prepare()
    except BaseException:
        if draft is not None:
            draft.close()
        main.close()
        raise
    return pair


def _import_for_mlx(info: ModelInfo, progress: LoadProgressReport | None) -> Path:
    """The MLX import of a GGUF draft, made now if it is not there yet."""
    from backends.models.gguf_to_mlx import ensure_mlx_import

    def report(event: ImportProgress) -> None:
        if progress is not None:
            progress(IMPORT_SHARE * event.fraction, f"importing {info.name} to MLX")

    return ensure_mlx_import(Path(info.path), report)
