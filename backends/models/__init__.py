"""Model files: GGUF and MLX metadata, the model folders' catalog, pair checks, provisioning."""
