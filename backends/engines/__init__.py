"""The engines: the interface the speculative loop drives, llama.cpp and MLX behind it."""
