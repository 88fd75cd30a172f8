"""The one place a pair is opened: checked, sized, imported, loaded crash-safely, calibrated.

Every front end opens its models here and only translates its own input and output: the
window's engine process, ``specdeck serve``, ``specdeck-bench`` (one prompt, ``--suite``
and ``--tune``). A pair is opened in this order:

1. **Files** (:func:`check_files`): both models readable, in the engine's format, the
   draft compatible with the main model. A compatible GGUF draft for an MLX main model is
   imported to MLX first (once; later loads reuse the import).
2. **Memory**: a pair clearly bigger than the free memory is refused in one line (the OS
   can page out other programs, and the estimate is an estimate); with workers only this
   computer's share of the main model's layers counts.
3. **Settings** (:func:`crash_safe_request`): the crash records steer a load that
   crashed before to the safest settings, or refuse one that crashed even with them. The
   process that watches the loading one (the window, specdeck-bench's worker watcher)
   decides on a retry with :func:`backends.engines.load_guard.after_load_crash`.
4. **Loads**, each risky step a :func:`~backends.engines.load_guard.checkpoint`
   (``main-model``, ``main-probe``, ``draft-model``, ``calibration``): a watcher that
   outlives a native crash knows where it died.
5. **Calibration**: with ``auto`` the planner's batch costs are measured at load.

:class:`LoadedPair` is the loaded pair as one object: its decoders (one per method, so what
a planner learned carries over from answer to answer), answers and comparisons
(:mod:`backends.service.pair_runs`), the tuner's trials with their draft models
(:mod:`backends.service.pair_tuning`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from backends.engines.draft_weights import DRAFT_WEIGHT_MODES
from backends.engines.hardware import available_memory, estimate_pair_memory
from backends.engines.interface import DEFAULT_CONTEXT_SIZE
from backends.engines.layer_split import parse_split
from backends.engines.load_guard import SAFEST, CrashRecords, avoided_crash_note, checkpoint
from backends.engines.selection import open_engine
from backends.engines.weight_placement import WEIGHT_REPACKING_MODES
from backends.engines.worker_probe import parse_workers
from backends.errors import SettingsError, SpecDeckError
from backends.models.catalog import read_catalog_model
from backends.models.compat import check_compatibility, compatibility_problem
from backends.service.pair_runs import answer, compare_from_empty
from backends.service.pair_tuning import recall_tuning, tune, tuning_key
from backends.service.protocol import ENGINE_KINDS, LoadRequest
from backends.service.tuning import device_words
from backends.speculation.estimates import DRAFT_CALIBRATION_SIZES, BatchCosts, ceiling_line
from backends.speculation.methods import DEFAULT_METHOD, METHODS, build_decoder
from backends.speculation.planner import CostCache
from backends.speculation.types import DEFAULT_P_MIN

if TYPE_CHECKING:
    import argparse
    import threading
    from collections.abc import Iterator, Sequence
    from types import TracebackType
    from typing import TextIO

    from backends.engines.interface import ChatMessage, ModelEngine
    from backends.engines.selection import EngineKind
    from backends.models.gguf_info import ModelFormat, ModelInfo
    from backends.models.gguf_to_mlx import ImportProgress, ImportProgressBar
    from backends.service.context_fit import ContextPolicy
    from backends.service.pair_runs import Answer, Comparison, RunObserver
    from backends.service.pair_tuning import TuningRun
    from backends.service.tuning import TrialPrompt, TuningProgress
    from backends.service.tuning_memory import Recall, TuningMemory
    from backends.speculation.loop import SpeculativeDecoder
    from backends.speculation.methods import SpeculationMethod
    from backends.speculation.types import GenerationSettings

# Loading beyond what is available is refused only when clearly hopeless: the OS can page
# out other programs, and the estimate is an estimate.
MEMORY_REFUSAL_FACTOR = 1.5
_FORMAT_OF_ENGINE: dict[EngineKind, ModelFormat] = {"llama.cpp": "gguf", "mlx": "mlx"}
_FORMAT_NAMES: dict[ModelFormat, str] = {"gguf": "a GGUF", "mlx": "an MLX"}
IMPORT_SHARE = 0.4  # of the load's progress bar, when a GGUF draft is imported to MLX first
LOADS_SHARE = 0.9  # of the load's progress bar; the calibration comes after
CALIBRATION_FRACTION = 0.92

LoadProgressReport = Callable[[float, str], None]  # (fraction 0..1, what is being done)
ImportReport = Callable[[Path, "ImportProgress"], None]  # (the GGUF being imported, how far)


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags specdeck-bench and specdeck serve share: which pair, how it loads, workers.

    Read back by :func:`pair_paths_from_args` (the model files) and :func:`request_from_args`.
    """
    parser.add_argument(
        "--main",
        type=Path,
        help="main (target) model: a GGUF file, or with --engine mlx also an MLX folder",
    )
    parser.add_argument(
        "--draft", type=Path, help="draft model (same kind as --main; with --main alone: none)"
    )
    parser.add_argument(
        "--engine",
        choices=ENGINE_KINDS,
        default="llama.cpp",
        help="inference engine (default: llama.cpp); mlx runs MLX model folders and imports "
        "a GGUF file (given, or the default pair) into one on first use",
    )
    parser.add_argument(
        "--method",
        default=DEFAULT_METHOD,
        help=f"speculation method: {', '.join(METHODS)} (default: {DEFAULT_METHOD})",
    )
    parser.add_argument(
        "--ctx", type=int, default=DEFAULT_CONTEXT_SIZE, help="context size in tokens"
    )
    parser.add_argument("--threads", type=int, default=None, help="default: physical cores")
    parser.add_argument(
        "--gpu-layers", type=int, default=-1, help="main model layers on the GPU (-1 = all)"
    )
    parser.add_argument(
        "--weight-repacking",
        choices=WEIGHT_REPACKING_MODES,
        default="auto",
        help="llama.cpp's repacked CPU weight layouts (never AMX); auto = on",
    )
    parser.add_argument(
        "--draft-weights",
        choices=DRAFT_WEIGHT_MODES,
        default="auto",
        help="the draft's weights: auto = a Q4_0 copy (made once) where that is lighter and "
        "the draft runs on the CPU; stored = the file as it is; q4_0 = always the copy",
    )
    add_worker_options(parser)


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    """``--rpc`` and ``--split``: the main model on workers (specdeck-bench, specdeck serve)."""
    parser.add_argument(
        "--rpc",
        default="",
        metavar="HOST:PORT,...",
        help="llama.cpp RPC workers (specdeck worker) for the main model; the draft stays here",
    )
    parser.add_argument(
        "--split",
        default="",
        metavar="SHARES",
        help="with --rpc: layer shares, one per worker and the last for this computer "
        "(e.g. 1,1,0); default: by free memory",
    )


def worker_options(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The workers and layer split ``--rpc``/``--split`` asked for (SettingsError if bad)."""
    workers = tuple(str(worker) for worker in parse_workers(args.rpc))
    return workers, parse_split(args.split, len(workers))


def pair_paths_from_args(
    args: argparse.Namespace, imports: ImportReport | None = None, *, with_draft: bool = True
) -> tuple[Path, Path | None]:
    """The main and draft model files the flags of :func:`add_load_arguments` name.

    specdeck-bench and specdeck serve both resolve their pair here, alike:

    - neither ``--main`` nor ``--draft``: the default pair, fetched on first use (a progress
      bar on stderr);
    - ``--main`` alone: that model without a draft (the lookups and plain decoding). The
      default draft suits only the default main model: fetched for another, it would cost a
      download and be refused as incompatible;
    - ``--draft`` alone: the default main model with that draft;
    - ``with_draft`` False (``specdeck serve --no-draft``, ``specdeck-bench --tune``): the
      main model alone, whatever ``--draft`` says.

    With ``--engine mlx`` a GGUF main model, given or the default one, is imported to MLX
    here (once; later runs reuse the import), reported to ``imports``. A GGUF draft is
    imported by :func:`open_pair`, when it is compatible.
    """
    main: Path | None = args.main
    draft: Path | None = args.draft if with_draft else None
    if main is None:
        from backends.models.provision import (
            DEFAULT_DRAFT_KEY,
            DEFAULT_MAIN_KEY,
            TextProgressBar,
            ensure_model,
        )

        progress = TextProgressBar(sys.stderr)
        try:
            main = ensure_model(DEFAULT_MAIN_KEY, progress)
            if with_draft and draft is None:
                draft = ensure_model(DEFAULT_DRAFT_KEY, progress)
        finally:
            progress.finish()
    if args.engine == "mlx":
        main = mlx_import(main, imports)
    return main, draft


def import_progress_bars(stream: TextIO) -> ImportReport:
    """A progress bar on ``stream`` for each GGUF file imported to MLX."""
    bars: dict[Path, ImportProgressBar] = {}

    def show(path: Path, event: ImportProgress) -> None:
        bar = bars.get(path)
        if bar is None:
            from backends.models.gguf_to_mlx import ImportProgressBar

            bar = bars[path] = ImportProgressBar(stream, path.stem)
        bar(event)

    return show


def request_from_args(
    args: argparse.Namespace, main: Path, draft: Path | None, method: SpeculationMethod
) -> LoadRequest:
    """What the flags of :func:`add_load_arguments` ask to load (as requested)."""
    workers, layer_split = worker_options(args)
    return LoadRequest(
        main_path=str(main),
        draft_path=None if draft is None else str(draft),
        engine=args.engine,
        method=method,
        n_ctx=args.ctx,
        gpu_layers=args.gpu_layers,
        n_threads=args.threads,
        weight_repacking=args.weight_repacking,
        workers=workers,
        layer_split=layer_split,
        draft_weights=args.draft_weights,
    )


@dataclass
class LoadedPair:
    """The models in memory and the decoders built on them; closes both when done.

    Usable as a context manager (``with open_pair(request) as pair: ...``).
    """

    request: LoadRequest
    main: ModelEngine
    draft: ModelEngine | None
    costs: CostCache = field(default_factory=CostCache)
    decoders: dict[tuple[SpeculationMethod, float], SpeculativeDecoder] = field(
        default_factory=dict
    )
    # The planner's batch costs as calibrated at load, before generation refined them.
    costs_at_load: dict[str, BatchCosts] = field(default_factory=dict)

    def batch_costs(self) -> dict[str, BatchCosts]:
        """The planner's batch costs now ("main", and "draft" when there is one); {} before."""
        found: dict[str, BatchCosts] = {}
        main = self.costs.calibrated(self.main)
        if main is not None:
            found["main"] = main
        draft = (
            None
            if self.draft is None
            else self.costs.calibrated(self.draft, DRAFT_CALIBRATION_SIZES)
        )
        if draft is not None:
            found["draft"] = draft
        return found

    def main_batch_seconds(self) -> dict[int, float]:
        """The main model's batch costs at load, seconds by batch size ({} uncalibrated)."""
        costs = (self.costs_at_load or self.batch_costs()).get("main")
        return dict(costs.seconds) if costs is not None else {}

    def calibration_notes(self) -> list[str]:
        """How sure auto's calibration is, and what speculation can gain here at best."""
        costs = self.costs_at_load or self.batch_costs()
        main = costs.get("main")
        if main is None:
            return []
        where = f"on {device_words(self.main)}"
        notes = [f"auto's batch costs: {main.sureness()}"]
        draft_name = "" if self.draft is None else self.draft.load_report.model_name
        ceiling = ceiling_line(main, costs.get("draft"), draft_name, where)
        if ceiling is not None:
            notes.append(ceiling)
        return notes

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

    @contextmanager
    def open_trial_draft(self, info: ModelInfo) -> Iterator[ModelEngine]:
        """A draft model for the tuner's trials, loaded as this pair's draft was, closed after.

        The pair's own draft is passed back as it is: not loaded twice, not closed.
        """
        if self.draft is not None and str(info.path) == self.request.draft_path:
            yield self.draft
            return
        draft = open_engine(
            self.request.engine,
            Path(info.path),
            n_ctx=self.request.n_ctx,
            settings=self.request.risky,
            is_draft=True,
            draft_weights=self.request.draft_weights,
        )
        try:
            yield draft
        finally:
            draft.close()

    def answer(
        self,
        messages: Sequence[ChatMessage],
        settings: GenerationSettings,
        *,
        method: SpeculationMethod | None = None,
        compare: bool = False,
        observer: RunObserver | None = None,
        cancel: threading.Event | None = None,
        context_policy: ContextPolicy = "stop",
    ) -> Answer:
        """Answer a conversation with ``method`` (None: the pair's), streamed to ``observer``.

        With ``compare`` the main model alone answers it after, from the same cached prefix;
        ``context_policy`` says what to leave out of a conversation that outgrew the context
        (:func:`backends.service.pair_runs.answer`).
        """
        decoder = self.decoder(method or self.request.method, settings.p_min)
        return answer(
            decoder,
            messages,
            settings,
            compare=compare,
            observer=observer,
            cancel=cancel,
            context_policy=context_policy,
        )

    def compare(
        self,
        messages: Sequence[ChatMessage],
        settings: GenerationSettings,
        *,
        method: SpeculationMethod,
        adaptive: bool = True,
        warmup: bool = True,
    ) -> Comparison:
        """Plain then speculative decoding of one prompt, each from empty caches, timed.

        The benchmark's comparison (:func:`backends.service.pair_runs.compare_from_empty`);
        ``adaptive`` False drafts the maximum length every round.
        """
        return compare_from_empty(
            self.main,
            self.draft,
            messages,
            settings,
            method=method,
            adaptive=adaptive,
            warmup=warmup,
            costs=self.costs,
        )

    def recall_tuning(self, memory: TuningMemory | None = None) -> Recall | None:
        """The fastest setup remembered for this main model and machine, if any."""
        return recall_tuning(tuning_key(self.request, self.main), memory)

    def tune(
        self,
        drafts: Sequence[ModelInfo],
        prompts: Sequence[TrialPrompt],
        *,
        budget_seconds: float,
        remember: bool = True,
        memory: TuningMemory | None = None,
        progress: TuningProgress | None = None,
        cancel: threading.Event | None = None,
    ) -> TuningRun:
        """Every setup's trials on the main model, ``drafts`` lent by :meth:`open_trial_draft`.

        Remembered for this main model and machine unless cancelled or ``remember`` is
        False (:func:`backends.service.pair_tuning.tune`); the pair is left as it was.
        """
        return tune(
            self.main,
            self.open_trial_draft,
            tuning_key(self.request, self.main),
            drafts,
            prompts,
            budget_seconds=budget_seconds,
            costs=self.costs,
            remember=remember,
            memory=memory,
            progress=progress,
            cancel=cancel,
        )

    def close(self) -> None:
        """Free both models."""
        if self.draft is not None:
            self.draft.close()
        self.main.close()

    def __enter__(self) -> LoadedPair:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


@dataclass(frozen=True)
class PairFiles:
    """What a request's model files say, checked: readable, loadable, compatible."""

    main: ModelInfo
    draft: ModelInfo | None
    # A compatible GGUF draft for an MLX main model: imported to MLX when the pair loads.
    import_draft: bool = False


def check_files(request: LoadRequest) -> PairFiles:
    """Read both models' files and check that the engine can load them as a pair.

    Raises a one-line SpecDeckError for a missing or broken file, a wrong model format or
    an incompatible pair. Loads nothing.
    """
    main_info = read_catalog_model(request.main_path)
    draft_info = read_catalog_model(request.draft_path) if request.draft_path else None
    import_draft = (
        request.engine == "mlx"
        and draft_info is not None
        and draft_info.format == "gguf"
        and compatibility_problem(main_info, draft_info) is None
    )
    for info in (main_info, None if import_draft else draft_info):
        if info is not None and info.format != _FORMAT_OF_ENGINE[request.engine]:
            wanted = _FORMAT_OF_ENGINE[request.engine]
            raise SettingsError(
                f"{info.path.name} is {_FORMAT_NAMES[info.format]} model; the "
                f"{request.engine} engine reads {wanted.upper()} models"
            )
    if draft_info is not None:
        check_compatibility(main_info, draft_info)
    return PairFiles(main_info, draft_info, import_draft)


def check_memory(request: LoadRequest, main: ModelInfo, draft: ModelInfo | None) -> None:
    """Refuse, in one line, a pair far bigger than the free memory."""
    needed = estimate_pair_memory(main, draft, request.n_ctx)
    if request.workers:
        # The main model's layers are partly elsewhere: this computer's share of them (by
        # the split; by free memory it is known only once the workers are asked).
        local_share = (
            request.layer_split[-1] / sum(request.layer_split) if request.layer_split else 0.0
        )
        main_part = estimate_pair_memory(main, None, request.n_ctx)
        needed -= int(main_part * (1.0 - local_share))
    free = available_memory()
    if needed > free * MEMORY_REFUSAL_FACTOR:
        raise SpecDeckError(
            f"not enough memory: the models need about {needed / 2**30:.1f} GB here, "
            f"{free / 2**30:.1f} GB is available; choose smaller models or a smaller context"
        )


def crash_safe_request(
    request: LoadRequest, records: CrashRecords | None = None
) -> tuple[LoadRequest, str | None]:
    """The request with the load settings the crash records allow, and why they changed.

    The requested settings, or the safest ones when the requested ones crashed while
    loading one of its models on this CPU and build; the second value is then the one line
    that says so (None otherwise). Raises LoadRefusedError when even the safest crashed.
    """
    settings, crash = (records or CrashRecords()).choose(request.models, request.risky)
    note = avoided_crash_note(crash) if crash is not None else None
    return request.with_risky(settings), note


def open_pair(
    request: LoadRequest,
    progress: LoadProgressReport | None = None,
    *,
    import_progress: ImportReport | None = None,
) -> LoadedPair:
    """Check and load the pair a request names; calibrate auto's planner on it.

    Raises a one-line SpecDeckError for a missing or broken file, a wrong model format, an
    incompatible pair or a pair far bigger than the free memory. The request's load
    settings are used as they are (:func:`crash_safe_request` chooses them). ``progress``
    hears of a draft's import (0..0.4), both loads (..0.9) and the calibration (0.92);
    ``import_progress`` of the import's own stages.
    """
    files = check_files(request)
    main_info, draft_info = files.main, files.draft
    draft_path = request.draft_path
    loads_start = 0.0  # where the loads begin on the progress scale (after an import)
    if files.import_draft and draft_info is not None:
        draft_path = str(_import_draft(draft_info, progress, import_progress))
        draft_info = read_catalog_model(draft_path)
        check_compatibility(main_info, draft_info)
        loads_start = IMPORT_SHARE
    check_memory(request, main_info, draft_info)
    main_share = main_info.file_size / (
        main_info.file_size + (draft_info.file_size if draft_info else 0)
    )

    def part(start: float, share: float, what: str) -> Callable[[float], None] | None:
        if progress is None:
            return None
        report = progress
        span = LOADS_SHARE - loads_start
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
                progress(CALIBRATION_FRACTION, "measuring batch costs")
            checkpoint("calibration", request.main_path, safe=request.risky == SAFEST)
            pair.decoder(request.method, DEFAULT_P_MIN).prepare()
            pair.costs_at_load = {
                name: costs.snapshot() for name, costs in pair.batch_costs().items()
            }
    except BaseException:
        if draft is not None:
            draft.close()
        main.close()
        raise
    return pair


def mlx_import(path: Path, progress: ImportReport | None = None) -> Path:
    """A GGUF file's MLX import, made now if it is not there yet; anything else as it is."""
    if not (path.is_file() and path.suffix.lower() == ".gguf"):
        return path  # an MLX folder, or a path the checks will name as missing or broken
    return _ensure_import(path, progress)


def _import_draft(
    info: ModelInfo, progress: LoadProgressReport | None, stages: ImportReport | None
) -> Path:
    """The MLX import of a GGUF draft, reported on the load's progress scale."""

    def report(path: Path, event: ImportProgress) -> None:
        if progress is not None:
            progress(IMPORT_SHARE * event.fraction, f"importing {info.name} to MLX")
        if stages is not None:
            stages(path, event)

    return _ensure_import(Path(info.path), report)


def _ensure_import(path: Path, progress: ImportReport | None) -> Path:
    from backends.models.gguf_to_mlx import ensure_mlx_import

    def report(event: ImportProgress) -> None:
        if progress is not None:
            progress(path, event)

    return ensure_mlx_import(path, report)
