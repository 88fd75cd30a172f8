"""Tests for reading GGUF metadata and for llama.cpp's draft/main compatibility rules."""

from __future__ import annotations

import os
import random
import shutil
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np
import pytest

from backends.errors import IncompatiblePairError, ModelFileError
from backends.models.compat import (
    SPEC_VOCAB_MAX_SIZE_DIFFERENCE,
    check_compatibility,
    compatibility_problem,
    first_differing_token,
)
from backends.models.gguf_info import (
    ModelInfo,
    NotALanguageModelError,
    clear_model_info_cache,
    format_parameter_count,
    read_model_info,
    vocab_fingerprint,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

# Reading the 1.1 GB Qwen2.5-Coder-1.5B header takes ~0.15 s here; gguf.GGUFReader took ~6 s.
QWEN_READ_SECONDS_LIMIT = 2.0

REAL_MODELS = [
    # fixture, architecture, tokenizer, vocab size, BOS, EOS, adds BOS, quantization,
    # parameter range, context length, layers
    ("smollm_path", "llama", "gpt2", 49152, 1, 2, False, "Q4_1", (1.2e8, 1.5e8), 8192, 30),
    ("gemma_path", "gemma3", "llama", 262144, 2, 1, True, "Q4_K_M", (2.5e8, 2.9e8), 32768, 18),
    pytest.param("qwen_main_path", "qwen2", "gpt2", 151936, 151643, 151645, False, "Q4_K_M",
                 (1.4e9, 1.8e9), 32768, 28, marks=pytest.mark.default_pair),
    pytest.param("qwen_draft_path", "qwen2", "gpt2", 151936, 151643, 151645, False, "Q4_K_M",
                 (4.5e8, 6.5e8), 32768, 24, marks=pytest.mark.default_pair),
]  # fmt: skip


def write_tiny_gguf(
    path: Path,
    *,
    tokenizer_model: str | None = "llama",
    tokens: Sequence[str] | None = None,
    metadata: dict[str, Any] | None = None,
    split_max_tensors: int = 0,
) -> None:
    """Write a small valid GGUF file (or split model) with the gguf package's own writer."""
    token_texts = list(tokens) if tokens is not None else [f"tok{i}" for i in range(300)]
    writer = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    writer.add_name("Tiny test model")
    if tokenizer_model is not None:
        writer.add_tokenizer_model(tokenizer_model)
        writer.add_token_list(token_texts)
    for key, value in (metadata or {}).items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_string(key, value)
    writer.add_tensor("token_embd.weight", np.zeros((len(token_texts), 8), dtype=np.float16))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def assert_one_line_naming(error: pytest.ExceptionInfo[ModelFileError], path: Path) -> None:
    message = str(error.value)
    assert "\n" not in message
    assert str(path) in message


# --- real models ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    (
        "fixture",
        "architecture",
        "tokenizer",
        "vocab_size",
        "bos_id",
        "eos_id",
        "add_bos",
        "quantization",
        "parameter_range",
        "context_length",
        "n_layers",
    ),
    REAL_MODELS,
)
def test_real_model_metadata(
    request: pytest.FixtureRequest,
    fixture: str,
    architecture: str,
    tokenizer: str,
    vocab_size: int,
    bos_id: int,
    eos_id: int,
    add_bos: bool,
    quantization: str,
    parameter_range: tuple[float, float],
    context_length: int,
    n_layers: int,
) -> None:
    path: Path = request.getfixturevalue(fixture)
    info = read_model_info(path)

    assert info.path == path
    assert info.name
    assert info.architecture == architecture
    assert info.quantization == quantization
    assert parameter_range[0] <= info.parameter_count <= parameter_range[1]
    assert info.file_size == path.stat().st_size
    assert info.context_length == context_length
    assert info.n_layers == n_layers
    vocab = info.vocab
    assert (vocab.model_type, vocab.size, len(vocab.tokens)) == (tokenizer, vocab_size, vocab_size)
    assert (vocab.bos_id, vocab.eos_id, vocab.add_bos, vocab.add_eos) == (
        bos_id,
        eos_id,
        add_bos,
        False,
    )
    assert vocab.fingerprint == vocab_fingerprint(vocab.tokens)


@pytest.mark.default_pair
def test_real_model_details(
    smollm_path: Path, gemma_path: Path, qwen_main_path: Path, qwen_draft_path: Path
) -> None:
    smollm, gemma = read_model_info(smollm_path), read_model_info(gemma_path)
    qwen_main, qwen_draft = read_model_info(qwen_main_path), read_model_info(qwen_draft_path)

    assert qwen_main.vocab.tokens[qwen_main.vocab.eos_id or 0] == "<|im_end|>"
    assert gemma.vocab.tokens[gemma.vocab.bos_id or 0] == "<bos>"
    assert (qwen_main.size_label, qwen_draft.size_label, smollm.size_label) == (
        "1.5B",
        "0.5B",
        "135M",
    )
    assert "<|im_start|>" in (qwen_main.chat_template or "")
    assert gemma.chat_template is None  # this Gemma file carries no template
    assert qwen_main.display_name == "Qwen2.5 Coder 1.5B Instruct (Q4_K_M)"
    assert qwen_main.vocab.fingerprint == qwen_draft.vocab.fingerprint
    assert smollm.vocab.fingerprint != gemma.vocab.fingerprint
    assert "tokens" not in repr(qwen_main.vocab)  # 150k texts stay out of logs


@pytest.mark.default_pair
def test_reading_qwen_metadata_is_fast(qwen_main_path: Path) -> None:
    clear_model_info_cache()
    started = time.perf_counter()
    read_model_info(qwen_main_path)
    assert time.perf_counter() - started < QWEN_READ_SECONDS_LIMIT


def test_cache_keeps_results_until_the_file_changes(smollm_path: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(smollm_path, copy)
    first = read_model_info(copy)
    assert read_model_info(str(copy)) is first

    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    reread = read_model_info(copy)
    assert reread is not first
    assert reread == first


def test_format_parameter_count() -> None:
    assert format_parameter_count(134_515_008) == "135M"
    assert format_parameter_count(1_543_714_304) == "1.5B"
    assert format_parameter_count(7_000_000_000) == "7B"
    assert format_parameter_count(12_300) == "12K"
    assert format_parameter_count(999) == "999"


# --- compatibility -------------------------------------------------------------------------


def with_tokens(info: ModelInfo, tokens: Sequence[str]) -> ModelInfo:
    return with_vocab(info, tokens=tuple(tokens), size=len(tokens))


def with_vocab(info: ModelInfo, **vocab_changes: Any) -> ModelInfo:
    return replace(info, vocab=replace(info.vocab, **vocab_changes))


@pytest.mark.default_pair
def test_qwen_pair_is_compatible(qwen_main_path: Path, qwen_draft_path: Path) -> None:
    main, draft = read_model_info(qwen_main_path), read_model_info(qwen_draft_path)
    assert compatibility_problem(main, draft) is None
    check_compatibility(main, draft)


def test_model_is_compatible_with_itself(smollm_path: Path) -> None:
    smollm = read_model_info(smollm_path)
    check_compatibility(smollm, smollm)


def test_gemma_main_with_smollm_draft_names_the_vocabulary_types(
    gemma_path: Path, smollm_path: Path
) -> None:
    gemma, smollm = read_model_info(gemma_path), read_model_info(smollm_path)
    with pytest.raises(IncompatiblePairError) as error:
        check_compatibility(gemma, smollm)
    message = str(error.value)
    assert message == compatibility_problem(gemma, smollm)
    assert "\n" not in message
    assert "vocabulary" in message
    assert message.startswith("incompatible pair: another family (llama; main: gemma3): ")
    assert "draft 'Smollm2 135M 8k Lc100K Mix1 Ep2' has the BPE (gpt2) vocabulary" in message
    assert "of 49,152 tokens" in message
    assert "main 'Gemma 3 270m' has SPM (llama) with 262,144" in message


@pytest.mark.default_pair
def test_different_vocabulary_sizes_are_named(qwen_main_path: Path, smollm_path: Path) -> None:
    problem = compatibility_problem(read_model_info(qwen_main_path), read_model_info(smollm_path))
    assert problem is not None
    assert "another family (llama; main: qwen2)" in problem
    assert "differ by 102,784 tokens" in problem


@pytest.mark.default_pair
def test_one_differing_token_is_named(qwen_main_path: Path) -> None:
    main = read_model_info(qwen_main_path)
    tokens = list(main.vocab.tokens)
    tokens[1234] = "bar\nbaz"
    draft = with_tokens(main, tokens)

    problem = compatibility_problem(main, draft)
    assert problem is not None
    assert "token 1234" in problem
    assert "another family" not in problem  # the same architecture
    # How many texts differ, over llama.cpp's compared range (ids 5 up to the size).
    assert f"1 of {main.vocab.size - 5:,} token texts differ" in problem
    assert f"is {main.vocab.tokens[1234]!r} in main" in problem
    assert "but 'bar\\nbaz' in draft" in problem
    assert "\n" not in problem
    assert first_differing_token(main.vocab, draft.vocab) == 1234


def test_tokens_below_five_are_not_compared(smollm_path: Path) -> None:
    main = read_model_info(smollm_path)
    draft = with_tokens(main, ["<a>", "<b>", "<c>", "<d>", "<e>", *main.vocab.tokens[5:]])
    assert compatibility_problem(main, draft) is None


def test_vocabulary_sizes_may_differ_by_128(smollm_path: Path) -> None:
    main = read_model_info(smollm_path)
    padding = [f"<pad_{i}>" for i in range(SPEC_VOCAB_MAX_SIZE_DIFFERENCE + 1)]
    just_fits = with_tokens(main, [*main.vocab.tokens, *padding[:-1]])
    too_many = with_tokens(main, [*main.vocab.tokens, *padding])

    assert compatibility_problem(main, just_fits) is None
    problem = compatibility_problem(main, too_many)
    assert "differ by 129 tokens" in (problem or "")


@pytest.mark.parametrize("kind", ["bos", "eos"])
def test_special_token_ids_matter_only_when_the_token_is_added(
    smollm_path: Path, kind: str
) -> None:
    main = read_model_info(smollm_path)
    other_id = with_vocab(main, **{f"{kind}_id": 7})
    assert compatibility_problem(main, other_id) is None  # SmolLM2 adds neither

    adding_main = with_vocab(main, **{f"add_{kind}": True})
    adding_other = with_vocab(other_id, **{f"add_{kind}": True})
    problem = compatibility_problem(adding_main, adding_other) or ""
    assert f"uses {kind.upper()} token" in problem
    assert f"uses 7 {main.vocab.tokens[7]!r}" in problem

    problem = compatibility_problem(main, adding_other) or ""
    assert f"draft 'Smollm2 135M 8k Lc100K Mix1 Ep2' adds a {kind.upper()} token" in problem
    assert f"add-{kind.upper()}" in problem


# --- llama.cpp's tokenizer defaults, on synthetic files ------------------------------------


def test_spm_defaults_add_bos(tmp_path: Path) -> None:
    path = tmp_path / "spm.gguf"
    write_tiny_gguf(path, tokenizer_model="llama")
    vocab = read_model_info(path).vocab
    assert (vocab.vocab_type, vocab.bos_id, vocab.eos_id, vocab.add_bos) == ("SPM", 1, 2, True)


@pytest.mark.parametrize(("pre", "adds_bos"), [("qwen2", False), ("llama-bpe", True)])
def test_bpe_adds_bos_only_for_some_pre_tokenizers(
    tmp_path: Path, pre: str, adds_bos: bool
) -> None:
    path = tmp_path / "bpe.gguf"
    write_tiny_gguf(path, tokenizer_model="gpt2", metadata={"tokenizer.ggml.pre": pre})
    vocab = read_model_info(path).vocab
    assert (vocab.vocab_type, vocab.bos_id, vocab.eos_id) == ("BPE", 11, 11)
    assert vocab.add_bos is adds_bos


def test_file_keys_override_defaults_and_bad_ids_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "keys.gguf"
    metadata = {
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_eos_token": True,
        "tokenizer.ggml.bos_token_id": 5000,  # outside the 300 tokens: llama.cpp keeps the default
        "tokenizer.ggml.eos_token_id": 42,
    }
    write_tiny_gguf(path, tokenizer_model="llama", metadata=metadata)
    vocab = read_model_info(path).vocab
    assert (vocab.bos_id, vocab.eos_id, vocab.add_bos, vocab.add_eos) == (1, 42, False, True)


def test_default_ids_outside_a_small_vocabulary_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "small.gguf"
    write_tiny_gguf(path, tokenizer_model="gpt2", tokens=[f"t{i}" for i in range(8)])
    vocab = read_model_info(path).vocab
    assert (vocab.bos_id, vocab.eos_id) == (None, None)


def test_quantization_falls_back_to_the_main_tensor_type(tmp_path: Path) -> None:
    path = tmp_path / "no-file-type.gguf"
    write_tiny_gguf(path)
    assert read_model_info(path).quantization == "F16"


def test_split_model_sums_its_parts(tmp_path: Path) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", split_max_tensors=1)
    first, second = tmp_path / "tiny-00001-of-00002.gguf", tmp_path / "tiny-00002-of-00002.gguf"

    info = read_model_info(first)
    assert info.parameter_count == 300 * 8 + 8
    assert info.file_size == first.stat().st_size + second.stat().st_size

    with pytest.raises(NotALanguageModelError, match="part 2 of 2"):
        read_model_info(second)

    second.unlink()
    clear_model_info_cache()
    with pytest.raises(ModelFileError, match="part 2 .* is missing") as error:
        read_model_info(first)
    assert_one_line_naming(error, first)


@pytest.mark.parametrize(
    ("tokenizer_model", "metadata", "what"),
    [
        ("llama", {"general.type": "mmproj"}, "vision projector"),
        ("llama", {"general.type": "adapter"}, "LoRA adapter"),
        (None, {}, "without a tokenizer"),
    ],
)
def test_files_that_are_not_language_models(
    tmp_path: Path, tokenizer_model: str | None, metadata: dict[str, Any], what: str
) -> None:
    path = tmp_path / "other.gguf"
    write_tiny_gguf(path, tokenizer_model=tokenizer_model, metadata=metadata)
    with pytest.raises(NotALanguageModelError, match=what) as error:
        read_model_info(path)
    assert_one_line_naming(error, path)


# --- bad files -----------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.gguf"
    with pytest.raises(ModelFileError, match="not found") as error:
        read_model_info(path)
    assert_one_line_naming(error, path)


def test_broken_link(tmp_path: Path) -> None:
    path = tmp_path / "link.gguf"
    path.symlink_to(tmp_path / "gone.gguf")
    with pytest.raises(ModelFileError, match="broken") as error:
        read_model_info(path)
    assert_one_line_naming(error, path)


def test_directory(tmp_path: Path) -> None:
    path = tmp_path / "folder.gguf"
    path.mkdir()
    with pytest.raises(ModelFileError, match="folder") as error:
        read_model_info(path)
    assert_one_line_naming(error, path)


def test_text_file_renamed_to_gguf(tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("hello, this is not a model\n")
    with pytest.raises(ModelFileError, match="not a GGUF model file") as error:
        read_model_info(path)
    assert_one_line_naming(error, path)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.touch()
    with pytest.raises(ModelFileError, match="empty") as error:
        read_model_info(path)
    assert_one_line_naming(error, path)


def test_legacy_ggjt_file(tmp_path: Path) -> None:
    path = tmp_path / "old.bin.gguf"
    path.write_bytes(b"tjgg" + bytes(100))
    with pytest.raises(ModelFileError, match="GGJT") as error:
        read_model_info(path)
    assert_one_line_naming(error, path)


def test_unsupported_version(smollm_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "future.gguf"
    with smollm_path.open("rb") as source:
        header = bytearray(source.read(4096))
    header[4:8] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(header))
    with pytest.raises(ModelFileError, match="version 99") as error:
        read_model_info(path)
    assert_one_line_naming(error, path)


def test_truncated_copy_of_smollm(smollm_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "truncated.gguf"
    size = smollm_path.stat().st_size
    with smollm_path.open("rb") as source:
        path.write_bytes(source.read(size * 6 // 10))
    with pytest.raises(ModelFileError, match="truncated") as error:
        read_model_info(path)
    assert_one_line_naming(error, path)


def test_truncation_anywhere_in_the_header_is_a_model_file_error(
    smollm_path: Path, tmp_path: Path
) -> None:
    with smollm_path.open("rb") as source:
        header = source.read(2_000_000)  # the header ends at 1.79 MB
    path = tmp_path / "cut.gguf"
    for cut in (5, 9, 24, 100, 1000, 50_000, 1_000_000, 1_700_000, 1_785_000):
        path.write_bytes(header[:cut])
        with pytest.raises(ModelFileError, match="truncated") as error:
            read_model_info(path)
        assert_one_line_naming(error, path)


def test_corrupted_bytes_never_raise_anything_but_model_file_error(tmp_path: Path) -> None:
    original = tmp_path / "tiny.gguf"
    write_tiny_gguf(original)
    pristine = original.read_bytes()
    header_end = pristine.index(b"output_norm.weight") + 64
    corrupt = tmp_path / "corrupt.gguf"
    generator = random.Random(1234)
    messages = []
    for _ in range(200):
        damaged = bytearray(pristine)
        for _ in range(generator.randint(1, 4)):
            damaged[generator.randrange(4, header_end)] = generator.randrange(256)
        corrupt.write_bytes(bytes(damaged))
        clear_model_info_cache()
        try:
            read_model_info(corrupt)
        except ModelFileError as error:  # anything else fails the test
            messages.append(str(error))
    assert messages
    assert not [message for message in messages if "\n" in message]
