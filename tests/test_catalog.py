"""Tests for the model catalog: folder discovery, scanning, and draft suggestions."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import gguf
import numpy as np
import pytest

from backends.models.catalog import (
    CatalogScan,
    compatible_drafts,
    default_model_folders,
    huggingface_hub_cache,
    scan_models,
)
from backends.models.gguf_info import read_model_info

if TYPE_CHECKING:
    from pathlib import Path


def write_tiny_gguf(path: Path, *, general_type: str = "model", split_max_tensors: int = 0) -> None:
    """A small valid GGUF file (or split model) written with the gguf package's writer."""
    writer = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    writer.add_name("Tiny test model")
    writer.add_type(general_type)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"tok{i}" for i in range(300)])
    writer.add_tensor("token_embd.weight", np.zeros((300, 8), dtype=np.float16))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def resolved_paths(scan: CatalogScan) -> set[str]:
    return {os.path.realpath(info.path) for info in scan.models}


@pytest.mark.default_pair
def test_scan_follows_links_dedupes_and_reports_problems(
    tmp_path: Path, smollm_path: Path, gemma_path: Path, qwen_draft_path: Path
) -> None:
    root = tmp_path / "models"
    (root / "nested" / "deeper").mkdir(parents=True)
    (root / "smollm.gguf").symlink_to(smollm_path)
    (root / "smollm-again.gguf").symlink_to(smollm_path)  # the same file twice: listed once
    (root / "nested" / "deeper" / "gemma.GGUF").symlink_to(gemma_path)
    # A Hugging Face cache entry: snapshot files are relative links into blobs/.
    repo = root / "hub" / "models--Qwen--Qwen2.5-Coder-0.5B-Instruct-GGUF"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "1d9614638d18").symlink_to(qwen_draft_path)
    for revision in ("main-rev", "older-rev"):
        snapshot = repo / "snapshots" / revision
        snapshot.mkdir(parents=True)
        (snapshot / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf").symlink_to(
            "../../blobs/1d9614638d18"
        )
    (root / "hub" / ".locks").mkdir()
    (root / "hub" / ".locks" / "stale.gguf").write_text("lock")  # hidden folders are skipped
    (root / "loop").symlink_to(root)  # must not be walked forever
    (root / "readme.txt").write_text("not a model")
    corrupt = root / "corrupt.gguf"
    corrupt.write_text("definitely not GGUF")
    truncated = root / "nested" / "truncated.gguf"
    with smollm_path.open("rb") as source:
        truncated.write_bytes(source.read(smollm_path.stat().st_size // 2))
    projector = root / "mmproj-model-f16.gguf"
    write_tiny_gguf(projector, general_type="mmproj")

    scan = scan_models([root])

    assert resolved_paths(scan) == {
        os.path.realpath(smollm_path),
        os.path.realpath(gemma_path),
        os.path.realpath(qwen_draft_path),
    }
    hf_model = next(info for info in scan.models if info.architecture == "qwen2")
    assert hf_model.path.name == "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"  # the link's name
    assert [problem.path for problem in scan.problems] == [corrupt, truncated]
    for problem in scan.problems:
        assert str(problem.path) in problem.message
        assert "\n" not in problem.message
    assert "truncated" in scan.problems[1].message
    assert [entry.path for entry in scan.ignored] == [projector]
    assert "vision projector" in scan.ignored[0].message


def test_only_the_first_shard_of_a_split_model_is_listed(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", split_max_tensors=1)
    first = tmp_path / "tiny-00001-of-00002.gguf"
    # A later shard is skipped by name, whatever it holds.
    (tmp_path / "other-00002-of-00003.gguf").write_text("garbage")

    scan = scan_models([tmp_path])

    assert [info.path for info in scan.models] == [first]
    assert scan.models[0].parameter_count == 300 * 8 + 8  # tensors of both shards
    assert scan.problems == ()
    assert scan.ignored == ()


def test_missing_folder_is_a_problem(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    scan = scan_models([missing])
    assert scan.models == ()
    assert [problem.path for problem in scan.problems] == [missing]


def test_default_folders_are_those_that_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    own = tmp_path / "specdeck-models"
    lmstudio = home / ".lmstudio" / "models"
    hf_default = home / ".cache" / "huggingface" / "hub"
    for folder in (own, lmstudio, hf_default):
        folder.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SPECDECK_MODELS_DIR", str(own))
    for variable in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)

    # ~/.cache/lm-studio/models does not exist, so it is left out.
    assert default_model_folders() == [own, lmstudio, hf_default]

    hf_home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(hf_home))
    assert huggingface_hub_cache() == hf_home / "hub"
    assert default_model_folders() == [own, lmstudio]  # hf-home/hub does not exist

    hub_cache = tmp_path / "hub-cache"
    hub_cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    assert default_model_folders() == [own, lmstudio, hub_cache]


def test_scan_without_folders_uses_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm_path: Path
) -> None:
    own = tmp_path / "specdeck-models"
    own.mkdir()
    (own / "smollm.gguf").symlink_to(smollm_path)
    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    monkeypatch.setenv("SPECDECK_MODELS_DIR", str(own))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hub"))

    scan = scan_models()

    assert [info.path for info in scan.models] == [own / "smollm.gguf"]


@pytest.mark.default_pair
def test_compatible_drafts_keeps_main_and_gives_reasons(
    qwen_main_path: Path, qwen_draft_path: Path, smollm_path: Path, gemma_path: Path
) -> None:
    main = read_model_info(qwen_main_path)
    candidates = [read_model_info(path) for path in (qwen_main_path, qwen_draft_path)]
    candidates += [read_model_info(smollm_path), read_model_info(gemma_path)]

    results = compatible_drafts(main, candidates)

    assert [candidate for candidate, _ in results] == candidates
    reasons = [reason for _, reason in results]
    assert reasons[:2] == [None, None]  # itself (self-speculation) and the 0.5B draft
    assert "differ by" in (reasons[2] or "")
    assert "vocabulary" in (reasons[3] or "")
