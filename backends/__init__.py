"""SpecDeck engines: model adapters, the speculative decoding loop and the model catalog (no Qt)."""
