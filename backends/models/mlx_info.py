"""MLX model folders read without their weights: config.json, safetensors headers, tokenizer.

:func:`read_mlx_model_info` gives an MLX folder the same :class:`ModelInfo` a GGUF file
gets (name, size, layers, context, vocabulary fingerprint, chat template), so that the
catalog lists both alike and the compatibility check pairs them.
"""

from __future__ import annotations

import json
import os
import re
import struct
import threading
from pathlib import Path
from typing import Any

from backends.errors import ModelFileError
from backends.models.gguf_info import (
    ModelInfo,
    NotALanguageModelError,
    VocabInfo,
    format_parameter_count,
    vocab_fingerprint,
)

MLX_CONFIG_FILE = "config.json"
MLX_TOKENIZER_FILE = "tokenizer.json"
MLX_TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SAFETENSORS_SUFFIX = ".safetensors"
MLX_IMPORT_KEY = "specdeck_import"  # config.json key written by backends.models.gguf_to_mlx
_SAFETENSORS_HEADER_LENGTH = struct.Struct("<Q")
_SAFETENSORS_MAX_HEADER = 100 << 20
_BITS_PER_PACKED_WORD = 32
# Bytes per element of the safetensors dtypes (U32 words of quantized weights pack several).
_SAFETENSORS_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
    "I16": 2, "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}  # fmt: skip
# Converters append the format to repository names ("...-MLX-4bit", "...-GGUF").
_FORMAT_SUFFIX = re.compile(r"[\s_-]+(GGUF|MLX)$", re.I)

# Where LM Studio keeps downloads: the current default, then the pre-0.3 one.


def read_mlx_model_info(folder: str | Path) -> ModelInfo:
    """Read an MLX model folder (config.json, *.safetensors, tokenizer.json) without its weights.

    The vocabulary is read from tokenizer.json and padded to the model's vocab_size with
    llama.cpp's "[PADn]" names, so that the fingerprint and the compatibility check treat a
    folder and a GGUF file of the same tokenizer alike. Raises ModelFileError (one line) for
    a missing folder, a missing config/weights/tokenizer, or corrupt files;
    NotALanguageModelError when config.json describes something other than a language model.
    """
    folder_path = Path(folder)
    if not folder_path.exists():
        raise ModelFileError(_one_line(f"MLX model folder not found: '{folder_path}'"))
    if not folder_path.is_dir():
        raise ModelFileError(_one_line(f"'{folder_path}' is not an MLX model folder"))
    config_path = folder_path / MLX_CONFIG_FILE
    weights = sorted(folder_path.glob(f"*{SAFETENSORS_SUFFIX}"))
    tokenizer_path = folder_path / MLX_TOKENIZER_FILE
    for needed, what in (
        (config_path.is_file(), "config.json"),
        (bool(weights), "*.safetensors weights"),
        (tokenizer_path.is_file(), "tokenizer (tokenizer.json)"),
    ):
        if not needed:
            raise ModelFileError(
                _one_line(f"'{folder_path}' is not a complete MLX model folder: it has no {what}")
            )
    try:
        stamps = tuple(
            (p.name, p.stat().st_size, p.stat().st_mtime_ns)
            for p in (config_path, tokenizer_path, *weights)
        )
    except OSError as error:
        raise ModelFileError(_one_line(f"cannot read '{folder_path}': {error}")) from None
    key = (str(folder_path.absolute()), stamps)
    with _mlx_cache_lock:
        cached = _mlx_info_cache.get(key)
    if cached is not None:
        return cached
    info = _read_mlx_model_info_uncached(folder_path, config_path, tokenizer_path, weights)
    with _mlx_cache_lock:
        if len(_mlx_info_cache) >= _MLX_INFO_CACHE_SIZE:
            _mlx_info_cache.pop(next(iter(_mlx_info_cache)))
        _mlx_info_cache[key] = info
    return info


_MLX_INFO_CACHE_SIZE = 16
_mlx_info_cache: dict[tuple[str, tuple[tuple[str, int, int], ...]], ModelInfo] = {}
_mlx_cache_lock = threading.Lock()


def _read_mlx_model_info_uncached(
    folder: Path, config_path: Path, tokenizer_path: Path, weights: list[Path]
) -> ModelInfo:
    config = _read_json(config_path)
    text_config = config.get("text_config")
    settings = {**text_config, **config} if isinstance(text_config, dict) else config
    model_type = settings.get("model_type")
    architectures = settings.get("architectures") or []
    if not isinstance(model_type, str) or (
        architectures
        and not any(
            marker in str(name)
            for name in architectures
            for marker in ("CausalLM", "LMHeadModel", "ConditionalGeneration")
        )
    ):
        raise NotALanguageModelError(
            _one_line(f"'{folder}' holds no language model (config.json: {architectures})")
        )
    parameter_count, dtypes, file_size = _safetensors_summary(weights, config)
    tokenizer = _read_json(tokenizer_path)
    tokenizer_config_path = folder / MLX_TOKENIZER_CONFIG_FILE
    tokenizer_config = _read_json(tokenizer_config_path) if tokenizer_config_path.is_file() else {}
    imported = config.get(MLX_IMPORT_KEY)
    imported_name = imported.get("name") if isinstance(imported, dict) else None
    head_count = _positive_int(settings.get("num_attention_heads"))
    kv_heads = _positive_int(settings.get("num_key_value_heads")) or head_count
    hidden = _positive_int(settings.get("hidden_size"))
    head_dim = _positive_int(settings.get("head_dim"))
    if head_dim is None and hidden and head_count:
        head_dim = hidden // head_count
    return ModelInfo(
        path=folder,
        name=imported_name if isinstance(imported_name, str) else _mlx_folder_name(folder),
        architecture=model_type,
        parameter_count=parameter_count,
        quantization=_mlx_quantization_label(config, dtypes),
        file_size=file_size,
        context_length=_positive_int(settings.get("max_position_embeddings")),
        n_layers=_positive_int(settings.get("num_hidden_layers")),
        vocab=_mlx_vocab_info(
            folder, tokenizer, tokenizer_config, _positive_int(settings.get("vocab_size"))
        ),
        chat_template=_mlx_chat_template(folder, tokenizer_config),
        general_size_label=format_parameter_count(parameter_count),
        kv_width=kv_heads * head_dim if kv_heads and head_dim else None,
        format="mlx",
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ModelFileError(_one_line(f"cannot read '{path}': {error.strerror}")) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelFileError(_one_line(f"'{path}' is corrupt: not valid JSON ({error})")) from None
    if not isinstance(data, dict):
        raise ModelFileError(_one_line(f"'{path}' is corrupt: not a JSON object"))
    return data


def safetensors_header(path: Path) -> dict[str, Any]:
    """A safetensors file's header, checked against the file's size (ModelFileError if corrupt)."""
    try:
        with path.open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            prefix = file.read(_SAFETENSORS_HEADER_LENGTH.size)
            if len(prefix) < _SAFETENSORS_HEADER_LENGTH.size:
                raise ModelFileError(_one_line(f"weights file '{path}' is truncated or empty"))
            (length,) = _SAFETENSORS_HEADER_LENGTH.unpack(prefix)
            if length > min(_SAFETENSORS_MAX_HEADER, size - len(prefix)):
                raise ModelFileError(
                    _one_line(f"weights file '{path}' is corrupt: not a safetensors file")
                )
            header = json.loads(file.read(length))
    except OSError as error:
        raise ModelFileError(_one_line(f"cannot read '{path}': {error.strerror}")) from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelFileError(
            _one_line(f"weights file '{path}' is corrupt: its safetensors header is not JSON")
        ) from None
    if not isinstance(header, dict):
        raise ModelFileError(_one_line(f"weights file '{path}' is corrupt: bad header"))
    data_size = size - _SAFETENSORS_HEADER_LENGTH.size - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not isinstance(offsets, list) or len(offsets) != 2 or offsets[1] > data_size:
            raise ModelFileError(
                _one_line(
                    f"weights file '{path}' is truncated or corrupt: tensor '{name}' lies "
                    "outside the file (an incomplete download or copy?)"
                )
            )
    return header


def _safetensors_summary(
    weights: list[Path], config: dict[str, Any]
) -> tuple[int, dict[str, int], int]:
    """(parameter count, bytes by dtype, total file size) of the weight files."""
    tensors: dict[str, dict[str, Any]] = {}
    file_size = 0
    for path in weights:
        header = safetensors_header(path)
        file_size += path.stat().st_size
        tensors.update({k: v for k, v in header.items() if k != "__metadata__"})
    quantization = config.get("quantization")
    bits = quantization.get("bits") if isinstance(quantization, dict) else None
    values_per_word = _BITS_PER_PACKED_WORD // bits if isinstance(bits, int) and bits > 0 else 1
    count = 0
    dtypes: dict[str, int] = {}
    for name, entry in tensors.items():
        stem, _, kind = name.rpartition(".")
        quantized = f"{stem}.scales" in tensors
        if quantized and kind in ("scales", "biases"):
            continue  # quantization parameters, not model parameters
        elements = 1
        for n in entry.get("shape", []):
            elements *= int(n)
        dtype = str(entry.get("dtype", ""))
        dtypes[dtype] = dtypes.get(dtype, 0) + elements * _SAFETENSORS_DTYPE_BYTES.get(dtype, 1)
        count += elements * values_per_word if quantized and dtype == "U32" else elements
    return count, dtypes, file_size


def _mlx_quantization_label(config: dict[str, Any], dtypes: dict[str, int]) -> str:
    quantization = config.get("quantization")
    if isinstance(quantization, dict) and "bits" in quantization:
        mode = quantization.get("mode", "affine")
        return f"MLX {quantization['bits']}-bit" if mode == "affine" else f"MLX {mode}"
    return max(dtypes, key=lambda dtype: dtypes[dtype]) if dtypes else "unknown"


def _mlx_folder_name(folder: Path) -> str:
    # A Hugging Face cache snapshot: .../models--org--name/snapshots/<revision>
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.split("--")[-1]
    return _FORMAT_SUFFIX.sub("", folder.name) or folder.name


def _special_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _mlx_vocab_info(
    folder: Path,
    tokenizer: dict[str, Any],
    tokenizer_config: dict[str, Any],
    model_vocab_size: int | None,
) -> VocabInfo:
    model = tokenizer.get("model")
    if not isinstance(model, dict):
        raise ModelFileError(_one_line(f"'{folder / MLX_TOKENIZER_FILE}' has no tokenizer model"))
    ids: dict[str, int] = {}
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        ids.update({str(text): int(i) for text, i in vocab.items()})
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        ids.update({str(entry[0]): i for i, entry in enumerate(vocab)})
    for added in tokenizer.get("added_tokens") or []:
        if isinstance(added, dict) and "content" in added and "id" in added:
            ids[str(added["content"])] = int(added["id"])
    size = max([*ids.values(), -1]) + 1
    if model_vocab_size is not None:
        size = max(size, model_vocab_size)
    tokens = [""] * size
    filled = [False] * size
    for text, index in ids.items():
        if 0 <= index < size:
            tokens[index] = text
            filled[index] = True
    for index in range(size):
        if not filled[index]:
            tokens[index] = f"[PAD{index}]"  # llama.cpp's converter names the gaps so
    model_type = _gguf_tokenizer_model(tokenizer)

    def token_id(key: str) -> int | None:
        text = _special_text(tokenizer_config.get(key))
        return ids.get(text) if text is not None else None

    add_bos = tokenizer_config.get("add_bos_token")
    if not isinstance(add_bos, bool):
        add_bos = _post_processor_adds(tokenizer, _special_text(tokenizer_config.get("bos_token")))
    add_eos = tokenizer_config.get("add_eos_token")
    return VocabInfo(
        model_type=model_type,
        size=size,
        bos_id=token_id("bos_token"),
        eos_id=token_id("eos_token"),
        add_bos=add_bos,
        add_eos=add_eos if isinstance(add_eos, bool) else False,
        fingerprint=vocab_fingerprint(tokens),
        tokens=tuple(tokens),
    )


def _gguf_tokenizer_model(tokenizer: dict[str, Any]) -> str:
    """The tokenizer.ggml.model name llama.cpp's converter would give this tokenizer."""
    model = tokenizer.get("model") or {}
    kind = model.get("type")
    if kind == "BPE":
        return "llama" if model.get("byte_fallback") else "gpt2"
    return {"Unigram": "t5", "WordPiece": "bert"}.get(str(kind), str(kind or "").lower())


def _post_processor_adds(tokenizer: dict[str, Any], bos_text: str | None) -> bool:
    if bos_text is None:
        return False
    return bos_text in json.dumps(tokenizer.get("post_processor") or {})


def _mlx_chat_template(folder: Path, tokenizer_config: dict[str, Any]) -> str | None:
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    if isinstance(template, str):
        return template
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    json_file = folder / "chat_template.json"
    if json_file.is_file():
        value = _read_json(json_file).get("chat_template")
        return value if isinstance(value, str) else None
    return None


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _one_line(message: str) -> str:
    return message.replace("\r", "\\r").replace("\n", "\\n")
