"""Why a local model can or cannot draft for a main model: each reason named, on real files."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from backends.engines.hardware import estimate_model_memory
from backends.models.catalog import read_catalog_model
from backends.models.draft_verdict import draft_verdict, draft_verdicts, vision_projector

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.default_pair
def test_the_default_pair_can_draft(qwen_main_path: Path, qwen_draft_path: Path) -> None:
    verdict = draft_verdict(read_catalog_model(qwen_main_path), read_catalog_model(qwen_draft_path))
    assert verdict.can_draft
    assert verdict.kind == "compatible"
    assert verdict.reason == "same tokenizer (151,936 tokens), 0.5B for a 1.5B main model"
    assert verdict.summary.startswith("can draft: same tokenizer")


@pytest.mark.default_pair
def test_another_family_names_both_families_and_vocabularies(
    qwen_main_path: Path, smollm_path: Path, gemma_path: Path
) -> None:
    qwen, smollm, gemma = (
        read_catalog_model(path) for path in (qwen_main_path, smollm_path, gemma_path)
    )
    by_size = draft_verdict(qwen, smollm)
    assert not by_size.can_draft
    assert by_size.kind == "incompatible"
    assert by_size.reason.startswith("another family (llama; main: qwen2): ")
    assert "differ by 102,784 tokens" in by_size.reason
    assert "151,936" in by_size.reason
    assert "49,152" in by_size.reason
    by_type = draft_verdict(gemma, smollm)
    assert by_type.reason.startswith("another family (llama; main: gemma3): ")
    assert "BPE (gpt2) vocabulary of 49,152 tokens" in by_type.reason
    assert "SPM (llama) with 262,144" in by_type.reason
    assert "\n" not in by_type.summary


@pytest.mark.default_pair
def test_a_draft_bigger_than_the_main_model_will_not_pay(
    qwen_main_path: Path, qwen_draft_path: Path
) -> None:
    small, big = read_catalog_model(qwen_draft_path), read_catalog_model(qwen_main_path)
    verdict = draft_verdict(small, big)
    assert verdict.kind == "bigger"
    assert verdict.title == "will not pay"
    assert verdict.reason.startswith("bigger than the main model (1.5B vs 0.5B)")


@pytest.mark.default_pair
def test_a_draft_that_does_not_fit_names_what_it_needs_and_what_is_free(
    qwen_main_path: Path, qwen_draft_path: Path
) -> None:
    main, draft = read_catalog_model(qwen_main_path), read_catalog_model(qwen_draft_path)
    free = 100 * 2**20
    pair = draft_verdict(main, draft, free_memory=free)
    assert pair.kind == "no room"
    assert pair.reason.startswith("does not fit: the pair needs about ")
    assert pair.reason.endswith("and 0.1 GB is free")
    # With the main model loaded already only the draft has to fit.
    needed = estimate_model_memory(draft, 4096)
    alone = draft_verdict(main, draft, free_memory=needed, main_loaded=True)
    assert alone.can_draft
    loaded = draft_verdict(main, draft, free_memory=needed // 2, main_loaded=True)
    assert loaded.reason.startswith("does not fit: the draft needs about ")


def test_a_vision_model_is_named_by_its_projector(tmp_path: Path, smollm_path: Path) -> None:
    own = tmp_path / "vision-model"
    own.mkdir()
    (own / smollm_path.name).symlink_to(smollm_path)
    (own / "mmproj-model-f16.gguf").write_bytes(b"GGUF")  # only its name counts
    main = read_catalog_model(smollm_path)
    vision = read_catalog_model(own / smollm_path.name)
    assert vision_projector(vision) == "mmproj-model-f16.gguf"
    verdict = draft_verdict(main, vision)
    assert verdict.kind == "vision"
    assert "projector mmproj-model-f16.gguf" in verdict.reason
    # A folder of several models is not judged by one projector in it.
    (own / "other.gguf").symlink_to(smollm_path)
    assert vision_projector(vision) is None


@pytest.mark.default_pair
def test_the_list_puts_what_can_draft_first_smallest_first(
    qwen_main_path: Path, qwen_draft_path: Path, smollm_path: Path, gemma_path: Path
) -> None:
    main = read_catalog_model(qwen_main_path)
    candidates = [read_catalog_model(path) for path in (gemma_path, smollm_path, qwen_draft_path)]
    verdicts = draft_verdicts(main, [main, *candidates])
    assert [v.draft.path for v in verdicts if v.can_draft] == [qwen_draft_path, qwen_main_path]
    assert verdicts[1].reason == "the main model itself (self-speculation)"
    assert [v.can_draft for v in verdicts] == [True, True, False, False]
