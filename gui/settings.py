"""Every user setting declared once (type, default, range, title, tooltip), and their JSON store."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from PySide6.QtCore import QObject, Signal

from backends.engines.draft_weights import DRAFT_WEIGHT_MODES
from backends.engines.interface import DEFAULT_CONTEXT_SIZE
from backends.engines.weight_placement import WEIGHT_REPACKING_MODES
from backends.errors import SettingsError
from backends.paths import user_data_dir
from backends.service.context_fit import CONTEXT_POLICIES
from backends.service.protocol import DEFAULT_API_HOST, DEFAULT_API_PORT, ENGINE_KINDS
from backends.speculation.methods import DEFAULT_METHOD, METHODS
from backends.speculation.types import (
    DEFAULT_DRAFT_MAX,
    DEFAULT_DRAFT_MIN,
    DEFAULT_MAX_TOKENS,
    DEFAULT_P_MIN,
)

if TYPE_CHECKING:
    from pathlib import Path

    from backends.speculation.methods import SpeculationMethod

logger = logging.getLogger(__name__)

SettingValue = int | float | bool | str
SettingKind = type[int] | type[float] | type[bool] | type[str]
# "models" and "state" hold what the model pickers and the window remember; the other groups
# are the sidebar's settings form, in this order.
SettingGroup = Literal[
    "models", "speculation", "sampling", "generation", "workers", "view", "state"
]

SETTINGS_FILENAME = "settings.json"
BROKEN_SUFFIX = ".broken"
SETTINGS_VERSION = 1
VERSION_KEY = "version"

RANDOM_SEED = -1
MAX_SEED = 2**31 - 1  # what a QSpinBox can hold
TOP_K_OFF = 0
MIN_CONTEXT = 512
MAX_CONTEXT = 131_072
MAX_GENERATED_TOKENS = 32_768
MAX_DRAFT_TOKENS = 32
MAX_TOP_K = 1000
MAX_MIN_P = 0.95  # min_p must stay below 1 (SamplingSettings)
MAX_TEMPERATURE = 2.0
MIN_TOP_P = 0.01
PROBABILITY_STEP = 0.05

# The draft picker's non-model entries, as last_draft_choice stores them (a model is stored
# by its path).
DRAFT_CHOICE_NGRAM = "ngram-lookup"
DRAFT_CHOICE_OFF = "off"

# What Structured output offers: nothing, any JSON object, the JSON schema setting's schema.
STRUCTURED_OUTPUTS = ("off", "json_object", "json_schema")
SEND_KEYS = ("enter", "ctrl-enter")
THEMES = ("system", "light", "dark")  # gui/theme.py: "system" follows the desktop

# "off" is not offered here: the draft picker's "Off: main model alone" entry decides it, so
# that one control, not two that could disagree, turns speculation off.
_PICKABLE_METHODS: tuple[SpeculationMethod, ...] = tuple(m for m in METHODS if m != "off")


@dataclass(frozen=True)
class SettingSpec:
    """One setting: its type, default, allowed values, and how the settings form shows it.

    ``minimum``/``maximum`` bound numbers; ``choices`` (with ``choice_titles``, the words
    shown for them) restrict a string; ``special_text`` is shown instead of the minimum
    number (e.g. "random" for seed -1); ``multiline`` asks for a text box, not a line.
    """

    key: str
    kind: SettingKind
    default: SettingValue
    title: str
    tooltip: str
    group: SettingGroup
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    choices: tuple[str, ...] = ()
    choice_titles: tuple[str, ...] = ()
    choice_tooltips: tuple[str, ...] = ()
    special_text: str = ""
    multiline: bool = False
    placeholder: str = ""  # shown in an empty text field

    def __post_init__(self) -> None:
        """Catch a declaration whose default breaks its own rules."""
        if self.choice_titles and len(self.choice_titles) != len(self.choices):
            raise ValueError(f"{self.key}: one title per choice")
        if self.choice_tooltips and len(self.choice_tooltips) != len(self.choices):
            raise ValueError(f"{self.key}: one tooltip per choice")
        check_value(self, self.default)

    def title_of(self, choice: str) -> str:
        """The words shown for ``choice`` (the choice itself when it has no title)."""
        if self.choice_titles and choice in self.choices:
            return self.choice_titles[self.choices.index(choice)]
        return choice


def check_value(spec: SettingSpec, value: object) -> SettingValue:
    """``value`` if ``spec`` allows it (an int passes as a float); SettingsError otherwise."""
    if spec.kind is bool:
        if isinstance(value, bool):
            return value
    elif spec.kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return _check_range(spec, value)
    elif spec.kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise SettingsError(f"{spec.title} must be a finite number, got {value}")
            return _check_range(spec, float(value))
    elif isinstance(value, str):
        if spec.choices and value not in spec.choices:
            raise SettingsError(
                f"{spec.title} must be one of {', '.join(spec.choices)}, got {value!r}"
            )
        return value
    raise SettingsError(f"{spec.title} must be a {spec.kind.__name__}, got {value!r}")


def _check_range(spec: SettingSpec, value: int | float) -> int | float:
    if spec.minimum is not None and value < spec.minimum:
        raise SettingsError(f"{spec.title} must be at least {spec.minimum:g}, got {value:g}")
    if spec.maximum is not None and value > spec.maximum:
        raise SettingsError(f"{spec.title} must be at most {spec.maximum:g}, got {value:g}")
    return value


SETTINGS: tuple[SettingSpec, ...] = (
    # -- models ------------------------------------------------------------------------------
    SettingSpec(
        key="engine",
        kind=str,
        default="llama.cpp",
        title="Engine",
        tooltip=(
            "The inference engine that runs the models: llama.cpp (GGUF files, CPU or GPU) "
            "or MLX (Apple Silicon)."
        ),
        group="models",
        choices=ENGINE_KINDS,
        choice_titles=("llama.cpp", "MLX"),
    ),
    SettingSpec(
        key="extra_model_folders",
        kind=str,
        default="",
        title="Extra model folders",
        tooltip=(
            "More folders to search for GGUF models, besides SpecDeck's own, LM Studio's and "
            f"the Hugging Face cache (separated by '{os.pathsep}')."
        ),
        group="models",
    ),
    SettingSpec(
        key="workers",
        kind=str,
        default="",
        title="Workers",
        tooltip=(
            "Other machines that hold part of the main model: host:port of each, comma-"
            "separated (start `specdeck worker --host 0.0.0.0` there; trusted networks only, "
            "llama.cpp's RPC has no password). The draft stays on this computer. llama.cpp "
            "engine; takes effect at the next load."
        ),
        group="workers",
        placeholder="none: this computer only (e.g. 192.168.1.20:50052)",
    ),
    SettingSpec(
        key="layer_split",
        kind=str,
        default="",
        title="Layer split",
        tooltip=(
            "With workers: the main model's layers in shares, one per worker and the last for "
            "this computer (e.g. 1,1,0: half on each worker, none here). Empty: by free memory."
        ),
        group="workers",
        placeholder="by free memory",
    ),
    # -- speculation -------------------------------------------------------------------------
    SettingSpec(
        key="speculation_method",
        kind=str,
        default=DEFAULT_METHOD,
        title="Speculation",
        tooltip=(
            "How drafts are made. Auto picks the draft model, a lookup or plain decoding "
            "every round from measured speed and acceptance; the others force one method, "
            "like llama.cpp's --spec-type."
        ),
        group="speculation",
        choices=_PICKABLE_METHODS,
        choice_titles=(
            "Auto (recommended)",
            "Draft model only",
            "n-gram simple",
            "n-gram mod",
            "Edit copy",
        ),
        choice_tooltips=(
            "Picks the draft model, a lookup or no drafting each round, whichever pays.",
            "Every round drafts with the draft model (classic speculative decoding).",
            "Prompt lookup: copies what followed the last few tokens earlier in the chat.",
            "A table of n-grams seen so far, kept across answers, drafts by chaining lookups.",
            "Copies the text being edited and learns the answer's changes (renames) as it "
            "goes: for rewrites, refactors and added docstrings.",
        ),
    ),
    SettingSpec(
        key="draft_max",
        kind=int,
        default=DEFAULT_DRAFT_MAX,
        title="Max draft tokens",
        tooltip=(
            "The most tokens the draft model proposes per round (llama.cpp's "
            "--spec-draft-n-max). Longer drafts pay off when most of them are accepted."
        ),
        group="speculation",
        minimum=1,
        maximum=MAX_DRAFT_TOKENS,
    ),
    SettingSpec(
        key="draft_min",
        kind=int,
        default=DEFAULT_DRAFT_MIN,
        title="Min draft tokens",
        tooltip=(
            "A draft shorter than this is not verified (llama.cpp's --spec-draft-n-min): "
            "the round decodes one token plainly instead. 0 verifies every draft."
        ),
        group="speculation",
        minimum=0,
        maximum=MAX_DRAFT_TOKENS,
    ),
    SettingSpec(
        key="p_min",
        kind=float,
        default=DEFAULT_P_MIN,
        title="Draft confidence",
        tooltip=(
            "The draft model stops drafting when its top token is less likely than this "
            "(llama.cpp's --spec-draft-p-min). Higher drafts less but wastes less. In auto "
            "mode SpecDeck learns where to stop instead, from how often the target keeps "
            "the draft's tokens at each confidence and what one more token costs."
        ),
        group="speculation",
        minimum=0.0,
        maximum=1.0,
        step=PROBABILITY_STEP,
    ),
    SettingSpec(
        key="draft_weights",
        kind=str,
        default="auto",
        title="Draft weights",
        tooltip=(
            "On a CPU a draft step costs what its weights take to read. Auto drafts with a "
            "Q4_0 copy of the draft (made once, kept in SpecDeck's cache folder) where that "
            "is lighter and the draft runs on the CPU: the 0.5B Qwen draft steps a quarter "
            "faster. The main model is never changed, so answers stay the main model's. "
            "Takes effect at the next load."
        ),
        group="speculation",
        choices=DRAFT_WEIGHT_MODES,
        choice_titles=("Auto", "As stored", "Q4_0 copy"),
    ),
    SettingSpec(
        key="exact_verification",
        kind=bool,
        default=True,
        title="Bit-exact verification",
        tooltip=(
            "Bit-exact verification: at temperature 0 verify in batches the engine computes "
            "exactly like one-token steps, so the answer is identical to the main model alone. "
            "With SpecDeck's llama.cpp build every batch is exact on x86 CPUs for Q4_K/Q6_K "
            "models, so this costs nothing there; off verifies a draft in one batch like "
            "llama.cpp, where other kernels may resolve near-ties differently."
        ),
        group="speculation",
    ),
    # -- sampling ----------------------------------------------------------------------------
    SettingSpec(
        key="temperature",
        kind=float,
        default=0.0,
        title="Temperature",
        tooltip=(
            "How random the answer is (llama.cpp's --temp). 0 always takes the most likely "
            "token (greedy), so answers repeat exactly."
        ),
        group="sampling",
        minimum=0.0,
        maximum=MAX_TEMPERATURE,
        step=PROBABILITY_STEP,
    ),
    SettingSpec(
        key="top_p",
        kind=float,
        default=1.0,
        title="Top P",
        tooltip=(
            "Sample only from the most likely tokens whose probabilities add up to this "
            "(--top-p). 1 keeps the whole vocabulary."
        ),
        group="sampling",
        minimum=MIN_TOP_P,
        maximum=1.0,
        step=PROBABILITY_STEP,
    ),
    SettingSpec(
        key="top_k",
        kind=int,
        default=TOP_K_OFF,
        title="Top K",
        tooltip="Sample only from the K most likely tokens (--top-k). 0 turns the limit off.",
        group="sampling",
        minimum=TOP_K_OFF,
        maximum=MAX_TOP_K,
        special_text="off",
    ),
    SettingSpec(
        key="min_p",
        kind=float,
        default=0.0,
        title="Min P",
        tooltip=(
            "Drop tokens less likely than this fraction of the most likely one (--min-p). "
            "0 keeps the whole vocabulary."
        ),
        group="sampling",
        minimum=0.0,
        maximum=MAX_MIN_P,
        step=PROBABILITY_STEP,
    ),
    SettingSpec(
        key="seed",
        kind=int,
        default=RANDOM_SEED,
        title="Seed",
        tooltip=(
            "The random seed for sampling (--seed): the same seed and settings give the same "
            "answer. -1 draws a new seed for every answer."
        ),
        group="sampling",
        minimum=RANDOM_SEED,
        maximum=MAX_SEED,
        special_text="random",
    ),
    # -- generation --------------------------------------------------------------------------
    SettingSpec(
        key="max_tokens",
        kind=int,
        default=DEFAULT_MAX_TOKENS,
        title="Max answer tokens",
        tooltip="The answer stops after this many tokens (llama.cpp's --n-predict).",
        group="generation",
        minimum=1,
        maximum=MAX_GENERATED_TOKENS,
    ),
    SettingSpec(
        key="context_size",
        kind=int,
        default=DEFAULT_CONTEXT_SIZE,
        title="Context size",
        tooltip=(
            "How many tokens of conversation the models hold (--ctx-size); more needs more "
            "memory. Takes effect at the next load."
        ),
        group="generation",
        minimum=MIN_CONTEXT,
        maximum=MAX_CONTEXT,
        step=MIN_CONTEXT,
    ),
    SettingSpec(
        key="weight_repacking",
        kind=str,
        default="auto",
        title="Weight repacking",
        tooltip=(
            "llama.cpp's repacked CPU weight layouts (faster kernels). Auto: on, which decodes "
            "about a sixth faster here; verification batches stay bit-exact either way with "
            "SpecDeck's llama.cpp build. llama.cpp's AMX kernels are never used (they crash). "
            "Takes effect at the next load."
        ),
        group="generation",
        choices=WEIGHT_REPACKING_MODES,
        choice_titles=("Auto", "On", "Off"),
    ),
    SettingSpec(
        key="context_overflow",
        kind=str,
        default="truncate-middle",
        title="Context overflow",
        tooltip=(
            "Truncate the middle: keep the system prompt and the first exchange, leave out the "
            "oldest turns after it. Rolling window: leave out the oldest turns. Stop at the "
            "limit: leave nothing out (the answer is an error). The answer's footer says how "
            "many messages were left out."
        ),
        group="generation",
        choices=CONTEXT_POLICIES,
        choice_titles=("Truncate the middle", "Rolling window", "Stop at the limit"),
    ),
    SettingSpec(
        key="system_prompt",
        kind=str,
        default="",
        title="System prompt",
        tooltip="Instructions sent before every conversation, as the system message.",
        group="generation",
        multiline=True,
    ),
    SettingSpec(
        key="structured_output",
        kind=str,
        default="off",
        title="Structured output",
        tooltip=(
            "Make every answer follow JSON (the API's response_format): any JSON object, or "
            "the JSON schema below. Tokens the schema allows alone (quotes, braces, keys) are "
            "checked without drafting and shown on blue."
        ),
        group="generation",
        choices=STRUCTURED_OUTPUTS,
        choice_titles=("Off", "Any JSON object", "JSON schema"),
    ),
    SettingSpec(
        key="json_schema",
        kind=str,
        default="",
        title="JSON schema",
        tooltip="The schema every answer follows when Structured output is JSON schema.",
        group="generation",
        multiline=True,
        placeholder='{"type": "object", "properties": {"name": {"type": "string"}}}',
    ),
    # -- view --------------------------------------------------------------------------------
    SettingSpec(
        key="visualize_drafts",
        kind=bool,
        default=True,
        title="Highlight drafted tokens",
        tooltip=(
            "Mark the tokens the draft proposed and the main model accepted with a green "
            "background, like LM Studio's draft visualisation."
        ),
        group="view",
    ),
    SettingSpec(
        key="compare",
        kind=bool,
        default=False,
        title="Compare with main model alone",
        tooltip=(
            "After each answer, generate it again with the main model alone and show both "
            "speeds side by side. Takes about twice as long."
        ),
        group="view",
    ),
    SettingSpec(
        key="send_key",
        kind=str,
        default="enter",
        title="Send with",
        tooltip=(
            "Enter: Enter sends and Shift+Enter starts a new line. Ctrl+Enter: Ctrl+Enter "
            "sends and Enter starts a new line (for long messages and code)."
        ),
        group="view",
        choices=SEND_KEYS,
        choice_titles=("Enter", "Ctrl+Enter"),
    ),
    SettingSpec(
        key="theme",
        kind=str,
        default="system",
        title="Theme",
        tooltip=(
            "Light or dark colours for the window, the chat and its code. System: the "
            "desktop's choice where it tells (light where it does not)."
        ),
        group="view",
        choices=THEMES,
        choice_titles=("System", "Light", "Dark"),
    ),
    # -- state -------------------------------------------------------------------------------
    SettingSpec(
        key="presets",
        kind=str,
        default="",
        title="Presets",
        tooltip="The saved presets of the Speculation and Sampling settings (JSON, by name).",
        group="state",
    ),
    SettingSpec(
        key="last_main_path",
        kind=str,
        default="",
        title="Last main model",
        tooltip="The main model picked last, selected again at start.",
        group="state",
    ),
    SettingSpec(
        key="server_port",
        kind=int,
        default=DEFAULT_API_PORT,
        title="Local server port",
        tooltip="The port the Local server listened on last (http://ADDRESS:PORT/v1).",
        group="state",
        minimum=1024,
        maximum=65535,
    ),
    SettingSpec(
        key="server_host",
        kind=str,
        default=DEFAULT_API_HOST,
        title="Local server address",
        tooltip="The address the Local server listened on last (127.0.0.1: this computer only).",
        group="state",
    ),
    SettingSpec(
        key="server_api_key",
        kind=str,
        default="",
        title="Local server API key",
        tooltip="The API key the Local server asked of its clients last (empty: none).",
        group="state",
    ),
    SettingSpec(
        key="last_draft_choice",
        kind=str,
        default="",
        title="Last draft choice",
        tooltip="The draft model (or n-gram lookup, or Off) picked last, selected again at start.",
        group="state",
    ),
)

SPECS_BY_KEY: dict[str, SettingSpec] = {spec.key: spec for spec in SETTINGS}

# MIGRATIONS[n] turns a file of version n into version n + 1; files older than the oldest
# entry have no migration and are read as they are (unknown keys dropped, bad values reset).
Migration: TypeAlias = Callable[[dict[str, Any]], dict[str, Any]]
MIGRATIONS: dict[int, Migration] = {}


def setting_spec(key: str) -> SettingSpec:
    """The declaration of ``key``; SettingsError for an unknown key."""
    try:
        return SPECS_BY_KEY[key]
    except KeyError:
        raise SettingsError(f"unknown setting {key!r}") from None


def migrate(raw: dict[str, Any], version: int) -> dict[str, Any]:
    """``raw`` (a file of ``version``) brought up to :data:`SETTINGS_VERSION`."""
    for step in range(version, SETTINGS_VERSION):
        migration = MIGRATIONS.get(step)
        if migration is not None:
            logger.info("migrating settings from version %d to %d", step, step + 1)
            raw = migration(raw)
    return raw


def default_settings_path() -> Path:
    """``<user data dir>/settings.json``."""
    return user_data_dir() / SETTINGS_FILENAME


class AppSettings(QObject):
    """The user's settings, in memory and in a JSON file; read and written on the main thread.

    Loading never fails: a file that is not JSON is renamed ``settings.json.broken`` and the
    defaults are used; unknown keys are dropped; a value of the wrong type or out of range
    falls back to its default.

    Signals:
        changed(str): a setting's value changed; the argument is its key.
    """

    changed = Signal(str)

    def __init__(self, path: Path | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._path = path if path is not None else default_settings_path()
        self._values: dict[str, SettingValue] = {spec.key: spec.default for spec in SETTINGS}
        self._load()

    @property
    def path(self) -> Path:
        """The JSON file the settings live in."""
        return self._path

    def get(self, key: str) -> SettingValue:
        """The value of ``key`` (KeyError for an unknown key)."""
        return self._values[key]

    def get_int(self, key: str) -> int:
        """The value of an int setting."""
        value = self._values[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"setting {key!r} is not an int")
        return value

    def get_float(self, key: str) -> float:
        """The value of a float setting."""
        value = self._values[key]
        if not isinstance(value, float):
            raise TypeError(f"setting {key!r} is not a float")
        return value

    def get_bool(self, key: str) -> bool:
        """The value of a bool setting."""
        value = self._values[key]
        if not isinstance(value, bool):
            raise TypeError(f"setting {key!r} is not a bool")
        return value

    def get_str(self, key: str) -> str:
        """The value of a str setting."""
        value = self._values[key]
        if not isinstance(value, str):
            raise TypeError(f"setting {key!r} is not a str")
        return value

    def as_dict(self) -> dict[str, SettingValue]:
        """A copy of every value, by key."""
        return dict(self._values)

    def set(self, key: str, value: SettingValue) -> None:
        """Validate, store and save ``value``, then emit ``changed(key)`` if it changed.

        Raises SettingsError for an unknown key, a value the declaration does not allow, or a
        file that cannot be written (the new value is kept in memory then).
        """
        checked = check_value(setting_spec(key), value)
        if self._values[key] == checked:
            return
        self._values[key] = checked
        try:
            self.save()
        finally:
            self.changed.emit(key)

    def reset(self, key: str) -> None:
        """Put ``key`` back to its default."""
        self.set(key, setting_spec(key).default)

    def save(self) -> None:
        """Write every value to the file atomically (a temporary file, then os.replace)."""
        document: dict[str, Any] = {VERSION_KEY: SETTINGS_VERSION, **self._values}
        text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(
                dir=self._path.parent, prefix=f".{self._path.name}.", suffix=".tmp"
            )
            try:
                with os.fdopen(handle, "w", encoding="utf-8") as stream:
                    stream.write(text)
                    stream.flush()
                    os.fsync(stream.fileno())
                os.replace(temporary, self._path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
                raise
        except OSError as error:
            raise SettingsError(
                f"cannot save settings to '{self._path}': {error.strerror or error}"
            ) from error

    def _load(self) -> None:
        try:
            text = self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return
        except OSError as error:
            logger.warning("cannot read settings %s (%s); using defaults", self._path, error)
            return
        except UnicodeDecodeError:
            self._set_aside_broken_file("not UTF-8 text")
            return
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as error:
            self._set_aside_broken_file(str(error))
            return
        if not isinstance(raw, dict):
            self._set_aside_broken_file("not a JSON object")
            return
        version = raw.pop(VERSION_KEY, SETTINGS_VERSION)
        if not isinstance(version, int) or isinstance(version, bool):
            logger.warning("settings version %r is not a number; reading as current", version)
            version = SETTINGS_VERSION
        elif version > SETTINGS_VERSION:
            logger.warning(
                "settings file version %d is newer than this SpecDeck's %d; keeping what it knows",
                version,
                SETTINGS_VERSION,
            )
        raw = migrate(raw, version)
        for key, value in raw.items():
            spec = SPECS_BY_KEY.get(key)
            if spec is None:
                logger.info("dropping unknown setting %r", key)
                continue
            try:
                self._values[key] = check_value(spec, value)
            except SettingsError as error:
                logger.warning("setting %r reset to its default: %s", key, error)

    def _set_aside_broken_file(self, reason: str) -> None:
        broken = self._path.with_name(self._path.name + BROKEN_SUFFIX)
        logger.warning("settings file %s is unreadable (%s); using defaults", self._path, reason)
        try:
            os.replace(self._path, broken)
        except OSError as error:
            logger.warning("cannot rename %s to %s: %s", self._path, broken.name, error)


__all__ = [
    "DRAFT_CHOICE_NGRAM",
    "DRAFT_CHOICE_OFF",
    "MIGRATIONS",
    "RANDOM_SEED",
    "SETTINGS",
    "SETTINGS_VERSION",
    "SPECS_BY_KEY",
    "AppSettings",
    "SettingSpec",
    "SettingValue",
    "check_value",
    "default_settings_path",
    "migrate",
    "setting_spec",
]
