"""The window's settings as the backends take them: a LoadRequest, GenerationSettings, an engine.

The settings themselves (declarations and their store) are :mod:`gui.settings`; this module
only translates them, raising SettingsError for a combination the backends refuse.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from backends.engines.draft_weights import check_draft_weights
from backends.engines.layer_split import parse_split
from backends.engines.weight_placement import WEIGHT_REPACKING_MODES
from backends.engines.worker_probe import parse_workers
from backends.errors import SettingsError
from backends.service.generation_options import GenerationOptions
from backends.service.generation_options import generation_settings as settings_from_options
from backends.service.protocol import ENGINE_KINDS, LoadRequest
from backends.speculation.grammar import ANY_JSON_OBJECT, compile_grammar
from backends.speculation.methods import parse_method
from gui.settings import RANDOM_SEED

if TYPE_CHECKING:
    from backends.engines.weight_placement import WeightRepacking
    from backends.service.protocol import EngineKind
    from backends.speculation.methods import SpeculationMethod
    from backends.speculation.types import GenerationSettings
    from gui.settings import AppSettings


def generation_options(settings: AppSettings) -> GenerationOptions:
    """What the window's settings say about a generation (seed -1 becomes None: fresh)."""
    seed = settings.get_int("seed")
    return GenerationOptions(
        max_tokens=settings.get_int("max_tokens"),
        temperature=settings.get_float("temperature"),
        top_p=settings.get_float("top_p"),
        top_k=settings.get_int("top_k"),
        min_p=settings.get_float("min_p"),
        seed=None if seed == RANDOM_SEED else seed,
        draft_max=settings.get_int("draft_max"),
        draft_min=min(settings.get_int("draft_min"), settings.get_int("draft_max")),
        p_min=settings.get_float("p_min"),
        exact_batches=settings.get_bool("exact_verification"),
        grammar=structured_output_grammar(settings),
    )


def structured_output_grammar(settings: AppSettings) -> str | None:
    """The grammar Structured output asks for (None: free text), as the API's response_format.

    A schema that is not JSON, or not a schema, is a one-line SettingsError.
    """
    choice = settings.get_str("structured_output")
    if choice == "json_object":
        return compile_grammar("json_schema", ANY_JSON_OBJECT)
    if choice != "json_schema":
        return None
    text = settings.get_str("json_schema").strip()
    if not text:
        raise SettingsError("Structured output asks for a JSON schema: the JSON schema is empty")
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as error:
        raise SettingsError(
            f"the JSON schema is not JSON: {error.msg} (line {error.lineno}, column {error.colno})"
        ) from None
    return compile_grammar("json_schema", schema)


def generation_settings(settings: AppSettings) -> GenerationSettings:
    """The GenerationSettings the settings describe (the backends' one policy for the rest)."""
    return settings_from_options(generation_options(settings))


def engine_kind(settings: AppSettings) -> EngineKind:
    """The engine setting as the protocol's type."""
    engine = settings.get_str("engine")
    for kind in ENGINE_KINDS:
        if engine == kind:
            return kind
    raise SettingsError(f"unknown engine {engine!r}")


def speculation_method(settings: AppSettings) -> SpeculationMethod:
    """The speculation_method setting as the backends' type."""
    return parse_method(settings.get_str("speculation_method"))


def load_request_for(
    settings: AppSettings,
    main_path: Path | str,
    draft_path: Path | str | None,
    method: SpeculationMethod,
    *,
    engine: EngineKind | None = None,
) -> LoadRequest:
    """A LoadRequest for the pair, with the engine and context size from the settings.

    Raises SettingsError when the combination is impossible (draft-model without a draft,
    a malformed worker or layer split).
    """
    workers = parse_workers(settings.get_str("workers"))
    if workers and (engine or engine_kind(settings)) != "llama.cpp":
        raise SettingsError("Workers need the llama.cpp engine: clear Workers to use MLX")
    return LoadRequest(
        main_path=str(main_path),
        draft_path=None if draft_path is None else str(draft_path),
        engine=engine if engine is not None else engine_kind(settings),
        method=method,
        n_ctx=settings.get_int("context_size"),
        weight_repacking=weight_repacking(settings),
        workers=tuple(str(worker) for worker in workers),
        layer_split=parse_split(settings.get_str("layer_split"), len(workers)),
        draft_weights=check_draft_weights(settings.get_str("draft_weights")),
    )


def weight_repacking(settings: AppSettings) -> WeightRepacking:
    """The weight_repacking setting as the engine takes it."""
    value = settings.get_str("weight_repacking")
    return next((mode for mode in WEIGHT_REPACKING_MODES if mode == value), "auto")


def extra_model_folders(settings: AppSettings) -> list[Path]:
    """The extra_model_folders setting as paths (empty entries skipped, ``~`` expanded)."""
    text = settings.get_str("extra_model_folders")
    return [Path(part).expanduser() for part in text.split(os.pathsep) if part.strip()]
