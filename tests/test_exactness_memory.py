"""The exactness memory: a probe's answer read back on the same fingerprint, never on another."""

from __future__ import annotations

import json
import os
import shutil
from typing import TYPE_CHECKING

import pytest

import backends.engines.llama as llama
import backends.engines.mlx as mlx_engine
from backends.engines.exactness_memory import (
    EXACTNESS_FILE,
    MAX_REMEMBERED,
    ExactnessMemory,
    fingerprint_key,
)
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.engines.llama_native import TILED_MIN_ROWS_VARIABLE
from backends.paths import CACHE_DIR_ENV

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from backends.engines.interface import ModelEngine

REMEMBERED = "as probed on"  # the load report's line for an answer read back


def test_an_answer_is_read_back_under_its_key_only(tmp_path: Path) -> None:
    memory = ExactnessMemory(tmp_path / EXACTNESS_FILE)
    key = fingerprint_key({"model": ["/m.gguf", 1, 2], "settings": {"n_ctx": 512}})
    assert memory.recall(key) is None
    probed = memory.remember(key, 63, siblings=True)
    again = ExactnessMemory(tmp_path / EXACTNESS_FILE).recall(key)  # another process
    assert again == probed
    assert (again.limit, again.siblings) == (63, True)
    assert again.note.startswith(f"exact batches up to 63 tokens, {REMEMBERED} ")
    # Any fact that differs is another key: the modification time, a setting.
    assert fingerprint_key({"model": ["/m.gguf", 1, 3], "settings": {"n_ctx": 512}}) != key
    assert fingerprint_key({"model": ["/m.gguf", 1, 2], "settings": {"n_ctx": 1024}}) != key
    assert memory.recall(fingerprint_key({"model": ["/m.gguf", 1, 3]})) is None


def test_the_memory_keeps_the_newest_answers(tmp_path: Path) -> None:
    memory = ExactnessMemory(tmp_path / EXACTNESS_FILE)
    keys = [fingerprint_key({"n": n}) for n in range(MAX_REMEMBERED + 2)]
    for n, key in enumerate(keys):
        memory.remember(key, n)
    assert memory.recall(keys[0]) is None
    assert memory.recall(keys[1]) is None
    assert memory.recall(keys[2]) is not None
    assert memory.recall(keys[-1]).limit == MAX_REMEMBERED + 1  # type: ignore[union-attr]
    memory.remember(keys[2], 2)  # remembered again: the newest now
    memory.remember(fingerprint_key({"n": "new"}), 0)
    assert memory.recall(keys[2]) is not None
    assert memory.recall(keys[3]) is None


def test_an_answer_in_use_outlives_answers_of_one_off_loads(tmp_path: Path) -> None:
    """Recalled from the older half, an answer moves to the newest end."""
    memory = ExactnessMemory(tmp_path / EXACTNESS_FILE)
    in_use = fingerprint_key({"model": "default pair"})
    memory.remember(in_use, 8)
    for n in range(MAX_REMEMBERED - 1):
        memory.remember(fingerprint_key({"copy": n}), 1)
    assert memory.recall(in_use) is not None  # the oldest of a full memory: moved on
    for n in range(MAX_REMEMBERED // 2):
        memory.remember(fingerprint_key({"later copy": n}), 1)
    recalled = memory.recall(in_use)
    assert recalled is not None
    assert recalled.limit == 8
    assert memory.recall(fingerprint_key({"copy": 0})) is None  # one-off: gone


def test_a_broken_or_unwritable_file_only_costs_a_probe(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / EXACTNESS_FILE
    path.write_text("{not json")
    memory = ExactnessMemory(path)
    key = fingerprint_key({"model": 1})
    assert memory.recall(key) is None
    assert "ignoring unreadable" in caplog.text
    memory.remember(key, 8)  # written anew
    assert memory.recall(key).limit == 8  # type: ignore[union-attr]
    path.write_text(json.dumps({"answers": {key: {"limit": "many"}}}))
    assert memory.recall(key) is None
    blocked = ExactnessMemory(tmp_path / "a-file" / EXACTNESS_FILE)
    (tmp_path / "a-file").write_text("")
    assert blocked.remember(key, 8).limit == 8  # the load goes on
    assert "cannot remember the exactness probe" in caplog.text


def _counting_probes(monkeypatch: pytest.MonkeyPatch, module: object) -> list[int]:
    """Count the engine module's probe runs, with or without siblings (each runs for real)."""
    runs: list[int] = []
    for name in ("probe_exact_batch_limit", "probe_exact_batches_and_siblings"):
        probe: Callable[..., object] | None = getattr(module, name, None)
        if probe is None:
            continue

        def counted(
            engine: ModelEngine, size: int, ceiling: int, probe: Callable[..., object] = probe
        ) -> object:
            runs.append(size)
            return probe(engine, size, ceiling)

        monkeypatch.setattr(module, name, counted)
    return runs


@pytest.mark.heavy
def test_a_llama_load_reads_back_its_probe_until_something_changes(
    smollm_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    probes = _counting_probes(monkeypatch, llama)
    model = tmp_path / smollm_path.name
    shutil.copyfile(smollm_path, model)
    settings = LlamaLoadSettings(n_ctx=512)

    def load(load_settings: LlamaLoadSettings = settings) -> tuple[int | None, list[str]]:
        with LlamaEngine(model, load_settings) as engine:
            return engine.exact_batch_limit, list(engine.load_report.notes)

    limit, notes = load()
    assert probes == [17]
    assert limit is not None
    assert limit > 1
    assert not any(REMEMBERED in note for note in notes)
    # The same file, library, CPU and settings: read back, no probe, and the report says so.
    again, notes = load()
    assert (again, probes) == (limit, [17])
    assert f"exact batches up to {limit} tokens, {REMEMBERED} " in " ".join(notes)
    # Anything that computes the rows differently probes again, then is read back too.
    load(LlamaLoadSettings(n_ctx=512, weight_repacking="off"))
    assert len(probes) == 2
    tiled = os.environ[TILED_MIN_ROWS_VARIABLE]  # SpecDeck's threshold, set at the first load
    monkeypatch.setenv(TILED_MIN_ROWS_VARIABLE, "8")  # llama.cpp's own
    load()
    assert len(probes) == 3
    monkeypatch.setenv(TILED_MIN_ROWS_VARIABLE, tiled)
    load()
    assert len(probes) == 3  # as before
    stat = model.stat()
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # a new copy
    load()
    assert len(probes) == 4
    # A draft is never probed, so never remembered.
    with LlamaEngine(model, settings, is_draft=True) as draft:
        assert draft.exact_batch_limit is None
    assert len(probes) == 4


def test_an_mlx_load_reads_back_its_probe(
    tiny_mlx_main: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    probes = _counting_probes(monkeypatch, mlx_engine)
    with mlx_engine.MlxEngine(tiny_mlx_main, n_ctx=256) as engine:
        limit = engine.exact_batch_limit
        assert not any(REMEMBERED in note for note in engine.load_report.notes)
    assert len(probes) == 1
    with mlx_engine.MlxEngine(tiny_mlx_main, n_ctx=256) as engine:
        assert engine.exact_batch_limit == limit
        assert any(REMEMBERED in note for note in engine.load_report.notes)
    assert len(probes) == 1
    with mlx_engine.MlxEngine(tiny_mlx_main, n_ctx=512) as engine:  # the cache just grows
        assert engine.exact_batch_limit == limit
    assert len(probes) == 1
    # The same files elsewhere (an import of the same GGUF file into another models
    # folder, a copy) are the same model; notes for people do not count.
    copy = tmp_path / "elsewhere" / tiny_mlx_main.name
    shutil.copytree(tiny_mlx_main, copy)
    (copy / "README.md").write_text("imported again today", encoding="utf-8")
    with mlx_engine.MlxEngine(copy, n_ctx=256) as engine:
        assert any(REMEMBERED in note for note in engine.load_report.notes)
    assert len(probes) == 1
    # Other weights of the same size are another model.
    weights = max(copy.glob("*.safetensors"), key=lambda path: path.stat().st_size)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with mlx_engine.MlxEngine(copy, n_ctx=256) as engine:
        assert not any(REMEMBERED in note for note in engine.load_report.notes)
    assert len(probes) == 2
    monkeypatch.setenv("MLX_FAKE_KERNEL_SWITCH", "1")  # MLX_* can choose kernels
    with mlx_engine.MlxEngine(tiny_mlx_main, n_ctx=256) as engine:
        assert engine.exact_batch_limit == limit
    assert len(probes) == 3
