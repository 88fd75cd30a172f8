"""PyInstaller hook: llama-cpp-python loads libllama/libggml* with ctypes from llama_cpp/lib.

PyInstaller's import analysis cannot see ctypes loads, so without this hook the frozen app
fails with "Shared library with base name 'llama' not found". With GGML_BACKEND_DL the CPU
backend comes as one library per instruction set (libggml-cpu-haswell.so, …-skylakex.so),
picked at run time, beside the Vulkan and RPC backends; they are all collected.
"""

import re

from PyInstaller.utils.hooks import collect_dynamic_libs

# libfoo.so.0.25.3 is a third copy of libfoo.so / libfoo.so.0 (the names actually loaded);
# packaging/linux/build.sh removes it and links libfoo.so to libfoo.so.0, which PyInstaller
# keeps as a link, so that both names are one library when loaded.
_FULLY_VERSIONED = re.compile(r"\.so\.\d+\.\d+")

binaries = [
    (source, dest)
    for source, dest in collect_dynamic_libs("llama_cpp", destdir="llama_cpp/lib")
    if not _FULLY_VERSIONED.search(source)
]
