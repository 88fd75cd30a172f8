"""The draft's Q4_0 copy: when it is made, that it is made once and right, and how it fails."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

import pytest

from backends.engines.draft_weights import (
    bits_per_weight,
    check_draft_weights,
    drafting_file,
    fast_copy_path,
    wants_q4_0,
)
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.engines.llama_native import requantize_q4_0
from backends.errors import ModelFileError, SettingsError
from backends.models.gguf_info import read_model_info
from backends.paths import CACHE_DIR_ENV
from backends.service.protocol import LoadRequest
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.sampling import SamplingSettings
from backends.speculation.types import GenerationSettings
from tests.conftest import TEST_CONTEXT, user

if TYPE_CHECKING:
    from pathlib import Path


@pytest.mark.default_pair
def test_which_drafts_get_a_q4_0_copy(qwen_draft_path: Path, smollm_path: Path) -> None:
    qwen = read_model_info(qwen_draft_path)
    # The 0.5B's rows of 896 cannot hold K-quants: its "Q4_K_M" takes over 6 bits a weight.
    assert bits_per_weight(qwen) > 6.0
    assert wants_q4_0("auto", qwen, on_gpu=False)
    assert not wants_q4_0("auto", qwen, on_gpu=True)
    assert not wants_q4_0("stored", qwen, on_gpu=False)
    assert wants_q4_0("q4_0", qwen, on_gpu=True)
    smollm = read_model_info(smollm_path)  # Q4_1: 5 bits, heavier than Q4_0's 4.5
    assert wants_q4_0("auto", smollm, on_gpu=False)


def test_modes_are_checked_in_one_line() -> None:
    assert check_draft_weights("stored") == "stored"
    with pytest.raises(SettingsError, match="draft weights must be one of auto, stored, q4_0"):
        check_draft_weights("q2_k")
    with pytest.raises(SettingsError, match="draft weights"):
        LlamaLoadSettings(draft_weights="fast")  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match="draft weights"):
        LoadRequest(main_path="m.gguf", draft_weights="fast")  # type: ignore[arg-type]


def test_the_copy_is_q4_0_made_once_and_remade_when_the_source_changes(
    smollm_path: Path, tmp_path: Path
) -> None:
    source = tmp_path / "models" / smollm_path.name
    source.parent.mkdir()
    shutil.copy(smollm_path, source)
    folder = tmp_path / "fast"
    info = read_model_info(source)
    copy, note = drafting_file(
        info, "auto", on_gpu=False, requantize=requantize_q4_0, folder=folder
    )
    assert copy == fast_copy_path(source, folder)
    assert note is not None
    assert "requantized to Q4_0" in note
    assert "made once" in note
    made = read_model_info(copy)
    assert made.quantization == "Q4_0"
    assert made.file_size < info.file_size
    assert made.vocab.tokens == info.vocab.tokens  # the same tokenizer: still compatible
    stamp = copy.stat().st_mtime_ns
    again, note = drafting_file(
        info, "auto", on_gpu=False, requantize=requantize_q4_0, folder=folder
    )
    assert again == copy
    assert copy.stat().st_mtime_ns == stamp
    assert note is not None
    assert "made once" not in note
    # Another model whose name starts with this one's keeps its copy.
    other = folder / f"{source.stem}.Q8.1-2-v1.q4_0.gguf"
    other.write_bytes(b"another model's copy")
    # The source changes (a new download): a new copy, and the stale one is gone.
    os.utime(source, ns=(stamp, stamp + 10**9))
    newer, _ = drafting_file(
        read_model_info(source), "auto", on_gpu=False, requantize=requantize_q4_0, folder=folder
    )
    assert newer != copy
    assert newer.is_file()
    assert not copy.exists()
    assert sorted(p.name for p in folder.iterdir()) == sorted([newer.name, other.name])
    # As stored: the source itself, no note.
    assert drafting_file(
        info, "stored", on_gpu=False, requantize=requantize_q4_0, folder=folder
    ) == (source, None)


def test_a_broken_source_or_folder_fails_in_one_line_and_leaves_nothing(
    smollm_path: Path, tmp_path: Path
) -> None:
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm_path.read_bytes()[: 20 * 2**20])  # the header, half the tensors
    folder = tmp_path / "fast"
    with pytest.raises(ModelFileError, match=r"^cannot requantize draft cut\.gguf to Q4_0: ") as e:
        requantize_q4_0(cut, folder / "cut.q4_0.gguf")
    assert "\n" not in str(e.value)
    assert list(folder.iterdir()) == []
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder should be")
    with pytest.raises(ModelFileError, match="cannot write the Q4_0 copy of draft"):
        requantize_q4_0(smollm_path, blocked / "copy.gguf")


def test_a_draft_loads_its_copy_and_speculation_stays_exact(
    smollm_path: Path,
    smollm_target: LlamaEngine,
    smollm_draft: LlamaEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    settings = LlamaLoadSettings(n_ctx=TEST_CONTEXT)
    with LlamaEngine(smollm_path, settings, is_draft=True) as fast:
        assert any("requantized to Q4_0" in note for note in fast.load_report.notes)
        assert fast.name == smollm_target.name  # named as the model the user picked
        stored = smollm_draft  # the same file as stored: draft_weights="stored"
        assert not any("requantized" in note for note in stored.load_report.notes)
        prompt = smollm_target.tokenize("def fibonacci(n):", add_special=False, parse_special=False)
        # Different weights, so different logits: the copy is really what drafts.
        fast_row = fast.evaluate(prompt, 1)[0].copy()
        stored.truncate(0)
        stored_row = stored.evaluate(prompt, 1)[0].copy()
        assert (fast_row != stored_row).any()
        # The main model still decides every token: the text is plain decoding's.
        generation = GenerationSettings(max_tokens=48, sampling=SamplingSettings(temperature=0.0))
        plain = SpeculativeDecoder(smollm_target)
        messages = user("Write a Python function that adds two numbers.")
        tokens = plain.prompt_tokens(messages)
        smollm_target.truncate(0)
        expected = plain.run(tokens, generation)
        decoder = build_decoder("draft-model", smollm_target, fast, adaptive=False, p_min=0.0)
        smollm_target.truncate(0)
        drafted = decoder.run(tokens, generation)
        assert drafted.token_ids == expected.token_ids
        assert drafted.stats.accepted_draft_tokens_count > 10
