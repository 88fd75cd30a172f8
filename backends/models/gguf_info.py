"""Read a GGUF file's metadata (name, size, quantization, tokenizer) without loading its weights."""

from __future__ import annotations

import contextlib
import hashlib
import math
import mmap
import os
import re
import struct
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gguf import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
    LlamaFileType,
)

from backends.errors import ModelFileError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

# Why not gguf.GGUFReader: it builds a numpy view for every element of every array, so the
# ~300k token and merge strings of a Qwen2.5 header take 5-6 s to read.  The walk below reads
# the same layout (using the gguf package's own type tables) and decodes only the keys SpecDeck
# uses: about 0.15 s for the same file, and every read is bounds-checked, so a truncated or
# corrupt file becomes a ModelFileError instead of a struct/numpy error.

SUPPORTED_GGUF_VERSIONS = (2, 3)  # llama.cpp refuses version 1 (32-bit lengths) too
GGML_MAX_DIMS = 4
FINGERPRINT_HEX_DIGITS = 16
# Far above any real file (vocabularies reach ~1M tokens); a count beyond these comes from a
# damaged header, and walking it could crawl through gigabytes of zero-filled tensor data.
MAX_METADATA_KEYS = 1 << 20
MAX_TENSORS = 1 << 24
MAX_ARRAY_LENGTH = 1 << 28
MODEL_INFO_CACHE_SIZE = 32

ModelFormat = Literal["gguf", "mlx"]

# Marks a value that is stored in llama.cpp's in-memory file type, never meant for files.
_FILE_TYPE_GUESSED_BIT = 1024

# Earlier on-disk formats that llama.cpp can no longer load, by their first four bytes.
_LEGACY_MAGICS = {b"lmgg": "GGML", b"fmgg": "GGMF", b"tjgg": "GGJT"}
_MAGIC_BYTES = struct.pack("<I", GGUF_MAGIC)

# A split model's shards are named <prefix>-00001-of-00003.gguf (llama.cpp's gguf-split).
SPLIT_SHARD_NAME = re.compile(r"^(?P<prefix>.*)-(?P<number>\d{5})-of-(?P<count>\d{5})\.gguf$", re.I)

# GGUF files that hold no language model: general.type values and architectures.
_NON_MODEL_TYPES = {"adapter": "a LoRA adapter", "mmproj": "a vision projector (mmproj)"}
_NON_MODEL_ARCHITECTURES = {"clip": "a vision projector (mmproj)"}

# llama.cpp's vocabulary types (llama_vocab_type), keyed by tokenizer.ggml.model.
VOCAB_TYPE_BY_TOKENIZER_MODEL = {
    "no_vocab": "NONE",
    "none": "NONE",
    "llama": "SPM",
    "bert": "WPM",
    "gpt2": "BPE",
    "hybriddna": "BPE",
    "whitespace": "BPE",
    "gemma4": "BPE",
    "t5": "UGM",
    "rwkv": "RWKV",
    "plamo2": "PLAMO2",
}

# llama.cpp's defaults when the file has no tokenizer.ggml.{bos,eos}_token_id or
# add_{bos,eos}_token key (llama_vocab::impl::load): (bos id, eos id, add bos, add eos).
_VOCAB_DEFAULTS: dict[str, tuple[int | None, int | None, bool, bool]] = {
    "SPM": (1, 2, True, False),
    "WPM": (101, None, True, False),
    "BPE": (11, 11, False, False),
    "UGM": (None, 1, False, True),
    "RWKV": (None, None, False, False),
    "PLAMO2": (1, 2, False, False),
    "NONE": (None, None, False, False),
}
# BPE pre-tokenizers for which llama.cpp adds a BOS token by default.
_BPE_PRE_ADDING_BOS = {
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "tekken",
    "chameleon",
}
# BPE pre-tokenizers for which llama.cpp has no default BOS token.
_BPE_PRE_WITHOUT_BOS = {"glm4", "chatglm-bpe"}

_SCALAR_FORMATS: dict[GGUFValueType, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("<B"),
    GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"),
    GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"),
    GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.FLOAT32: struct.Struct("<f"),
    GGUFValueType.BOOL: struct.Struct("<?"),
    GGUFValueType.UINT64: struct.Struct("<Q"),
    GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT64: struct.Struct("<d"),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# The one array SpecDeck decodes; every other array is skipped without decoding.
_TOKEN_LIST_KEY = "tokenizer.ggml.tokens"


@dataclass(frozen=True)
class VocabInfo:
    """A model's tokenizer as llama.cpp will see it (defaults applied where the file is silent)."""

    model_type: str
    size: int
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    fingerprint: str
    tokens: tuple[str, ...] = field(repr=False, compare=False)

    @property
    def vocab_type(self) -> str:
        """llama.cpp's vocabulary type ("SPM", "BPE", ...), or the raw model name if unknown."""
        return VOCAB_TYPE_BY_TOKENIZER_MODEL.get(self.model_type, self.model_type)


@dataclass(frozen=True)
class ModelInfo:
    """What the catalog and the compatibility check need to know about one GGUF model."""

    path: Path
    name: str
    architecture: str
    parameter_count: int
    quantization: str
    file_size: int
    context_length: int | None
    n_layers: int | None
    vocab: VocabInfo
    chat_template: str | None
    general_size_label: str | None = None  # general.size_label, as the model's authors state it
    kv_width: int | None = None  # K (and V) values per token per layer: kv heads × head size
    format: ModelFormat = "gguf"  # "mlx": an MLX model folder (path is the folder)

    @property
    def size_label(self) -> str:
        """The model's size the way its name says it: "135M", "1.5B", "7B".

        general.size_label wins when present: converters often store tied embeddings twice
        (token_embd and output), so the tensor sum of Qwen2.5-Coder-1.5B is 1.78e9, not 1.5e9.
        """
        return self.general_size_label or format_parameter_count(self.parameter_count)

    @property
    def display_name(self) -> str:
        """The name with its quantization, e.g. "Gemma 3 270m (Q4_K_M)"."""
        # Converters often append "GGUF" to general.name; every file here is GGUF.
        name = re.sub(r"[\s_-]+GGUF$", "", self.name, flags=re.I) or self.name
        return f"{name} ({self.quantization})"


class NotALanguageModelError(ModelFileError):
    """A valid GGUF file that holds something other than a language model (adapter, projector)."""


def format_parameter_count(count: int) -> str:
    """Write a parameter count with one significant unit: 134_515_008 -> "135M"."""
    for unit, scale in (("T", 10**12), ("B", 10**9)):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + unit
    for unit, scale in (("M", 10**6), ("K", 10**3)):
        if count >= scale:
            return f"{round(count / scale)}{unit}"
    return str(count)


def vocab_fingerprint(tokens: Iterable[str]) -> str:
    """A short SHA-256 over the token texts; equal vocabularies have equal fingerprints.

    Each text is hashed as an 8-byte little-endian length and its UTF-8 bytes, which is exactly
    how GGUF stores the token list, so a file's fingerprint is one hash over that region.
    """
    digest = hashlib.sha256()
    for text in tokens:
        encoded = text.encode("utf-8", "surrogateescape")
        digest.update(_U64.pack(len(encoded)))
        digest.update(encoded)
    return digest.hexdigest()[:FINGERPRINT_HEX_DIGITS]


def read_model_info(path: str | Path) -> ModelInfo:
    """Read a GGUF model's metadata; results are cached per (path, size, mtime).

    Raises ModelFileError (one line, naming the file) for a missing, unreadable, empty,
    non-GGUF, truncated or corrupt file, and NotALanguageModelError (a ModelFileError) for
    GGUF files that are adapters, vision projectors or later shards of a split model.
    """
    model_path = Path(path)
    try:
        stat = model_path.stat()
    except FileNotFoundError:
        if model_path.is_symlink():
            message = f"model link '{model_path}' is broken: its target does not exist"
        else:
            message = f"model file not found: '{model_path}'"
        raise ModelFileError(_one_line(message)) from None
    except OSError as error:
        raise ModelFileError(_os_error_message(model_path, error)) from None
    cache_key = (str(model_path.absolute()), stat.st_size, stat.st_mtime_ns)
    cached = _cache.get(cache_key)
    if cached is not None:
        return cached
    info = _read_model_info_uncached(model_path)
    return _cache.put(cache_key, info)


def read_tensors(path: str | Path) -> tuple[TensorInfo, ...]:
    """The tensors of a GGUF file (one file: a split model's shards are read one by one).

    Raises ModelFileError (one line) as :func:`read_model_info` does.
    """
    return _read_checked_header(Path(path), decode_tokens=False).tensors


def clear_model_info_cache() -> None:
    """Forget every cached ModelInfo (tests; or after files were rewritten in place)."""
    _cache.clear()


# --- reading -------------------------------------------------------------------------------


class _CorruptFile(Exception):
    """Raised inside the parser; read_model_info turns it into a ModelFileError."""


class _TruncatedHeader(_CorruptFile):
    """The file ends before its header does."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: its name, shape, type and where its data lies."""

    name: str
    element_count: int
    quant_type: GGMLQuantizationType
    end_offset: int  # absolute file offset one past the tensor's last byte
    shape: tuple[int, ...] = ()  # ggml's order: values per row first (ne0, ne1, ...)
    offset: int = 0  # absolute file offset of the tensor's first byte

    @property
    def nbytes(self) -> int:
        """The bytes of its data in the file."""
        return self.end_offset - self.offset


@dataclass(frozen=True)
class _Header:
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    token_list_fingerprint: str | None


def _read_model_info_uncached(path: Path) -> ModelInfo:
    header = _read_checked_header(path)
    metadata = header.metadata
    _reject_non_models(path, metadata)

    file_size = path.stat().st_size
    tensors = list(header.tensors)
    split_count = _int_or_none(metadata.get("split.count")) or 1
    if split_count > 1:
        for shard_path in _other_shard_paths(path, split_count):
            tensors.extend(_read_checked_header(shard_path, decode_tokens=False).tensors)
            file_size += shard_path.stat().st_size
    return _model_info(path, header, tensors, file_size)


class HeaderNeedsMoreBytes(ModelFileError):
    """The bytes given end inside the GGUF header: read more of the file."""


def model_info_from_header(header_bytes: bytes, path: Path, file_size: int) -> ModelInfo:
    """A GGUF model's metadata from the first bytes of its file (read over HTTP, say).

    ``path`` names the file in messages (and in the ModelInfo); ``file_size`` is the whole
    file's. A split model's parameter count is its first shard's. Raises
    HeaderNeedsMoreBytes where ``header_bytes`` end inside the header, and ModelFileError
    (one line) as :func:`read_model_info` does for what is not a language model.
    """
    _check_magic(path, header_bytes[: len(_MAGIC_BYTES)], file_size)
    with _parser_errors_named(path):
        try:
            header = _parse_header(header_bytes, decode_tokens=True)
        except _TruncatedHeader:
            raise HeaderNeedsMoreBytes(
                f"'{path}': the GGUF header goes on past its first "
                f"{_format_bytes(len(header_bytes))}"
            ) from None
    _reject_non_models(path, header.metadata)
    return _model_info(path, header, list(header.tensors), file_size)


def _model_info(
    path: Path, header: _Header, tensors: list[TensorInfo], file_size: int
) -> ModelInfo:
    """The ModelInfo of a parsed header and the tensors of every shard."""
    metadata = header.metadata
    architecture = _str_or_none(metadata.get("general.architecture"))
    if not architecture:
        raise ModelFileError(_corrupt(path, "it has no general.architecture key"))
    return ModelInfo(
        path=path,
        name=_str_or_none(metadata.get("general.name")) or path.stem,
        architecture=architecture,
        parameter_count=sum(tensor.element_count for tensor in tensors),
        quantization=_quantization_label(metadata, tensors),
        file_size=file_size,
        context_length=_int_or_none(metadata.get(f"{architecture}.context_length")),
        n_layers=_int_or_none(metadata.get(f"{architecture}.block_count")),
        vocab=_vocab_info(path, metadata, architecture, header.token_list_fingerprint),
        chat_template=_str_or_none(metadata.get("tokenizer.chat_template")),
        general_size_label=_str_or_none(metadata.get("general.size_label")) or None,
        kv_width=_kv_width(metadata, architecture),
    )


def _kv_width(metadata: dict[str, Any], architecture: str) -> int | None:
    """Values per token per layer in the K cache (the V cache holds as many), if stated."""
    embedding = _int_or_none(metadata.get(f"{architecture}.embedding_length"))
    heads = _int_or_none(metadata.get(f"{architecture}.attention.head_count"))
    kv_heads = _int_or_none(metadata.get(f"{architecture}.attention.head_count_kv")) or heads
    head_size = _int_or_none(metadata.get(f"{architecture}.attention.key_length"))
    if head_size is None and embedding and heads:
        head_size = embedding // heads
    if not kv_heads or not head_size:
        return None
    return kv_heads * head_size


def _read_checked_header(path: Path, decode_tokens: bool = True) -> _Header:
    """Parse the header and check that every tensor's data lies inside the file."""
    try:
        with path.open("rb") as file:
            file_size = os.fstat(file.fileno()).st_size
            first_bytes = file.read(len(_MAGIC_BYTES))
            _check_magic(path, first_bytes, file_size)
            with (
                _parser_errors_named(path),
                mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buffer,
            ):
                try:
                    header = _parse_header(buffer, decode_tokens)
                except _TruncatedHeader:
                    raise ModelFileError(
                        _one_line(
                            f"model file '{path}' is truncated: it ends inside the GGUF header "
                            f"after {_format_bytes(file_size)} (an incomplete download or copy?)"
                        )
                    ) from None
    except OSError as error:
        raise ModelFileError(_os_error_message(path, error)) from None

    needed = max((tensor.end_offset for tensor in header.tensors), default=0)
    if needed > file_size:
        raise ModelFileError(
            _one_line(
                f"model file '{path}' is truncated: it has {_format_bytes(file_size)} but its "
                f"tensors need {_format_bytes(needed)} (an incomplete download or copy?)"
            )
        )
    return header


@contextlib.contextmanager
def _parser_errors_named(path: Path) -> Iterator[None]:
    """The header parser's errors as one ModelFileError line naming ``path``.

    The parser checks bounds itself; the built-in errors are the net that keeps the promise
    of "only ModelFileError" should a malformed file slip past those checks.
    """
    try:
        yield
    except _CorruptFile as error:
        raise ModelFileError(_corrupt(path, str(error))) from None
    except (struct.error, ValueError, IndexError, OverflowError, MemoryError) as error:
        raise ModelFileError(_corrupt(path, f"{type(error).__name__}: {error}")) from None


def _check_magic(path: Path, first_bytes: bytes, file_size: int) -> None:
    if file_size == 0:
        raise ModelFileError(_one_line(f"model file '{path}' is empty (0 bytes), not a GGUF model"))
    if first_bytes == _MAGIC_BYTES:
        return
    if first_bytes in _LEGACY_MAGICS:
        old_format = _LEGACY_MAGICS[first_bytes]
        raise ModelFileError(
            _one_line(
                f"model file '{path}' uses {old_format}, the format before GGUF; "
                "llama.cpp needs it converted to GGUF"
            )
        )
    raise ModelFileError(
        _one_line(
            f"'{path}' is not a GGUF model file (it starts with {first_bytes!r}, not b'GGUF')"
        )
    )


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buffer: mmap.mmap | bytes) -> None:
        self.buffer = buffer
        self.size = len(buffer)
        self.position = 0

    def take(self, length: int) -> int:
        """Advance over length bytes and return where they start."""
        start = self.position
        end = start + length
        if length < 0 or end > self.size:
            raise _TruncatedHeader
        self.position = end
        return start

    def unpack(self, fmt: struct.Struct) -> Any:
        return fmt.unpack_from(self.buffer, self.take(fmt.size))[0]

    def u32(self) -> int:
        value: int = self.unpack(_U32)
        return value

    def u64(self) -> int:
        value: int = self.unpack(_U64)
        return value

    def raw_string(self) -> bytes:
        length = self.u64()
        start = self.take(length)
        return self.buffer[start : start + length]

    def string(self) -> str:
        return self.raw_string().decode("utf-8", "replace")


def _parse_header(buffer: mmap.mmap | bytes, decode_tokens: bool) -> _Header:
    cursor = _Cursor(buffer)
    cursor.take(len(_MAGIC_BYTES))
    version = cursor.u32()
    if version not in SUPPORTED_GGUF_VERSIONS:
        hint = " (a big-endian file?)" if version > 0xFFFF else ""
        raise _CorruptFile(f"GGUF version {version} is not supported{hint}")
    tensor_count = cursor.u64()
    kv_count = cursor.u64()
    if tensor_count > MAX_TENSORS or kv_count > MAX_METADATA_KEYS:
        raise _CorruptFile(f"it claims {tensor_count} tensors and {kv_count} metadata keys")

    metadata: dict[str, Any] = {}
    token_list_fingerprint: str | None = None
    for _ in range(kv_count):
        key = cursor.string()
        value_type = _value_type(cursor.u32(), key)
        if value_type != GGUFValueType.ARRAY:
            metadata[key] = _read_scalar(cursor, value_type, key)
            continue
        element_type = _value_type(cursor.u32(), key)
        count = _array_length(cursor, key)
        if key == _TOKEN_LIST_KEY and element_type == GGUFValueType.STRING and decode_tokens:
            start = cursor.position
            metadata[key] = _read_token_texts(cursor, count)
            region = buffer[start : cursor.position]
            token_list_fingerprint = hashlib.sha256(region).hexdigest()[:FINGERPRINT_HEX_DIGITS]
        else:
            _skip_array(cursor, element_type, count, key)

    tensors: list[tuple[str, tuple[int, ...], GGMLQuantizationType, int, int]] = []
    for _ in range(tensor_count):
        name = cursor.string()
        n_dims = cursor.u32()
        if n_dims > GGML_MAX_DIMS:
            raise _CorruptFile(f"tensor '{name}' has {n_dims} dimensions (at most 4 are allowed)")
        shape = tuple(cursor.u64() for _ in range(n_dims))
        element_count = math.prod(shape)
        quant_type = _quant_type(cursor.u32(), name)
        offset = cursor.u64()
        block_size, type_size = GGML_QUANT_SIZES[quant_type]
        if element_count % block_size:
            raise _CorruptFile(f"tensor '{name}' does not fill whole {quant_type.name} blocks")
        tensors.append((name, shape, quant_type, offset, element_count // block_size * type_size))

    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if _int_or_none(alignment) is None or alignment <= 0 or alignment & (alignment - 1):
        raise _CorruptFile(f"general.alignment is {alignment!r}, not a power of two")
    data_offset = -(-cursor.position // alignment) * alignment
    return _Header(
        metadata=metadata,
        tensors=tuple(
            TensorInfo(
                name,
                math.prod(shape),
                quant_type,
                data_offset + offset + nbytes,
                shape,
                data_offset + offset,
            )
            for name, shape, quant_type, offset, nbytes in tensors
        ),
        token_list_fingerprint=token_list_fingerprint,
    )


def _value_type(code: int, key: str) -> GGUFValueType:
    try:
        return GGUFValueType(code)
    except ValueError:
        raise _CorruptFile(f"unknown metadata value type {code} for key '{key}'") from None


def _quant_type(code: int, tensor_name: str) -> GGMLQuantizationType:
    try:
        quant_type = GGMLQuantizationType(code)
    except ValueError:
        quant_type = None
    if quant_type is None or quant_type not in GGML_QUANT_SIZES:
        raise _CorruptFile(f"tensor '{tensor_name}' has unknown type {code}")
    return quant_type


def _array_length(cursor: _Cursor, key: str) -> int:
    length = cursor.u64()
    if length > MAX_ARRAY_LENGTH:
        raise _CorruptFile(f"key '{key}' claims an array of {length} values")
    return length


def _read_scalar(cursor: _Cursor, value_type: GGUFValueType, key: str) -> Any:
    if value_type == GGUFValueType.STRING:
        return cursor.string()
    scalar_format = _SCALAR_FORMATS.get(value_type)
    if scalar_format is None:
        raise _CorruptFile(f"key '{key}' has a value of type {value_type.name}")
    return cursor.unpack(scalar_format)


def _skip_array(cursor: _Cursor, element_type: GGUFValueType, count: int, key: str) -> None:
    if element_type == GGUFValueType.STRING:
        for _ in range(count):
            cursor.take(cursor.u64())
    elif element_type == GGUFValueType.ARRAY:
        for _ in range(count):
            inner_type = _value_type(cursor.u32(), key)
            _skip_array(cursor, inner_type, _array_length(cursor, key), key)
    else:
        scalar_format = _SCALAR_FORMATS[element_type]
        cursor.take(scalar_format.size * count)


def _read_token_texts(cursor: _Cursor, count: int) -> tuple[str, ...]:
    # The hot loop of a header read (150k-260k tokens): locals instead of attribute lookups.
    buffer, size, position = cursor.buffer, cursor.size, cursor.position
    unpack_length = _U64.unpack_from
    texts: list[str] = []
    append = texts.append
    for _ in range(count):
        if position + 8 > size:
            raise _TruncatedHeader
        (length,) = unpack_length(buffer, position)
        start = position + 8
        position = start + length
        if position > size:
            raise _TruncatedHeader
        # surrogateescape keeps invalid UTF-8 byte-exact, so text equality is byte equality.
        append(buffer[start:position].decode("utf-8", "surrogateescape"))
    cursor.position = position
    return tuple(texts)


def _other_shard_paths(first_shard: Path, split_count: int) -> list[Path]:
    match = SPLIT_SHARD_NAME.match(first_shard.name)
    if match is None or int(match["number"]) != 1:
        raise ModelFileError(
            _one_line(
                f"model file '{first_shard}' is part of a {split_count}-part split model, but its "
                "name does not end in -00001-of-NNNNN.gguf, so the other parts cannot be found"
            )
        )
    shards = []
    for number in range(2, split_count + 1):
        shard = first_shard.with_name(
            f"{match['prefix']}-{number:05d}-of-{split_count:05d}{first_shard.suffix}"
        )
        if not shard.is_file():
            raise ModelFileError(
                _one_line(
                    f"model file '{first_shard}' is part 1 of a {split_count}-part split model, "
                    f"but part {number} ('{shard.name}') is missing"
                )
            )
        shards.append(shard)
    return shards


def _reject_non_models(path: Path, metadata: dict[str, Any]) -> None:
    split_number = _int_or_none(metadata.get("split.no")) or 0
    if split_number > 0:
        split_count = _int_or_none(metadata.get("split.count"))
        raise NotALanguageModelError(
            _one_line(
                f"'{path}' is part {split_number + 1} of {split_count} of a split model; "
                "open part 1 instead"
            )
        )
    general_type = _str_or_none(metadata.get("general.type")) or ""
    architecture = _str_or_none(metadata.get("general.architecture")) or ""
    what = _NON_MODEL_TYPES.get(general_type) or _NON_MODEL_ARCHITECTURES.get(architecture)
    if what is None and "tokenizer.ggml.model" not in metadata:
        what = "a GGUF file without a tokenizer"
    if what is not None:
        raise NotALanguageModelError(_one_line(f"'{path}' is {what}, not a language model"))


def _vocab_info(
    path: Path, metadata: dict[str, Any], architecture: str, fingerprint: str | None
) -> VocabInfo:
    model_type = _str_or_none(metadata.get("tokenizer.ggml.model")) or ""
    pre_tokenizer = _str_or_none(metadata.get("tokenizer.ggml.pre")) or ""
    vocab_type = VOCAB_TYPE_BY_TOKENIZER_MODEL.get(model_type)

    tokens: tuple[str, ...] = metadata.get(_TOKEN_LIST_KEY, ())
    if vocab_type == "NONE":
        size = _int_or_none(metadata.get(f"{architecture}.vocab_size")) or 0
    elif not tokens:
        raise ModelFileError(_corrupt(path, f"it has no {_TOKEN_LIST_KEY} list"))
    else:
        size = len(tokens)

    bos_id, eos_id, add_bos, add_eos = _VOCAB_DEFAULTS.get(
        vocab_type or "", (None, None, False, False)
    )
    if vocab_type == "BPE":
        add_bos = pre_tokenizer in _BPE_PRE_ADDING_BOS
        if pre_tokenizer in _BPE_PRE_WITHOUT_BOS:
            bos_id = None
    if vocab_type != "NONE":
        # llama.cpp drops defaults outside the vocabulary, and ignores out-of-range ids in the file.
        bos_id = _special_token_id(metadata.get("tokenizer.ggml.bos_token_id"), bos_id, size)
        eos_id = _special_token_id(metadata.get("tokenizer.ggml.eos_token_id"), eos_id, size)
        add_bos = _bool_or(metadata.get("tokenizer.ggml.add_bos_token"), add_bos)
        add_eos = _bool_or(metadata.get("tokenizer.ggml.add_eos_token"), add_eos)
        if pre_tokenizer == "gemma4" or model_type == "gemma4":
            add_bos = True  # llama.cpp forces this for Gemma 4 (ggml-org/llama.cpp#21500)

    return VocabInfo(
        model_type=model_type,
        size=size,
        bos_id=bos_id,
        eos_id=eos_id,
        add_bos=add_bos,
        add_eos=add_eos,
        fingerprint=fingerprint or vocab_fingerprint(tokens),
        tokens=tokens,
    )


def _special_token_id(stored: Any, default: int | None, vocab_size: int) -> int | None:
    if default is not None and default >= vocab_size:
        default = None
    stored_id = _int_or_none(stored)
    if stored_id is None or not 0 <= stored_id < vocab_size:
        return default
    return stored_id


def _quantization_label(metadata: dict[str, Any], tensors: list[TensorInfo]) -> str:
    file_type = _int_or_none(metadata.get("general.file_type"))
    if file_type is not None:
        try:
            name = LlamaFileType(file_type & ~_FILE_TYPE_GUESSED_BIT).name
        except ValueError:
            name = None
        if name == "ALL_F32":
            return "F32"
        if name is not None and name != "GUESSED":
            return name.removeprefix("MOSTLY_")
    # No (known) file type: name the tensor type that holds most of the weights.
    elements_by_type: Counter[str] = Counter()
    for tensor in tensors:
        elements_by_type[tensor.quant_type.name] += tensor.element_count
    most_common = elements_by_type.most_common(1)
    return most_common[0][0] if most_common else "unknown"


# --- small helpers -------------------------------------------------------------------------


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _bool_or(value: Any, default: bool) -> bool:
    return value if isinstance(value, bool) else default


def _corrupt(path: Path, problem: str) -> str:
    return _one_line(f"model file '{path}' is corrupt: {problem}")


def _os_error_message(path: Path, error: OSError) -> str:
    if isinstance(error, FileNotFoundError):
        return _one_line(f"model file not found: '{path}'")
    if isinstance(error, IsADirectoryError) or path.is_dir():
        return _one_line(f"'{path}' is a folder, not a GGUF model file")
    if isinstance(error, PermissionError):
        return _one_line(f"cannot read model file '{path}': permission denied")
    reason = error.strerror or str(error)
    return _one_line(f"cannot read model file '{path}': {reason}")


def _one_line(message: str) -> str:
    """Messages reach the user on one line, even for paths or keys with line breaks."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _format_bytes(count: int) -> str:
    if count >= 10**9:
        return f"{count / 10**9:.2f} GB"
    if count >= 10**6:
        return f"{count / 10**6:.1f} MB"
    return f"{count} bytes"


# --- cache ---------------------------------------------------------------------------------


class _ModelInfoCache:
    """A small thread-safe LRU that also shares one token tuple among equal vocabularies."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[tuple[str, int, int], ModelInfo] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int, int]) -> ModelInfo | None:
        with self._lock:
            info = self._entries.get(key)
            if info is not None:
                self._entries.move_to_end(key)
            return info

    def put(self, key: tuple[str, int, int], info: ModelInfo) -> ModelInfo:
        with self._lock:
            # Several quantizations of one model carry the same 150k+ token texts: keep one copy.
            for other in self._entries.values():
                if other.vocab.fingerprint == info.vocab.fingerprint:
                    if other.vocab.tokens == info.vocab.tokens:
                        info = replace(info, vocab=replace(info.vocab, tokens=other.vocab.tokens))
                    break
            self._entries[key] = info
            self._entries.move_to_end(key)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
            return info

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_cache = _ModelInfoCache(MODEL_INFO_CACHE_SIZE)
