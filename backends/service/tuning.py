"""Find my fastest setup: every draft and drafting method tried on this machine, ranked, explained.

"Speculative decoding is slower than without" is the most common complaint in LM Studio's,
llama.cpp's and mlx-engine's trackers, and nothing answers it on the user's own machine.
:class:`SetupTuner` does: on the loaded main model it runs plain decoding, each n-gram
method, auto, and every compatible draft model (alone and under auto) on a few prompts, at
temperature 0 so that every setup writes the same text, within a time budget, and ranks
the setups by measured speed.

Beside each measurement stands what theory predicts from the parts that were measured
(:func:`backends.service.tuning_prediction.predict_speedup`, Leviathan et al. 2023,
section 3): the acceptance at each draft
position, what a draft step costs relative to a main model step, and what verifying k+1
tokens costs (the planner's calibrated batch costs). The prediction explains the result:
"the draft costs 55 % of a main step here: even at 100 % acceptance it cannot pay".

Engine-neutral and Qt-free: the engine process runs it for the window (events), and
``specdeck-bench --tune`` runs it in a terminal.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from backends.engines.interface import ChatMessage
from backends.errors import SettingsError
from backends.service.suite_prompts import SUITE_PROMPTS
from backends.service.tuning_prediction import (
    Prediction,
    predict_setup,
)
from backends.speculation.methods import build_decoder
from backends.speculation.planner import DRAFT_CALIBRATION_SIZES, CostCache
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import GenerationSettings, SpeculationStats

if TYPE_CHECKING:
    from backends.engines.interface import ModelEngine
    from backends.models.gguf_info import ModelInfo
    from backends.speculation.loop import SpeculativeDecoder
    from backends.speculation.methods import SpeculationMethod
    from backends.speculation.types import GenerationResult

DEFAULT_BUDGET_SECONDS = 120.0
MIN_BUDGET_SECONDS = 20.0
DEFAULT_TRIAL_TOKENS = 96
MIN_TRIAL_TOKENS = 32
MAX_TRIAL_PROMPTS = 3
# The suite prompts tried when the user has no chats yet: new code, an edit, prose.
SUITE_TRIAL_KEYS = ("quicksort", "type-hints", "prose")
# Cut-off for a draft prompt taken from the user's chats (their own kind of text).
MAX_CHAT_PROMPT_CHARS = 4000
WINNER_MARGIN = 0.02  # a setup must beat plain by this much to be called faster
NGRAM_METHODS: tuple[SpeculationMethod, ...] = ("ngram-mod", "edit-copy", "ngram-simple")
# Trials are budgeted at plain decoding's pace times this (lookups are faster, drafts slower).
SLOWEST_TRIAL_FACTOR = 1.05


# -- what is tried ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialSetup:
    """One way to decode: a method and, for draft-model and auto, the draft model."""

    method: SpeculationMethod
    draft: ModelInfo | None = None

    @property
    def label(self) -> str:
        """How the table names it: "plain", "ngram-mod", "draft 0.5B", "auto + 0.5B"."""
        if self.method == "off":
            return "plain"
        if self.draft is None:
            return "auto (n-gram only)" if self.method == "auto" else self.method
        draft = f"{self.draft.size_label} {self.draft.quantization}"
        return f"auto + {draft}" if self.method == "auto" else f"draft {draft}"

    @property
    def draft_path(self) -> str | None:
        """The draft model's path, if the setup has one."""
        return str(self.draft.path) if self.draft is not None else None


def candidate_setups(drafts: Sequence[ModelInfo]) -> list[TrialSetup]:
    """Plain first (the others are compared with it), then the n-gram methods, auto, drafts."""
    setups = [TrialSetup("off"), *(TrialSetup(method) for method in NGRAM_METHODS)]
    setups.append(TrialSetup("auto"))
    for draft in drafts:
        setups.extend((TrialSetup("draft-model", draft), TrialSetup("auto", draft)))
    return setups


@dataclass(frozen=True)
class TrialPrompt:
    """One prompt every setup answers."""

    key: str  # "quicksort", or "chat 1" for one of the user's own
    messages: tuple[ChatMessage, ...]


def trial_prompts(chat_messages: Sequence[str] = ()) -> list[TrialPrompt]:
    """The user's last messages when there are some (their own kind of text), else the suite's."""
    own = [text.strip()[:MAX_CHAT_PROMPT_CHARS] for text in chat_messages if text.strip()]
    if own:
        return [
            TrialPrompt(f"chat {number}", (ChatMessage("user", text),))
            for number, text in enumerate(own[:MAX_TRIAL_PROMPTS], start=1)
        ]
    by_key = {prompt.key: prompt for prompt in SUITE_PROMPTS}
    return [TrialPrompt(key, (ChatMessage("user", by_key[key].text),)) for key in SUITE_TRIAL_KEYS]


def device_words(main: ModelEngine) -> str:
    """Where the main model runs, as the explanations name it.

    "this CPU", or "this GPU" with its name where known ("this GPU (Vulkan0: llvmpipe)").
    """
    report = main.load_report
    if report.gpu_layers <= 0:
        return "this CPU"
    return f"this GPU ({report.gpu_device})" if report.gpu_device else "this GPU"


# -- measured ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialRun:
    """One setup on one prompt."""

    prompt: str
    stats: SpeculationStats
    identical: bool  # the text equals plain decoding's (temperature 0)


@dataclass
class TrialResult:
    """One setup's runs, and how they compare with plain decoding's on the same prompts."""

    setup: TrialSetup
    runs: list[TrialRun] = field(default_factory=list)
    speedups: list[float] = field(default_factory=list)  # per prompt, over plain
    prediction: Prediction | None = None
    skipped: str = ""  # why it was not measured (out of time, failed to load)

    @property
    def measured(self) -> bool:
        """Whether every prompt ran."""
        return bool(self.runs) and not self.skipped

    @property
    def speedup(self) -> float | None:
        """The geometric mean over prompts of tok/s over plain's (None before it ran)."""
        if not self.speedups:
            return None
        return math.exp(sum(math.log(max(s, 1e-9)) for s in self.speedups) / len(self.speedups))

    @property
    def tokens_per_second(self) -> float:
        """Mean tok/s over the prompts."""
        speeds = [run.stats.tokens_per_second for run in self.runs]
        return sum(speeds) / len(speeds) if speeds else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over drafted tokens, over all prompts."""
        drafted = sum(run.stats.total_draft_tokens_count for run in self.runs)
        accepted = sum(run.stats.accepted_draft_tokens_count for run in self.runs)
        return accepted / drafted if drafted else None

    @property
    def identical(self) -> bool:
        """Whether every prompt's text equals plain decoding's."""
        return all(run.identical for run in self.runs)

    def row(self) -> TuningRow:
        """The result as the table, the engine process's events and the memory hold it."""
        prediction = self.prediction
        return TuningRow(
            label=self.setup.label,
            method=self.setup.method,
            draft_path=self.setup.draft_path,
            measured=self.measured,
            skipped=self.skipped,
            tokens_per_second=round(self.tokens_per_second, 3),
            speedup=None if self.speedup is None else round(self.speedup, 4),
            speedups=tuple(round(value, 4) for value in self.speedups),
            acceptance_rate=self.acceptance_rate,
            identical=self.identical,
            prompts=tuple(run.prompt for run in self.runs),
            predicted=None if prediction is None else round(prediction.speedup, 4),
            explanation="" if prediction is None else prediction.explanation,
        )


@dataclass(frozen=True)
class TuningRow:
    """A result row as the window and the memory see it (no engines, no stats objects)."""

    label: str
    method: SpeculationMethod
    draft_path: str | None
    measured: bool
    skipped: str
    tokens_per_second: float
    speedup: float | None
    speedups: tuple[float, ...]
    acceptance_rate: float | None
    identical: bool
    prompts: tuple[str, ...]
    predicted: float | None
    explanation: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuningRow:
        """Read a row written as JSON (``dataclasses.asdict`` of a row)."""
        return cls(
            label=str(data["label"]),
            method=data["method"],
            draft_path=data.get("draft_path"),
            measured=bool(data["measured"]),
            skipped=str(data.get("skipped", "")),
            tokens_per_second=float(data["tokens_per_second"]),
            speedup=None if data.get("speedup") is None else float(data["speedup"]),
            speedups=tuple(float(value) for value in data.get("speedups", ())),
            acceptance_rate=(
                None if data.get("acceptance_rate") is None else float(data["acceptance_rate"])
            ),
            identical=bool(data.get("identical", True)),
            prompts=tuple(str(p) for p in data.get("prompts", ())),
            predicted=None if data.get("predicted") is None else float(data["predicted"]),
            explanation=str(data.get("explanation", "")),
        )

    @property
    def spread(self) -> tuple[float, float] | None:
        """The slowest and fastest prompt's speedup."""
        return (min(self.speedups), max(self.speedups)) if self.speedups else None


def ranked(rows: Sequence[TuningRow]) -> list[TuningRow]:
    """Measured rows fastest first, then the ones not measured, in their order."""
    measured = sorted(
        (row for row in rows if row.measured and row.speedup is not None),
        key=lambda row: -(row.speedup or 0.0),
    )
    return measured + [row for row in rows if row not in measured]


def winner(rows: Sequence[TuningRow]) -> TuningRow | None:
    """The fastest measured setup; plain unless another beats it by the margin."""
    order = ranked(rows)
    plain = next((row for row in order if row.method == "off" and row.measured), None)
    best = order[0] if order and order[0].measured else None
    if best is None:
        return None
    if plain is not None and (best.speedup or 0.0) < 1.0 + WINNER_MARGIN:
        return plain
    return best


# -- the trials --------------------------------------------------------------------------------

TuningProgress = Callable[[float, str], None]  # (fraction done, what runs now)
DraftOpener = Callable[["ModelInfo"], AbstractContextManager["ModelEngine"]]


class TuningCancelled(Exception):  # noqa: N818 - a signal, not an error
    """Raised inside the tuner when its cancel event is set; the result so far is kept."""


@dataclass
class TuningOutcome:
    """What a tuning run measured, and whether it ran to the end."""

    results: list[TrialResult]
    prompts: list[str]
    trial_tokens: int
    seconds: float
    cancelled: bool = False

    @property
    def rows(self) -> list[TuningRow]:
        """The results as rows, ranked."""
        return ranked([result.row() for result in self.results])


class SetupTuner:
    """Runs every setup on the same prompts on the loaded main model, within a budget.

    ``open_draft`` loads a draft model for the trials of one setup and closes it after (the
    engine process passes the already loaded draft back without loading it twice). The
    main model's cache is emptied before every run; nothing else of it changes.
    """

    def __init__(
        self,
        main: ModelEngine,
        open_draft: DraftOpener,
        *,
        costs: CostCache | None = None,
        progress: TuningProgress | None = None,
        cancel: threading.Event | None = None,
        device: str = "this machine",
    ) -> None:
        self.main = main
        self._open_draft = open_draft
        self._costs = costs or CostCache()
        self._progress = progress
        self._cancel = cancel or threading.Event()
        self._device = device

    def run(
        self,
        setups: Sequence[TrialSetup],
        prompts: Sequence[TrialPrompt],
        *,
        budget_seconds: float = DEFAULT_BUDGET_SECONDS,
        max_tokens: int = DEFAULT_TRIAL_TOKENS,
    ) -> TuningOutcome:
        """Measure each setup on every prompt; stop where the budget or a cancel says."""
        if budget_seconds < MIN_BUDGET_SECONDS:
            raise SettingsError(
                f"the time budget must be at least {MIN_BUDGET_SECONDS:.0f} seconds, "
                f"got {budget_seconds:g}"
            )
        if not setups or setups[0].method != "off":
            raise SettingsError("the setups to try must start with plain decoding")
        if not prompts:
            raise SettingsError("no prompts to try the setups on")
        started = time.perf_counter()
        deadline = started + budget_seconds
        plain_decoder = build_decoder("off", self.main)
        encoded = [(p.key, plain_decoder.prompt_tokens(p.messages)) for p in prompts]
        too_long = [
            key for key, tokens in encoded if len(tokens) + MIN_TRIAL_TOKENS >= self.main.n_ctx
        ]
        encoded = [(key, tokens) for key, tokens in encoded if key not in too_long]
        if not encoded:
            raise SettingsError(
                f"every prompt is longer than the context ({self.main.n_ctx} tokens) allows"
            )
        results = [TrialResult(setup) for setup in setups]
        plain = results[0]
        self._report(0.0, "calibrating the main model's batch costs")
        verify_costs = self._costs.costs(self.main)
        single = verify_costs.cost(1)

        def verify_cost(size: int) -> float:
            # A bigger batch never costs less than one token (the timings are noisy).
            return max(1.0, verify_costs.cost(size) / single) if single > 0 else float(size)

        # A short plain run (a warm-up too) sizes the trials: tokens and prompts cut to fit.
        tokens = max_tokens
        cancelled = False
        try:
            self._report(0.01, f"plain decoding on {encoded[0][0]} (sizing the trials)")
            sizing = self._generate(plain_decoder, None, encoded[0][1], MIN_TRIAL_TOKENS).stats
            step = sizing.generation_seconds / max(1, sizing.generated_tokens - 1)
            # Reading a prompt goes in big batches: per token, what the biggest batch costs.
            biggest = max(verify_costs.seconds, default=1)
            per_prompt_token = verify_costs.cost(biggest) / biggest

            def run_seconds(prompts: list[tuple[str, list[int]]], count: int) -> float:
                reading = sum(len(prompt) for _, prompt in prompts) * per_prompt_token
                return (reading + len(prompts) * count * step) * SLOWEST_TRIAL_FACTOR

            tokens, encoded = self._fit(
                len(setups), encoded, run_seconds, tokens, deadline - time.perf_counter()
            )
            plain_tokens: dict[str, list[int]] = {}
            for key, prompt in encoded:
                self._check_cancel()
                self._report(0.02, f"plain decoding on {key}")
                run = self._generate(plain_decoder, None, prompt, tokens)
                plain.runs.append(TrialRun(key, run.stats, True))
                plain_tokens[key] = run.token_ids
            plain.speedups = [1.0] * len(plain.runs)
            total = len(setups) * len(encoded)
            done = len(encoded)
            for result in results[1:]:
                self._check_cancel()
                if time.perf_counter() + run_seconds(encoded, tokens) > deadline:
                    result.skipped = "not tried: the time budget ran out"
                    continue
                self._trial(result, encoded, tokens, plain, plain_tokens, verify_cost, done, total)
                done += len(encoded)
        except TuningCancelled:
            cancelled = True
            for result in results:
                if not result.measured and not result.skipped:
                    result.skipped = "not tried: cancelled"
                    result.runs.clear()
                    result.speedups.clear()
        finally:
            self.main.truncate(0)
        self._report(1.0, "cancelled" if cancelled else "done")
        return TuningOutcome(
            results,
            [key for key, _ in encoded],
            tokens,
            time.perf_counter() - started,
            cancelled,
        )

    def _fit(
        self,
        setup_count: int,
        encoded: list[tuple[str, list[int]]],
        run_seconds: Callable[[list[tuple[str, list[int]]], int], float],
        tokens: int,
        seconds_left: float,
    ) -> tuple[int, list[tuple[str, list[int]]]]:
        """Fewer tokens per run, then fewer prompts, until every setup fits the budget."""
        while (
            tokens > MIN_TRIAL_TOKENS and setup_count * run_seconds(encoded, tokens) > seconds_left
        ):
            tokens = max(MIN_TRIAL_TOKENS, int(tokens * 0.9))
        while len(encoded) > 1 and setup_count * run_seconds(encoded, tokens) > seconds_left:
            encoded = encoded[:-1]
        return tokens, encoded

    def _trial(
        self,
        result: TrialResult,
        encoded: list[tuple[str, list[int]]],
        tokens: int,
        plain: TrialResult,
        plain_tokens: dict[str, list[int]],
        verify_cost: Callable[[int], float],
        done: int,
        total: int,
    ) -> None:
        setup = result.setup
        opener: AbstractContextManager[ModelEngine | None]
        if setup.draft is not None:
            self._report(done / total, f"loading {setup.draft.name}")
            opener = self._open_draft(setup.draft)
        else:
            opener = nullcontext(None)
        try:
            with opener as draft:
                decoder = build_decoder(
                    setup.method,
                    self.main,
                    draft,
                    adaptive=setup.method == "auto",
                    cost_cache=self._costs,
                )
                for index, (key, prompt) in enumerate(encoded):
                    self._check_cancel()
                    self._report((done + index) / total, f"{setup.label} on {key}")
                    run = self._generate(decoder, draft, prompt, tokens)
                    base = plain.runs[index].stats
                    result.runs.append(TrialRun(key, run.stats, run.token_ids == plain_tokens[key]))
                    result.speedups.append(run.stats.speedup_over(base) or 0.0)
                used = [d for d in decoder.drafters if d.engine is not None and d.stats.drafted]
                draft_step = used[0].stats.seconds / used[0].stats.drafted if used else None
                forward = None
                if draft is not None:  # the bare forward pass, as the planner measures it
                    draft_single = self._costs.costs(draft, DRAFT_CALIBRATION_SIZES).cost(1)
                    main_single = self._costs.costs(self.main).cost(1)
                    forward = draft_single / main_single if main_single > 0 else None
        except TuningCancelled:
            raise
        except Exception as error:  # noqa: BLE001 - one setup failing leaves the others
            result.runs.clear()
            result.speedups.clear()
            result.skipped = f"failed: {error}"
            return
        result.prediction = predict_setup(
            [run.stats for run in result.runs],
            [run.stats for run in plain.runs],
            verify_cost,
            draft_name=setup.draft.size_label if setup.draft is not None else "",
            draft_step_seconds=draft_step,
            draft_forward_cost=forward,
            draft_used=bool(used),
            device=self._device,
        )

    def _generate(
        self,
        decoder: SpeculativeDecoder,
        draft: ModelEngine | None,
        prompt: list[int],
        tokens: int,
    ) -> GenerationResult:
        self.main.truncate(0)
        if draft is not None:
            draft.truncate(0)
        settings = GenerationSettings(max_tokens=tokens, sampling=SamplingSettings(temperature=0.0))
        result = decoder.run(prompt, settings, self._cancel)
        if result.stats.stop_reason == "cancelled":
            raise TuningCancelled
        return result

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise TuningCancelled

    def _report(self, fraction: float, message: str) -> None:
        if self._progress is not None:
            self._progress(min(1.0, fraction), message)
