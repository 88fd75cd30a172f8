"""PyInstaller hook: llama-cpp-python loads libllama/libggml* with ctypes from llama_cpp/lib.

PyInstaller's import analysis cannot see ctypes loads, so without this hook the frozen app
fails with "Shared library with base name 'llama' not found".
"""

from PyInstaller.utils.hooks import collect_data_files, collect_dynamic_libs

# Keep the libraries where llama_cpp looks for them: <bundle>/llama_cpp/lib.
binaries = collect_dynamic_libs("llama_cpp", destdir="llama_cpp/lib")
datas = collect_data_files("llama_cpp")
