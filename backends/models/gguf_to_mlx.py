"""Import a GGUF model into an MLX model folder: dequantize, write an HF-style folder, quantize.

``mx.load`` reads GGUF but dequantizes K-quants wrongly and fails on Q5_0, so every tensor
goes through the ``gguf`` package's reference dequantizer instead. The weights are renamed
to Hugging Face's names (undoing the Q/K row permutation llama.cpp's converter applies to
llama-architecture models), the tokenizer is rebuilt from the GGUF vocabulary and merges
with ``tokenizers``, and ``mlx_lm.convert`` quantizes the result for MLX (4-bit, groups of
64 by default). Imported folders go to ``models_dir()/mlx/<name>``, where the catalog finds
them.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.engines.interface import DEFAULT_CONTEXT_SIZE
from backends.errors import ModelFileError, SettingsError
from backends.models.gguf_info import read_model_info
from backends.models.mlx_info import MLX_IMPORT_KEY
from backends.paths import models_dir

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy.typing as npt

log = logging.getLogger(__name__)

MLX_SUBFOLDER = "mlx"
DEFAULT_BITS = 4
DEFAULT_GROUP_SIZE = 64
STAGING_PREFIX = ".importing-"  # hidden: the catalog skips folders being written
SUPPORTED_ARCHITECTURES = ("qwen2", "llama")

# Share of the progress bar each stage takes (dequantizing dominates).
_DEQUANTIZE_SHARE = 0.7
_TOKENIZER_SHARE = 0.05

# GGUF token types (llama.cpp's llama_token_type)
_TOKEN_CONTROL = 3
_TOKEN_USER_DEFINED = 4
_TOKEN_UNUSED = 5

# Pre-tokenizer split patterns by tokenizer.ggml.pre, as in the models' own tokenizer.json.
_QWEN2_PATTERN = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_PATTERNS = {
    "qwen2": _QWEN2_PATTERN,
    "deepseek-r1-qwen": _QWEN2_PATTERN,
    "llama3": _LLAMA3_PATTERN,
    "llama-bpe": _LLAMA3_PATTERN,
    "llama-v3": _LLAMA3_PATTERN,
}
_DIGIT_SPLITTING = {"smollm", "starcoder"}  # Digits(individual) + GPT-2's byte-level regex
_GPT2_LIKE = {"gpt2", "default", ""}

# GGUF tensor names (after "blk.N.") to Hugging Face's names (after "model.layers.N.").
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAME = re.compile(r"^blk\.(?P<layer>\d+)\.(?P<tensor>[a-z_]+)\.(?P<kind>weight|bias)$")
_GLOBAL_NAME = re.compile(r"^(?P<tensor>[a-z_]+)\.(?P<kind>weight|bias)$")


@dataclass(frozen=True)
class ImportProgress:
    """Where an import stands: stage name, overall fraction 0..1 and a short message."""

    stage: str  # "reading", "dequantizing", "tokenizer", "quantizing", "done"
    fraction: float
    message: str = ""


def _remove_abandoned_imports(target: Path) -> None:
    """Delete staging folders of ``target`` left by imports whose process is gone."""
    import psutil

    for staging in target.parent.glob(f"{STAGING_PREFIX}{target.name}.*"):
        owner = staging.name.rsplit(".", 1)[-1]
        if owner.isdigit() and not psutil.pid_exists(int(owner)):
            log.info("removing %s, left by an interrupted import", staging)
            shutil.rmtree(staging, ignore_errors=True)


def mlx_folder_for(gguf_path: Path, models_folder: Path | None = None) -> Path:
    """Where the MLX import of ``gguf_path`` goes: ``<models dir>/mlx/<GGUF file stem>``."""
    return (models_folder or models_dir()) / MLX_SUBFOLDER / gguf_path.stem


def import_gguf(
    gguf_path: str | Path,
    out_dir: str | Path | None = None,
    *,
    progress: Callable[[ImportProgress], None] | None = None,
    bits: int = DEFAULT_BITS,
    group_size: int = DEFAULT_GROUP_SIZE,
    overwrite: bool = False,
) -> Path:
    """Convert a GGUF model into an MLX model folder; return the folder.

    The folder is assembled under a hidden staging name next to ``out_dir`` and renamed
    into place at the end, so an interrupted import never looks like a model.
    """
    source = Path(gguf_path)
    info = read_model_info(source)  # one-line errors for missing or corrupt files
    if info.architecture not in SUPPORTED_ARCHITECTURES:
        raise SettingsError(
            f"cannot import {source.name} into MLX: architecture '{info.architecture}' is not "
            f"supported yet (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    target = Path(out_dir) if out_dir is not None else mlx_folder_for(source)
    if target.exists():
        if not overwrite:
            raise SettingsError(f"'{target}' exists already; remove it or choose another --out")
        shutil.rmtree(target)
    report = progress or (lambda _event: None)
    _remove_abandoned_imports(target)
    # One staging folder per process: two imports of one model (the window and a bench
    # run, say) must not write into each other's files.
    staging = target.parent / f"{STAGING_PREFIX}{target.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    hf_folder, mlx_folder = staging / "hf", staging / "mlx"
    hf_folder.mkdir(parents=True)
    started = time.perf_counter()
    try:
        report(ImportProgress("reading", 0.0, f"reading {source.name}"))
        from gguf import GGUFReader

        reader = GGUFReader(source)
        metadata = _metadata(reader)
        config = _hf_config(info.architecture, metadata, reader)
        config[MLX_IMPORT_KEY] = {
            "source": source.name,
            "name": info.name,
            "gguf_quantization": info.quantization,
        }
        _write_weights(reader, info.architecture, config, hf_folder, report)
        report(ImportProgress("tokenizer", _DEQUANTIZE_SHARE, "building the tokenizer"))
        _write_tokenizer(metadata, hf_folder)
        (hf_folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        del reader
        report(
            ImportProgress(
                "quantizing",
                _DEQUANTIZE_SHARE + _TOKENIZER_SHARE,
                f"quantizing for MLX ({bits}-bit, groups of {group_size})",
            )
        )
        from mlx_lm.convert import convert

        with contextlib.redirect_stdout(io.StringIO()):
            convert(
                str(hf_folder),
                str(mlx_folder),
                quantize=True,
                q_group_size=group_size,
                q_bits=bits,
            )
        # mlx-lm re-saves the tokenizer through transformers; keep ours, byte for byte.
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(hf_folder / name, mlx_folder / name)
        try:
            mlx_folder.rename(target)
        except OSError:
            if not target.is_dir():
                raise
            log.info("%s was imported meanwhile by another process; keeping that one", target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    seconds = time.perf_counter() - started
    report(ImportProgress("done", 1.0, f"imported in {seconds:.0f} s"))
    log.info("imported %s into %s in %.1f s", source.name, target, seconds)
    return target


# -- metadata and config -----------------------------------------------------------------------


def _metadata(reader: Any) -> dict[str, Any]:
    """Every metadata value except the token arrays, which are read on demand."""
    values: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        values[key] = field
    return values


def _value(metadata: dict[str, Any], key: str, default: Any = None) -> Any:
    field = metadata.get(key)
    return default if field is None else field.contents()


def _hf_config(architecture: str, metadata: dict[str, Any], reader: Any) -> dict[str, Any]:
    def arch(key: str, default: Any = None) -> Any:
        return _value(metadata, f"{architecture}.{key}", default)

    tensor_names = {tensor.name for tensor in reader.tensors}
    if "rope_freqs.weight" in tensor_names:
        raise SettingsError("cannot import: models with RoPE frequency factors are not supported")
    embedding = next(t for t in reader.tensors if t.name == "token_embd.weight")
    heads = int(arch("attention.head_count"))
    hidden = int(arch("embedding_length"))
    config: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if architecture == "qwen2" else "LlamaForCausalLM"],
        "model_type": architecture,
        "hidden_size": hidden,
        "num_hidden_layers": int(arch("block_count")),
        "intermediate_size": int(arch("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(arch("attention.head_count_kv", heads)),
        "rms_norm_eps": float(arch("attention.layer_norm_rms_epsilon", 1e-6)),
        "vocab_size": int(embedding.shape[-1]),
        "max_position_embeddings": int(arch("context_length", DEFAULT_CONTEXT_SIZE)),
        "rope_theta": float(arch("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "torch_dtype": "bfloat16",
    }
    head_dim = arch("attention.key_length")
    if head_dim is not None and int(head_dim) != hidden // heads:
        config["head_dim"] = int(head_dim)
    if architecture == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
        config["mlp_bias"] = "blk.0.ffn_up.bias" in tensor_names
    for key, gguf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        value = _value(metadata, f"tokenizer.ggml.{gguf_key}")
        if value is not None:
            config[key] = int(value)
    return config


# -- weights ---------------------------------------------------------------------------------


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor (None for tensors an HF model does not have)."""
    match = _LAYER_NAME.match(gguf_name)
    if match is not None:
        mapped = _LAYER_TENSORS.get(match["tensor"])
        if mapped is None:
            return None
        return f"model.layers.{match['layer']}.{mapped}.{match['kind']}"
    match = _GLOBAL_NAME.match(gguf_name)
    if match is not None and match["tensor"] in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[match['tensor']]}.{match['kind']}"
    return None


def unpermute_rows(weights: npt.NDArray[Any], n_heads: int) -> npt.NDArray[Any]:
    """Undo llama.cpp's Q/K permutation (HF's rotate-half RoPE layout to interleaved pairs).

    The converter writes ``w.reshape(n_heads, 2, d // 2, ...).swapaxes(1, 2)``; this is the
    inverse, so the rows come back in the order Hugging Face (and mlx-lm) expect.
    """
    rows = weights.shape[0]
    return (
        weights.reshape(n_heads, rows // n_heads // 2, 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _write_weights(
    reader: Any,
    architecture: str,
    config: dict[str, Any],
    folder: Path,
    report: Callable[[ImportProgress], None],
) -> None:
    import mlx.core as mx
    from gguf.quants import dequantize

    tensors: dict[str, Any] = {}
    total = len(reader.tensors)
    for index, tensor in enumerate(reader.tensors):
        name = hf_tensor_name(tensor.name)
        if name is None:
            log.info("skipping GGUF tensor %s (no Hugging Face counterpart)", tensor.name)
            continue
        try:
            values = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as error:
            raise ModelFileError(
                f"cannot import: tensor {tensor.name} has type {tensor.tensor_type.name}, "
                f"which the gguf package cannot dequantize ({error})"
            ) from None
        values = np.asarray(values, dtype=np.float32).reshape(tuple(reversed(tensor.shape)))
        if architecture == "llama" and tensor.name.endswith(("attn_q.weight", "attn_q.bias")):
            values = unpermute_rows(values, config["num_attention_heads"])
        elif architecture == "llama" and tensor.name.endswith(("attn_k.weight", "attn_k.bias")):
            values = unpermute_rows(values, config["num_key_value_heads"])
        tensors[name] = mx.array(values).astype(mx.bfloat16)
        report(
            ImportProgress(
                "dequantizing",
                _DEQUANTIZE_SHARE * (index + 1) / total,
                f"{tensor.tensor_type.name} {tensor.name}",
            )
        )
    mx.save_safetensors(str(folder / "model.safetensors"), tensors, metadata={"format": "pt"})


# -- tokenizer -------------------------------------------------------------------------------


def _write_tokenizer(metadata: dict[str, Any], folder: Path) -> None:
    """tokenizer.json from the GGUF vocabulary and merges; tokenizer_config.json beside it."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    model_name = _value(metadata, "tokenizer.ggml.model", "")
    pre = _value(metadata, "tokenizer.ggml.pre", "") or ""
    if model_name != "gpt2":
        raise SettingsError(
            f"cannot import: the '{model_name}' tokenizer is not supported yet "
            "(byte-level BPE only)"
        )
    tokens: list[str] = list(_value(metadata, "tokenizer.ggml.tokens"))
    types: list[int] = list(_value(metadata, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in _value(metadata, "tokenizer.ggml.merges", [])]
    vocab = {text: i for i, text in enumerate(tokens) if types[i] != _TOKEN_UNUSED}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    if pre in _SPLIT_PATTERNS:
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(
                    pattern=_tokenizers_regex(_SPLIT_PATTERNS[pre]),
                    behavior="isolated",
                    invert=False,
                ),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    elif pre in _DIGIT_SPLITTING:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    elif pre in _GPT2_LIKE:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        raise SettingsError(f"cannot import: the '{pre}' pre-tokenizer is not supported yet")
    tokenizer.decoder = decoders.ByteLevel()
    added = [
        AddedToken(tokens[i], special=types[i] == _TOKEN_CONTROL, normalized=False)
        for i in range(len(tokens))
        if types[i] in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED)
    ]
    tokenizer.add_tokens(added)
    tokenizer.save(str(folder / "tokenizer.json"))

    def special(key: str) -> str | None:
        value = _value(metadata, f"tokenizer.ggml.{key}")
        return tokens[int(value)] if value is not None and 0 <= int(value) < len(tokens) else None

    add_bos = _value(metadata, "tokenizer.ggml.add_bos_token", False)
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": special("bos_token_id"),
        "eos_token": special("eos_token_id"),
        "pad_token": special("padding_token_id"),
        "unk_token": special("unknown_token_id"),
        "add_bos_token": bool(add_bos),
        "add_eos_token": bool(_value(metadata, "tokenizer.ggml.add_eos_token", False)),
        "chat_template": _value(metadata, "tokenizer.chat_template"),
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config, indent=2, ensure_ascii=False), encoding="utf-8"
    )


def _tokenizers_regex(pattern: str) -> Any:
    from tokenizers import Regex

    return Regex(pattern)


# -- command line helpers ------------------------------------------------------------------------


class ImportProgressBar:
    """Shows ImportProgress as a text bar (redrawn in place on a terminal, else every 10%)."""

    BAR_WIDTH = 24
    LOG_STEP_PERCENT = 10

    def __init__(self, stream: Any, label: str) -> None:
        """Draw on ``stream`` (a text stream); ``label`` names the model."""
        self._stream = stream
        self._label = label
        self._interactive = bool(getattr(stream, "isatty", lambda: False)())
        self._last_percent = -self.LOG_STEP_PERCENT
        self._last_stage = ""

    def __call__(self, event: ImportProgress) -> None:
        """Show one progress event."""
        percent = int(event.fraction * 100)
        filled = int(event.fraction * self.BAR_WIDTH)
        line = (
            f"{self._label} [{'#' * filled}{'.' * (self.BAR_WIDTH - filled)}] {percent:3d}% "
            f"{event.stage}: {event.message}"
        )
        if self._interactive:
            self._stream.write("\r" + line[:119].ljust(119))
            if event.stage == "done":
                self._stream.write("\n")
        elif (
            event.stage != self._last_stage or percent >= self._last_percent + self.LOG_STEP_PERCENT
        ):
            self._stream.write(line + "\n")
            self._last_percent = percent
        self._last_stage = event.stage
        self._stream.flush()


def ensure_mlx_import(
    gguf_path: Path,
    progress: Callable[[ImportProgress], None] | None = None,
    models_folder: Path | None = None,
) -> Path:
    """The MLX import of ``gguf_path``, made now if it is not there yet (or is broken)."""
    from backends.models.mlx_info import read_mlx_model_info

    target = mlx_folder_for(gguf_path, models_folder)
    if target.is_dir():
        try:
            read_mlx_model_info(target)
            return target
        except ModelFileError as error:
            log.warning("re-importing %s: %s", target, error)
    return import_gguf(gguf_path, target, progress=progress, overwrite=True)
