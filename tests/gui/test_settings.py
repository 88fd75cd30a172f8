"""Tests of the declared settings: defaults, persistence, recovery from bad files, mapping."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import pytest

import gui.settings as settings_module
from backends.errors import SettingsError
from backends.paths import user_data_dir
from backends.speculation.grammar import ANY_JSON_OBJECT, compile_grammar
from backends.speculation.types import (
    DEFAULT_DRAFT_MAX,
    DEFAULT_DRAFT_MIN,
    DEFAULT_MAX_TOKENS,
    DEFAULT_P_MIN,
)
from gui.settings import SETTINGS, SETTINGS_VERSION, SPECS_BY_KEY, AppSettings
from gui.settings_to_backends import extra_model_folders, generation_settings, load_request_for

if TYPE_CHECKING:
    from pathlib import Path

    from pytestqt.qtbot import QtBot

REQUIRED_DEFAULTS: dict[str, object] = {
    "speculation_method": "auto",
    "draft_max": DEFAULT_DRAFT_MAX,
    "p_min": DEFAULT_P_MIN,
    "draft_weights": "auto",
    "exact_verification": True,
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": 0,
    "seed": -1,
    "max_tokens": DEFAULT_MAX_TOKENS,
    "context_size": 4096,
    "system_prompt": "",
    "visualize_drafts": True,
    "compare": False,
    "last_main_path": "",
    "last_draft_choice": "",
    "engine": "llama.cpp",
    "extra_model_folders": "",
}


@pytest.fixture
def settings_path(tmp_path: Path) -> Path:
    return tmp_path / "config" / "settings.json"


def write_json(path: Path, document: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document), encoding="utf-8")


def test_declarations_cover_the_required_settings() -> None:
    for key, default in REQUIRED_DEFAULTS.items():
        spec = SPECS_BY_KEY[key]
        assert spec.default == default, key
        assert type(spec.default) is spec.kind, key
    for spec in SETTINGS:
        assert spec.title, spec.key
        assert spec.tooltip.strip(), spec.key
    assert SPECS_BY_KEY["draft_max"].minimum == 1
    assert SPECS_BY_KEY["draft_max"].maximum == 32
    assert SPECS_BY_KEY["engine"].choices == ("llama.cpp", "mlx")
    assert "--spec-draft-n-max" in SPECS_BY_KEY["draft_max"].tooltip
    assert SPECS_BY_KEY["exact_verification"].tooltip.startswith("Bit-exact verification: ")


def test_defaults_without_a_file(settings_path: Path) -> None:
    settings = AppSettings(settings_path)
    for key, default in REQUIRED_DEFAULTS.items():
        assert settings.get(key) == default
    assert not settings_path.exists()  # reading never writes


def test_default_path_is_in_the_user_data_dir() -> None:
    assert AppSettings().path == user_data_dir() / "settings.json"


def test_values_persist_across_instances(settings_path: Path, qtbot: QtBot) -> None:
    first = AppSettings(settings_path)
    with qtbot.waitSignal(first.changed) as blocker:
        first.set("temperature", 0.7)
    assert blocker.args == ["temperature"]
    first.set("seed", 1234)
    first.set("system_prompt", "Answer in French.")
    first.set("compare", True)
    first.set("speculation_method", "ngram-mod")

    second = AppSettings(settings_path)
    assert second.get_float("temperature") == pytest.approx(0.7)
    assert second.get_int("seed") == 1234
    assert second.get_str("system_prompt") == "Answer in French."
    assert second.get_bool("compare") is True
    assert second.get_str("speculation_method") == "ngram-mod"
    assert second.get_int("draft_max") == DEFAULT_DRAFT_MAX
    document = json.loads(settings_path.read_text(encoding="utf-8"))
    assert document["version"] == SETTINGS_VERSION


def test_setting_the_same_value_again_is_silent(settings_path: Path) -> None:
    settings = AppSettings(settings_path)
    changes: list[str] = []
    settings.changed.connect(changes.append)
    settings.set("draft_max", 5)
    settings.set("draft_max", 5)
    assert changes == ["draft_max"]


def test_saving_is_atomic_and_leaves_no_temporary_files(settings_path: Path) -> None:
    settings = AppSettings(settings_path)
    for value in range(1, 6):
        settings.set("draft_max", value)
    assert sorted(os.listdir(settings_path.parent)) == ["settings.json"]


def test_an_unwritable_file_is_a_settings_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the settings folder should be", encoding="utf-8")
    settings = AppSettings(blocker / "settings.json")
    with pytest.raises(SettingsError, match="cannot save settings"):
        settings.set("top_k", 40)
    assert settings.get_int("top_k") == 40  # kept in memory, though not saved


@pytest.mark.parametrize(
    "content",
    ["{not json", "[1, 2, 3]", '"just a string"', b"\xff\xfe\x00garbage"],
    ids=["syntax", "list", "string", "binary"],
)
def test_a_broken_file_gives_defaults_and_is_set_aside(
    settings_path: Path, content: str | bytes
) -> None:
    settings_path.parent.mkdir(parents=True)
    raw = content if isinstance(content, bytes) else content.encode("utf-8")
    settings_path.write_bytes(raw)

    settings = AppSettings(settings_path)

    assert settings.as_dict() == {spec.key: spec.default for spec in SETTINGS}
    broken = settings_path.with_name("settings.json.broken")
    assert broken.read_bytes() == raw
    assert not settings_path.exists()
    settings.set("top_k", 20)
    assert AppSettings(settings_path).get_int("top_k") == 20


def test_bad_values_fall_back_to_defaults_and_unknown_keys_are_dropped(
    settings_path: Path,
) -> None:
    write_json(
        settings_path,
        {
            "version": 1,
            "draft_max": 99,  # above 32
            "p_min": -0.5,  # below 0
            "temperature": "hot",  # wrong type
            "top_k": True,  # a bool is not an int
            "exact_verification": 1,  # an int is not a bool
            "speculation_method": "telepathy",  # not a choice
            "top_p": float("nan"),
            "seed": 7,  # fine
            "max_tokens": 100,  # fine
            "window_geometry": "abc",  # unknown
        },
    )
    settings = AppSettings(settings_path)
    assert settings.get("draft_max") == DEFAULT_DRAFT_MAX
    assert settings.get("p_min") == DEFAULT_P_MIN
    assert settings.get("temperature") == 0.0
    assert settings.get("top_k") == 0
    assert settings.get("exact_verification") is True
    assert settings.get("speculation_method") == "auto"
    assert settings.get("top_p") == 1.0
    assert settings.get("seed") == 7
    assert settings.get("max_tokens") == 100
    assert "window_geometry" not in settings.as_dict()

    settings.set("compare", True)
    document = json.loads(settings_path.read_text(encoding="utf-8"))
    assert "window_geometry" not in document
    assert document["draft_max"] == DEFAULT_DRAFT_MAX


def test_an_int_in_the_file_is_read_as_a_float(settings_path: Path) -> None:
    write_json(settings_path, {"version": 1, "temperature": 1, "top_p": 1})
    settings = AppSettings(settings_path)
    assert settings.get_float("temperature") == 1.0
    assert isinstance(settings.get("temperature"), float)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("draft_max", 0),
        ("draft_max", 33),
        ("draft_max", "3"),
        ("draft_max", 2.5),
        ("draft_max", True),
        ("p_min", 1.5),
        ("temperature", -0.1),
        ("temperature", float("inf")),
        ("top_p", 0.0),
        ("top_k", -1),
        ("seed", -2),
        ("max_tokens", 0),
        ("context_size", 256),
        ("exact_verification", 1),
        ("system_prompt", 5),
        ("speculation_method", "off"),
        ("speculation_method", "fastest"),
        ("engine", "vllm"),
        ("no_such_setting", 1),
    ],
)
def test_set_rejects_bad_values(settings_path: Path, key: str, value: Any) -> None:
    settings = AppSettings(settings_path)
    before = settings.as_dict()
    with pytest.raises(SettingsError):
        settings.set(key, value)
    assert settings.as_dict() == before
    assert not settings_path.exists()


def test_set_accepts_an_int_for_a_float(settings_path: Path) -> None:
    settings = AppSettings(settings_path)
    settings.set("temperature", 1)
    assert settings.get("temperature") == 1.0
    assert isinstance(settings.get("temperature"), float)


def test_reset_restores_the_default(settings_path: Path) -> None:
    settings = AppSettings(settings_path)
    settings.set("max_tokens", 2048)
    settings.reset("max_tokens")
    assert settings.get("max_tokens") == DEFAULT_MAX_TOKENS
    assert AppSettings(settings_path).get("max_tokens") == DEFAULT_MAX_TOKENS


def test_older_files_are_migrated(settings_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def rename_draft_length(raw: dict[str, Any]) -> dict[str, Any]:
        raw = dict(raw)
        raw["draft_max"] = raw.pop("draft_length")
        return raw

    monkeypatch.setattr(settings_module, "SETTINGS_VERSION", 2)
    monkeypatch.setattr(settings_module, "MIGRATIONS", {1: rename_draft_length})
    write_json(settings_path, {"version": 1, "draft_length": 8})

    settings = AppSettings(settings_path)
    assert settings.get("draft_max") == 8
    settings.set("seed", 3)
    assert json.loads(settings_path.read_text(encoding="utf-8"))["version"] == 2


def test_a_newer_file_keeps_what_this_version_knows(settings_path: Path) -> None:
    write_json(settings_path, {"version": SETTINGS_VERSION + 5, "top_k": 50, "new_thing": 1})
    settings = AppSettings(settings_path)
    assert settings.get("top_k") == 50


def test_generation_settings_mapping(settings_path: Path) -> None:
    settings = AppSettings(settings_path)
    default = generation_settings(settings)
    assert default.sampling.seed is None  # -1 = a fresh seed
    assert default.sampling.greedy
    assert default.exact_batches is True
    assert default.draft_max == DEFAULT_DRAFT_MAX
    assert default.p_min == DEFAULT_P_MIN
    assert default.max_tokens == DEFAULT_MAX_TOKENS
    assert default.verification == "rejection"  # no seed: rejection sampling
    assert default.sampling.min_p == 0.0
    assert default.draft_min == DEFAULT_DRAFT_MIN

    settings.set("temperature", 0.8)
    settings.set("top_p", 0.9)
    settings.set("top_k", 40)
    settings.set("seed", 42)
    settings.set("exact_verification", False)
    settings.set("draft_max", 8)
    settings.set("p_min", 0.5)
    settings.set("max_tokens", 1000)
    settings.set("min_p", 0.1)
    settings.set("draft_min", 2)
    mapped = generation_settings(settings)
    assert mapped.sampling.temperature == pytest.approx(0.8)
    assert mapped.sampling.top_p == pytest.approx(0.9)
    assert mapped.sampling.top_k == 40
    assert mapped.sampling.seed == 42
    assert mapped.exact_batches is False
    assert mapped.draft_max == 8
    assert mapped.p_min == pytest.approx(0.5)
    assert mapped.max_tokens == 1000
    assert mapped.sampling.min_p == pytest.approx(0.1)
    assert mapped.draft_min == 2
    # The one seed policy of window and API: a seed asks for the main model's own sample.
    assert mapped.verification == "sample-match"
    settings.set("draft_max", 1)  # a min above the max follows it down, never an error
    assert generation_settings(settings).draft_min == 1


def test_seed_zero_is_a_real_seed(settings_path: Path) -> None:
    settings = AppSettings(settings_path)
    settings.set("seed", 0)
    assert generation_settings(settings).sampling.seed == 0


def test_load_request_for_uses_engine_and_context(settings_path: Path) -> None:
    settings = AppSettings(settings_path)
    settings.set("context_size", 8192)
    request = load_request_for(settings, "/models/main.gguf", "/models/draft.gguf", "auto")
    assert request.main_path == "/models/main.gguf"
    assert request.draft_path == "/models/draft.gguf"
    assert request.n_ctx == 8192
    assert request.engine == "llama.cpp"
    assert request.method == "auto"
    assert request.draft_weights == "auto"
    settings.set("draft_weights", "stored")
    assert load_request_for(settings, "/m.gguf", "/d.gguf", "auto").draft_weights == "stored"
    plain = load_request_for(settings, "/models/main.gguf", None, "off", engine="mlx")
    assert plain.draft_path is None
    assert plain.engine == "mlx"
    with pytest.raises(SettingsError):
        load_request_for(settings, "/models/main.gguf", None, "draft-model")


def test_extra_model_folders_are_split(settings_path: Path, tmp_path: Path) -> None:
    settings = AppSettings(settings_path)
    assert extra_model_folders(settings) == []
    first, second = tmp_path / "a", tmp_path / "b c"
    settings.set("extra_model_folders", f"{first}{os.pathsep}{os.pathsep}{second}")
    assert extra_model_folders(settings) == [first, second]


def test_structured_output_is_the_api_s_response_format(settings_path: Path) -> None:
    settings = AppSettings(settings_path)
    assert generation_settings(settings).grammar is None
    settings.set("structured_output", "json_object")
    assert generation_settings(settings).grammar == compile_grammar("json_schema", ANY_JSON_OBJECT)
    settings.set("structured_output", "json_schema")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    settings.set("json_schema", json.dumps(schema))
    assert generation_settings(settings).grammar == compile_grammar("json_schema", schema)
    for text, words in (
        ("", "the JSON schema is empty"),
        ('{"type": "object",', "the JSON schema is not JSON: Expecting property name"),
        ('{"type": "objekt"}', "invalid json schema: Invalid type: objekt"),
    ):
        settings.set("json_schema", text)
        with pytest.raises(SettingsError, match=words):
            generation_settings(settings)
