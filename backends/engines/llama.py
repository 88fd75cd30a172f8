"""The llama.cpp engine: llama-cpp-python's low-level API behind the ModelEngine interface."""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.engines.base import EngineBase
from backends.engines.chat_template import ChatTemplate
from backends.engines.draft_weights import DraftWeights, check_draft_weights, drafting_file
from backends.engines.exactness_memory import (
    ExactnessMemory,
    file_identity,
    files_identity,
    fingerprint_key,
    kernel_environment,
)
from backends.engines.hardware import (
    GPU_KINDS,
    available_memory,
    estimate_model_memory,
    ggml_devices,
    gpu_device_label,
    gpu_free_memory,
    llama_build_info,
    physical_cores,
    vulkan_exact_batch,
)
from backends.engines.interface import (
    DEFAULT_CONTEXT_SIZE,
    LOCAL_CPU_PLACE,
    LogitRows,
    VocabFacts,
    probe_exact_batch_limit,
    probe_exact_batches_and_siblings,
)
from backends.engines.layer_split import parse_split, split_layers
from backends.engines.llama_native import (
    FLASH_ATTENTION_ENABLED,
    GGML_TYPE_F16,
    GGML_TYPE_Q8_0,
    LLAMA_SPLIT_MODE_LAYER,
    NativeLog,
    exact_batch_ceiling,
    init_llama_cpp,
    recent_native_errors,
    requantize_q4_0,
)
from backends.engines.load_guard import SAFEST, RiskySettings, checkpoint
from backends.engines.pass_delay import PassDelay
from backends.engines.rpc import (
    HeldLinks,
    RemoteDevice,
    WorkerConnections,
    connect_devices,
    device_memory,
    holds_connection,
    refuse_abandoned,
)
from backends.engines.weight_placement import (
    WEIGHT_REPACKING_MODES,
    WeightPlan,
    WeightRepacking,
    apply_plan,
)
from backends.engines.worker_probe import (
    WorkerAddress,
    WorkerDevice,
    WorkerStatus,
    check_workers,
    parse_workers,
)
from backends.errors import EngineError, ModelFileError, SettingsError
from backends.models.gguf_info import read_model_info

if TYPE_CHECKING:
    from llama_cpp import llama_model_params

    from backends.engines.hardware import LlamaBuildInfo

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 512
ALL_LAYERS = -1
_TOKEN_PIECE_BUFFER = 256
_PROBE_MAX_BATCH = 17  # batch sizes probed for exactness: 2 .. this (a 16-token lookup + 1)

LoadProgress = Callable[[float], None]
# Fault injection: the first load of a model with layers on the GPU fails, as an allocation
# the GPU cannot make does.
GPU_LOAD_FAILS_ENV = "SPECDECK_GPU_LOAD_FAILS"


@dataclass(frozen=True)
class LlamaLoadSettings:
    """How a GGUF model is loaded into llama.cpp."""

    n_ctx: int = DEFAULT_CONTEXT_SIZE  # 0 = the model's training context
    n_batch: int = DEFAULT_BATCH_SIZE
    gpu_layers: int = ALL_LAYERS  # -1 = all; ignored by CPU-only builds
    n_threads: int | None = None  # None = all physical cores
    # Repacked CPU weights (llama.cpp's extra buffer types; never AMX, see
    # backends/weight_placement.py) change which batches reproduce single-token logits;
    # the exactness probe below measures where. "auto" is SpecDeck's measured choice.
    weight_repacking: WeightRepacking = "auto"
    # Measure at load the largest batch whose logits equal single-token logits bitwise, so
    # that greedy verification can stay exactly plain decoding.
    probe_exact_batch: bool = True
    # On the CPU, keep K in F16 and V in Q8_0. llama.cpp's CPU flash attention has faster
    # paths for equal K/V types (split-KV for one token past 512 cached tokens, tiles from
    # 64 query rows) whose rounding differs from the path batches take; with differing
    # types every batch size and context length takes one path, so verification stays
    # bitwise plain decoding at any length. (F32 is no option: llama.cpp's flash
    # attention turns an F32 cache back into F16.) Slower plain decoding on tiny models at
    # long contexts (docs/benchmarks.md "Exactness"), little on the 1.5B.
    single_path_attention: bool = True
    # llama.cpp RPC workers ("host:port") holding part of the main model (never the
    # draft's), and how to split the layers: one share per worker and the last for this
    # computer; empty = by free memory. gpu_layers does not apply with workers.
    workers: tuple[str, ...] = ()
    layer_split: tuple[float, ...] = ()
    # A draft's weights: "auto" drafts with a Q4_0 copy where that is lighter and the draft
    # runs on the CPU (backends/engines/draft_weights.py); "stored" or "q4_0" force it.
    # Ignored for a main model.
    draft_weights: DraftWeights = "auto"

    @property
    def risky(self) -> RiskySettings:
        """The settings a native crash while loading can depend on."""
        return RiskySettings(self.weight_repacking, self.gpu_layers, self.n_threads)

    def __post_init__(self) -> None:
        if self.n_ctx < 0:
            raise SettingsError(f"context size must be >= 0, got {self.n_ctx}")
        if self.n_batch < 1:
            raise SettingsError(f"batch size must be >= 1, got {self.n_batch}")
        if self.gpu_layers < ALL_LAYERS:
            raise SettingsError(f"gpu_layers must be -1 (all) or >= 0, got {self.gpu_layers}")
        if self.n_threads is not None and self.n_threads < 1:
            raise SettingsError(f"n_threads must be >= 1, got {self.n_threads}")
        if self.weight_repacking not in WEIGHT_REPACKING_MODES:
            choices = ", ".join(WEIGHT_REPACKING_MODES)
            raise SettingsError(
                f"weight repacking must be one of {choices}, got {self.weight_repacking!r}"
            )
        parse_split(self.layer_split, len(parse_workers(self.workers)))
        check_draft_weights(self.draft_weights)


def _kernels_note(build: LlamaBuildInfo, *, on_cpu: bool) -> tuple[str, ...]:
    """The load report's line on SpecDeck's own CPU kernels, where they serve this model."""
    kernels = build.specdeck_kernels
    if not kernels or not on_cpu:
        return ()
    return (
        f"SpecDeck's CPU kernels for {', '.join(kernels)} weights: llama.cpp's numbers, "
        "single steps and verification batches in fewer instructions",
    )


class LlamaEngine(EngineBase):
    """A GGUF model loaded into llama.cpp with one context and one sequence."""

    def __init__(
        self,
        path: str | Path,
        settings: LlamaLoadSettings | None = None,
        *,
        is_draft: bool = False,
        progress: LoadProgress | None = None,
    ) -> None:
        """Load the model and open its context: weights, context, then the exactness probe.

        Raises ModelFileError for a missing, corrupt or unloadable file and EngineError
        when llama.cpp cannot create the context (memory, most often).
        """
        import llama_cpp

        super().__init__(path)
        self._llama = llama_cpp
        self.settings = settings or LlamaLoadSettings()
        self.info = read_model_info(self.path)  # clear errors for missing/corrupt files first
        self._pass_delay = PassDelay.from_environment("draft" if is_draft else "main")
        native = init_llama_cpp()
        native.take_errors()
        native.take_weight_buffers()
        native.take_layer_devices()
        build = llama_build_info()
        started = time.perf_counter()
        self.weight_plan = apply_plan(WeightPlan.choose(self.settings.weight_repacking))
        # The draft always goes fully onto the GPU: it runs k times per round, so any layer
        # left on the CPU costs more than it saves in GPU memory.
        gpu_layers = ALL_LAYERS if is_draft else self.settings.gpu_layers
        worker_addresses = () if is_draft else parse_workers(self.settings.workers)
        gpu_note = None
        if build.supports_gpu_offload and gpu_layers != 0 and not worker_addresses:
            gpu_layers, gpu_note = self._fit_on_gpu(gpu_layers)

        weights_note = self._load_weights(
            native, build, gpu_layers, worker_addresses, is_draft, progress
        )
        if self._gpu_load_failed:
            gpu_layers, gpu_note = 0, self._gpu_load_failed
        n_layers = int(llama_cpp.llama_model_n_layer(self._model))
        threads = self.settings.n_threads or physical_cores()
        single_path = (
            self.settings.single_path_attention and not is_draft and not build.supports_gpu_offload
        )
        self._open_context(native, threads, single_path, sibling_ready=not worker_addresses)

        offloaded = 0
        if build.supports_gpu_offload:
            offloaded = n_layers if gpu_layers == ALL_LAYERS else min(gpu_layers, n_layers)
        self._vocab_facts = self._read_vocab_facts()
        self._template = ChatTemplate(self.info.chat_template, self.info.name)
        weight_buffers = native.take_weight_buffers()
        layer_placement: tuple[tuple[str, int], ...] = ()
        layer_devices = native.take_layer_devices()
        gpu_device = ""
        on_gpu: list[str] = []
        if worker_addresses:
            layer_placement = self._layer_placement(layer_devices, n_layers)
            offloaded = sum(count for where, count in layer_placement if where != LOCAL_CPU_PLACE)
        elif offloaded and layer_devices:
            # What llama.cpp did, where it says: a device that could not take a layer
            # leaves it on the CPU.
            on_gpu = [d for layer, d in layer_devices.items() if layer < n_layers and d != "CPU"]
            offloaded = len(on_gpu)
            gpu_device = gpu_device_label(build, on_gpu[0]) if on_gpu else ""
        exactness_note = None
        if self.settings.probe_exact_batch and not is_draft:
            # With workers nothing is remembered: their machines can change unseen.
            rows_computed_by = None
            if not worker_addresses:
                rows_computed_by = self._what_computes_rows(
                    build, threads=threads, devices=on_gpu, weight_buffers=weight_buffers
                )
            exactness_note = self._probe_exactness(
                on_vulkan=any(d.startswith("Vulkan") for d in on_gpu),
                fingerprint=rows_computed_by,
            )
        self._finish_load(
            started,
            backend=build.backend_label,
            n_layers=n_layers,
            gpu_layers=offloaded,
            kv_cache_on_gpu=build.supports_gpu_offload and offloaded > 0,
            n_threads=threads,
            unified_memory=build.backend == "Metal",
            # Repacking is the CPU's: a model wholly on the GPU has no weights it repacks.
            notes=((self.weight_plan.note,) if offloaded < n_layers else ())
            + ((weights_note,) if weights_note else ())
            + _kernels_note(build, on_cpu=offloaded < n_layers)
            + ((build.gpu_problem,) if build.gpu_problem and not offloaded else ())
            + ((gpu_note,) if gpu_note else ())
            + ((exactness_note,) if exactness_note else ()),
            weight_buffers=weight_buffers,
            layer_placement=layer_placement,
            gpu_device=gpu_device,
        )

    # -- loading ---------------------------------------------------------------------------

    def _load_weights(
        self,
        native: NativeLog,
        build: LlamaBuildInfo,
        gpu_layers: int,
        worker_addresses: tuple[WorkerAddress, ...],
        is_draft: bool,
        progress: LoadProgress | None,
    ) -> str | None:
        """Load the weights (on this machine's devices or the workers'); the weights' note.

        A draft loads from its drafting file (a Q4_0 copy where that is lighter on a CPU).
        """
        llama_cpp = self._llama
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 999 if gpu_layers == ALL_LAYERS else gpu_layers
        model_params.use_extra_bufts = self.weight_plan.repack
        self._workers: WorkerConnections | None = None
        self._links: HeldLinks | None = None
        self._remote: tuple[RemoteDevice, ...] = ()
        if worker_addresses:
            self._place_on_workers(model_params, worker_addresses)
        self._progress_callback = None
        if progress is not None:
            report = progress

            def on_progress(fraction: float, _user_data: ctypes.c_void_p) -> bool:
                report(float(fraction))
                return True

            self._progress_callback = llama_cpp.llama_progress_callback(on_progress)
            model_params.progress_callback = self._progress_callback
        load_path, weights_note = self.path, None
        if is_draft:
            load_path, weights_note = drafting_file(
                self.info,
                self.settings.draft_weights,
                on_gpu=build.supports_gpu_offload,
                requantize=requantize_q4_0,
            )
        model = None
        self._gpu_load_failed: str | None = None
        if os.environ.get(GPU_LOAD_FAILS_ENV) != "1" or model_params.n_gpu_layers == 0:
            model = llama_cpp.llama_model_load_from_file(str(load_path).encode(), model_params)
        if not model and model_params.n_gpu_layers != 0 and not worker_addresses:
            # The GPU could not take it (an allocation failed): the CPU can.
            why = native.take_errors() or "llama.cpp could not load it there"
            self._gpu_load_failed = f"the GPU could not hold the model ({why}): loaded on the CPU"
            log.warning("%s: %s", self.path.name, self._gpu_load_failed)
            model_params.n_gpu_layers = 0
            model = llama_cpp.llama_model_load_from_file(str(load_path).encode(), model_params)
        if self._links is not None:
            self._links.release()  # the model's buffers hold the connections now
        if not model:
            if self._workers is not None:
                self._workers.close()
            detail = native.take_errors() or "llama.cpp could not load it"
            raise ModelFileError(f"cannot load model {self.path.name}: {detail}")
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        return weights_note

    def _fit_on_gpu(self, gpu_layers: int) -> tuple[int, str | None]:
        """The layers to offload, and why none are where the GPU is too small for them.

        None when the GPU's free memory cannot hold this model's share of the layers (an
        estimate: weights, KV cache, compute buffers), with the line that says so.
        """
        free = gpu_free_memory()
        if free is None:
            return gpu_layers, None
        bytes_free, device = free
        n_layers = self.info.n_layers or 1
        share = 1.0 if gpu_layers == ALL_LAYERS else min(gpu_layers, n_layers) / n_layers
        n_ctx = self.settings.n_ctx or self.info.context_length or DEFAULT_CONTEXT_SIZE
        needed = int(estimate_model_memory(self.info, n_ctx) * share)
        if needed <= bytes_free:
            return gpu_layers, None
        note = (
            f"{device} has {bytes_free / 2**30:.2f} GB free, the model needs about "
            f"{needed / 2**30:.2f} GB there: loaded on the CPU"
        )
        log.warning("%s: %s", self.path.name, note)
        return 0, note

    def _open_context(
        self, native: NativeLog, threads: int, single_path: bool, *, sibling_ready: bool
    ) -> None:
        """The context (its KV cache) and the batch every forward pass fills.

        ``single_path``: attention through the CPU's one flash-attention path (F16 keys,
        Q8_0 values), which is what makes sibling branches possible.
        """
        llama_cpp, model = self._llama, self._model
        train_ctx = int(llama_cpp.llama_model_n_ctx_train(model))
        n_ctx = self.settings.n_ctx or train_ctx
        if train_ctx > 0:
            n_ctx = min(n_ctx, train_ctx)
        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = self.settings.n_batch
        ctx_params.n_ubatch = self.settings.n_batch
        ctx_params.n_threads = threads
        ctx_params.n_threads_batch = threads
        ctx_params.offload_kqv = True
        if single_path:
            ctx_params.flash_attn_type = FLASH_ATTENTION_ENABLED
            ctx_params.type_k = GGML_TYPE_F16
            ctx_params.type_v = GGML_TYPE_Q8_0
        # Sibling branches need a second sequence sharing the cells of the first. Only where
        # attention takes the CPU's one flash-attention path: it visits a row's cells in
        # order and skips masked ones, so a branch's cells change no sum (measured:
        # benchmarks/sibling_tree.py, and probed below); and only over a plain KV cache
        # (no recurrent state, no sliding window), where a branch is cells and nothing more.
        plain_cache = not (
            llama_cpp.llama_model_is_recurrent(model)
            or llama_cpp.llama_model_is_hybrid(model)
            or llama_cpp.llama_model_n_swa(model) > 0
        )
        sequences = 2 if single_path and plain_cache and sibling_ready else 1
        ctx_params.n_seq_max = self._sequences = sequences
        ctx_params.kv_unified = True
        ctx_params.no_perf = True
        context = llama_cpp.llama_init_from_model(model, ctx_params)
        if not context:
            llama_cpp.llama_model_free(model)
            detail = native.take_errors() or "out of memory?"
            raise EngineError(f"cannot create a context for {self.path.name}: {detail}")
        self._ctx = context
        self._memory = llama_cpp.llama_get_memory(context)
        self._n_ctx = int(llama_cpp.llama_n_ctx(context))
        self._n_batch = int(llama_cpp.llama_n_batch(context))
        self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self._batch = llama_cpp.llama_batch_init(self._n_batch, 0, sequences)
        for index in range(self._n_batch):
            self._batch.n_seq_id[index] = 1
            self._batch.seq_id[index][0] = 0

    def _probe_exactness(
        self, *, on_vulkan: bool = False, fingerprint: dict[str, Any] | None = None
    ) -> str | None:
        """How many rows a batch computes exactly as one at a time, and siblings with them.

        This is the first forward pass, where a broken CPU kernel crashes: the checkpoint
        lets the load guard tell that crash from others. With layers on Vulkan, batches
        above :func:`vulkan_exact_batch` take other shaders, so the probe goes one size past
        it and no further (on a slow device each single step of the probe is dear: 0.41 s
        on lavapipe), and promises no more than it saw.

        With a ``fingerprint`` (:meth:`_what_computes_rows`) the answer is remembered, and
        a later load with the same fingerprint and probe sizes reads it back instead of
        probing (:mod:`backends.engines.exactness_memory`): the load report's line for
        that is returned.
        """
        checkpoint("main-probe", self.path, safe=self.settings.risky == SAFEST)
        ceiling = min(self._n_batch, exact_batch_ceiling())
        probe_size = _PROBE_MAX_BATCH
        past_vulkan_limit = vulkan_exact_batch() + 1 if on_vulkan else _PROBE_MAX_BATCH
        if past_vulkan_limit < _PROBE_MAX_BATCH:
            probe_size = max(2, past_vulkan_limit)
            ceiling = min(ceiling, probe_size)
        memory, key = ExactnessMemory(), None
        if fingerprint is not None:
            key = fingerprint_key({**fingerprint, "probe": [probe_size, ceiling]})
            remembered = memory.recall(key)
            if remembered is not None:
                self._exact_batch_limit = remembered.limit
                self._exact_siblings = remembered.siblings and self._sequences > 1
                return remembered.note
        if self._sequences > 1:
            self._exact_batch_limit, self._exact_siblings = probe_exact_batches_and_siblings(
                self, probe_size, ceiling
            )
        else:
            self._exact_batch_limit = probe_exact_batch_limit(self, probe_size, ceiling)
        if key is not None:
            memory.remember(key, self._exact_batch_limit, siblings=self._exact_siblings)
        return None

    def _what_computes_rows(
        self,
        build: LlamaBuildInfo,
        *,
        threads: int,
        devices: list[str],
        weight_buffers: object,
    ) -> dict[str, Any]:
        """The load's fingerprint for the exactness memory: all that computes its rows.

        The library's files (a rebuild is another library), the backend and CPU features,
        the model file, every load setting, the context's sizes, the threads, the devices
        the layers went to, the weights' buffers (repacked or not) and the environment
        variables that choose kernels.
        """
        library = Path(self._llama.__file__).parent / "lib"
        return {
            "engine": "llama.cpp",
            "library": [self._llama.__version__, files_identity(library.rglob("*"))],
            "backend": [build.backend_label, build.system_info, list(build.specdeck_kernels)],
            "model": file_identity(self.path),
            "settings": asdict(self.settings),
            "context": [self._n_ctx, self._n_batch, self._sequences, threads],
            "devices": devices,
            "weight_buffers": weight_buffers,
            "environment": kernel_environment(),
        }

    # -- workers ---------------------------------------------------------------------------

    def _place_on_workers(
        self,
        model_params: llama_model_params,
        addresses: tuple[WorkerAddress, ...],
    ) -> None:
        """Point llama.cpp at the workers' devices (and this machine's GPUs), layer split set.

        Each worker is probed first, so an unreachable one is a one-line error, not an
        abort inside llama.cpp; its connection is then held open (and given keepalive and
        timeouts) from here to the end of the load.
        """
        refuse_abandoned(addresses)
        check_workers([address for address in addresses if not holds_connection(address)])
        self._remote = connect_devices(addresses)
        self._links = HeldLinks(self._remote)
        self._workers = WorkerConnections(addresses)
        local_gpus = [pointer for _name, kind, pointer in ggml_devices() if kind in GPU_KINDS]
        per_worker: dict[WorkerAddress, int] = {}
        for device in self._remote:
            per_worker[device.address] = per_worker.get(device.address, 0) + 1
        split = self.settings.layer_split
        if split:
            wanted = dict(zip(addresses, split, strict=False))
            worker_shares = [wanted[d.address] / per_worker[d.address] for d in self._remote]
            local_share = split[-1]
            gpu_shares = [local_share / len(local_gpus)] * len(local_gpus) if local_gpus else []
            cpu_share = 0.0 if local_gpus else local_share
        else:
            worker_shares = [float(device_memory(device.pointer)[0]) for device in self._remote]
            gpu_shares = [float(device_memory(gpu)[0]) for gpu in local_gpus]
            cpu_share = 0.0 if local_gpus else float(available_memory())
        n_layers = self.info.n_layers or 1
        plan = split_layers(n_layers, worker_shares, gpu_shares, cpu_share)
        pointers = [device.pointer for device in self._remote] + local_gpus
        self._device_list = (ctypes.c_void_p * (len(pointers) + 1))(*pointers, None)
        self._tensor_split = (ctypes.c_float * self._llama.llama_max_devices())(*plan.device_shares)
        # llama-cpp-python binds this field as a bare pointer (it never uses it).
        model_params.devices = ctypes.addressof(self._device_list)  # type: ignore[assignment]
        model_params.split_mode = LLAMA_SPLIT_MODE_LAYER
        model_params.tensor_split = self._tensor_split
        model_params.n_gpu_layers = plan.n_gpu_layers

    def _layer_placement(
        self, layer_devices: dict[int, str], n_layers: int
    ) -> tuple[tuple[str, int], ...]:
        """Each device's repeating layers, in order, named for the user."""
        names = {device.name: f"worker {device.address}" for device in self._remote}
        counts: dict[str, int] = {}
        for layer in sorted(layer_devices):
            if layer < n_layers:
                where = names.get(layer_devices[layer], layer_devices[layer])
                if where == "CPU":
                    where = LOCAL_CPU_PLACE
                counts[where] = counts.get(where, 0) + 1
        return tuple(counts.items())

    def worker_statuses(self) -> tuple[WorkerStatus, ...]:
        """Each worker: connected or gone, and its memory now (asked over the live link)."""
        if self._workers is None:
            return ()
        lost = set(self._workers.lost())
        statuses = []
        for address in self._workers.addresses:
            if address in lost:
                statuses.append(WorkerStatus(address, False, "gone (its connection closed)"))
                continue
            devices = [d for d in self._remote if d.address == address]
            statuses.append(
                WorkerStatus(
                    address,
                    True,
                    devices=tuple(
                        WorkerDevice(index, *device_memory(device.pointer))
                        for index, device in enumerate(devices)
                    ),
                )
            )
        return tuple(statuses)

    # -- facts -----------------------------------------------------------------------------

    def _read_vocab_facts(self) -> VocabFacts:
        llama = self._llama
        bos = int(llama.llama_vocab_bos(self._vocab))
        eos = int(llama.llama_vocab_eos(self._vocab))
        end_ids = frozenset(
            token for token in range(self._n_vocab) if llama.llama_vocab_is_eog(self._vocab, token)
        )
        return VocabFacts(
            n_vocab=self._n_vocab,
            bos_id=bos if bos >= 0 else None,
            eos_id=eos if eos >= 0 else None,
            add_bos=bool(llama.llama_vocab_get_add_bos(self._vocab)),
            end_of_generation_ids=end_ids,
        )

    # -- text ------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Tokenize with llama.cpp's tokenizer."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (self._llama.llama_token * capacity)()
        count = self._llama.llama_tokenize(
            self._vocab, data, len(data), buffer, capacity, add_special, parse_special
        )
        if count < 0:
            capacity = -count
            buffer = (self._llama.llama_token * capacity)()
            count = self._llama.llama_tokenize(
                self._vocab, data, len(data), buffer, capacity, add_special, parse_special
            )
        return list(buffer[:count])

    def _token_piece(self, token: int) -> bytes:
        buffer = ctypes.create_string_buffer(_TOKEN_PIECE_BUFFER)
        length = self._llama.llama_token_to_piece(
            self._vocab, token, buffer, _TOKEN_PIECE_BUFFER, 0, False
        )
        if length < 0:
            buffer = ctypes.create_string_buffer(-length)
            length = self._llama.llama_token_to_piece(self._vocab, token, buffer, -length, 0, False)
        return bytes(buffer.raw[:length])

    def _token_text(self, token: int | None) -> str:
        if token is None:
            return ""
        text = self._llama.llama_vocab_get_text(self._vocab, token)
        return text.decode("utf-8", errors="replace") if text else ""

    # -- evaluation ------------------------------------------------------------------------

    def evaluate(self, tokens: Sequence[int], logit_rows: int) -> LogitRows:
        """Decode ``tokens`` after the cache in chunks of n_batch; logits of the last rows."""
        count = len(tokens)
        position = self._batch_position(count, logit_rows, self._n_batch, "n_batch")
        first_output = count - logit_rows
        batch = self._batch
        llama = self._llama
        for start in range(0, count, self._n_batch):
            chunk = tokens[start : start + self._n_batch]
            for offset, token in enumerate(chunk):
                index = start + offset
                batch.token[offset] = token
                batch.pos[offset] = position + index
                batch.logits[offset] = index >= first_output
            batch.n_tokens = len(chunk)
            if self._workers is not None:
                self._workers.before_pass(len(chunk))
            began = time.perf_counter()
            status = llama.llama_decode(self._ctx, batch)
            if self._workers is not None:
                # The workers compute after llama_decode returns: time the whole pass.
                llama.llama_synchronize(self._ctx)
            if self._pass_delay is not None:
                self._pass_delay.sleep(len(chunk))  # fault injection: a slower machine
            elapsed = time.perf_counter() - began
            self._decode_seconds += elapsed
            if self._workers is not None:
                self._workers.after_pass(len(chunk), elapsed)
            if status != 0:
                # Keep our token list true to what the cache may now hold.
                self.truncate(position + start)
                raise self._evaluation_error(status)
            self._tokens.extend(chunk)
        pointer = llama.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(logit_rows, self._n_vocab))

    def evaluate_with_sibling(
        self, tokens: Sequence[int], logit_rows: int, sibling_at: int, sibling: int
    ) -> LogitRows:
        """Decode ``tokens`` and a sibling branch in one batch (sequence 1, dropped after)."""
        count = len(tokens)
        if self._sequences < 2:
            raise EngineError(f"{self.name}: this context has no room for sibling branches")
        if not 0 <= count - logit_rows <= sibling_at < count:
            raise ValueError(f"sibling_at={sibling_at} outside the last {logit_rows} rows")
        # The batch holds the sibling too: one more token and one more cell.
        position = self._batch_position(count + 1, logit_rows, self._n_batch, "n_batch")
        if count + 1 > self._n_batch:
            raise ValueError(f"{count} tokens and a sibling exceed n_batch {self._n_batch}")
        llama, memory, batch = self._llama, self._memory, self._batch
        first_output = count - logit_rows
        llama.llama_memory_seq_cp(memory, 0, 1, -1, -1)  # the branch sees the whole cache
        for index, token in enumerate(tokens):
            batch.token[index] = token
            batch.pos[index] = position + index
            batch.logits[index] = index >= first_output
            if index < sibling_at:
                batch.n_seq_id[index] = 2
                batch.seq_id[index][1] = 1
        batch.token[count] = sibling
        batch.pos[count] = position + sibling_at
        batch.logits[count] = True
        batch.seq_id[count][0] = 1
        batch.n_tokens = count + 1
        began = time.perf_counter()
        try:
            status = llama.llama_decode(self._ctx, batch)
            if self._pass_delay is not None:
                self._pass_delay.sleep(count + 1)
        finally:
            self._decode_seconds += time.perf_counter() - began
            llama.llama_memory_seq_rm(memory, 1, -1, -1)
            for index in range(count + 1):  # back to one sequence for evaluate()
                batch.n_seq_id[index] = 1
                batch.seq_id[index][0] = 0
        if status != 0:
            self._roll_back(position)  # the chain's cells, if any were written
            raise self._evaluation_error(status)
        self._tokens.extend(tokens)
        pointer = llama.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(logit_rows + 1, self._n_vocab))

    def _evaluation_error(self, status: int) -> EngineError:
        """The error for a failed ``llama_decode``: llama.cpp's own words where it logged any."""
        detail = self._native_errors() or f"llama_decode returned {status}"
        return EngineError(f"{self.name}: evaluation failed: {detail}")

    def _native_errors(self) -> str:
        return recent_native_errors()

    def _roll_back(self, n_tokens: int) -> None:
        if not self._llama.llama_memory_seq_rm(self._memory, 0, n_tokens, -1):
            # Recurrent caches cannot drop a partial sequence: start over.
            self._llama.llama_memory_clear(self._memory, True)
            del self._tokens[:]
            return
        del self._tokens[n_tokens:]

    def _free(self) -> None:
        lost = self._workers.lost() if self._workers is not None else []
        if lost:
            # Freeing buffers on a lost worker would abort the process inside llama.cpp:
            # leave the model to the process's end, and its workers unusable until then.
            assert self._workers is not None
            self._workers.close(model_kept=True)
            log.warning(
                "worker(s) %s lost: %s stays in memory until the engine process ends",
                ", ".join(map(str, lost)),
                self.name,
            )
        else:
            self._llama.llama_batch_free(self._batch)
            self._llama.llama_free(self._ctx)
            self._llama.llama_model_free(self._model)
        if self._workers is not None:
            self._workers.close()
