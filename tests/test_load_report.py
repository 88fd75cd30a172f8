"""The load report's one-line placement: where a model's layers and KV cache went."""

from __future__ import annotations

from dataclasses import replace

from backends.engines.interface import LoadReport

ON_CPU = LoadReport("m", "Vulkan", 30, 0, False, 1024, 2, 1.0)


def test_a_model_on_the_cpu_names_its_threads() -> None:
    assert ON_CPU.placement == "Vulkan: all 30 layers on CPU (2 threads)"


def test_a_model_all_on_the_gpu() -> None:
    on_gpu = replace(ON_CPU, gpu_layers=30, kv_cache_on_gpu=True)
    assert on_gpu.placement == "Vulkan: all 30 layers on GPU, KV cache on GPU"


def test_a_split_says_how_many_layers_are_where_and_that_the_kv_cache_follows_them() -> None:
    """llama.cpp keeps a CPU layer's KV cache on the CPU: "KV cache on GPU" would be wrong."""
    split = replace(ON_CPU, gpu_layers=10, kv_cache_on_gpu=True)
    assert split.placement == (
        "Vulkan: 10 of 30 layers on GPU, 20 on CPU (2 threads), KV cache beside its layers"
    )
    assert replace(split, kv_cache_on_gpu=False).placement.endswith(", KV cache on CPU")


def test_the_gpu_is_named_where_llama_cpp_said_which_it_was() -> None:
    named = replace(ON_CPU, gpu_layers=30, kv_cache_on_gpu=True, gpu_device="Vulkan0: llvmpipe")
    assert named.placement == "Vulkan: all 30 layers on GPU (Vulkan0: llvmpipe), KV cache on GPU"
    split = replace(named, gpu_layers=10)
    assert split.placement.startswith("Vulkan: 10 of 30 layers on GPU (Vulkan0: llvmpipe), 20 on")


def test_the_backend_in_use_names_the_gpu_only_where_layers_are() -> None:
    named = replace(ON_CPU, gpu_layers=30, gpu_device="Vulkan0: llvmpipe")
    assert named.backend_in_use == "Vulkan (Vulkan0: llvmpipe)"
    assert replace(named, gpu_layers=0).backend_in_use == "Vulkan"
