"""SpecDeck's backends for others: the engine process, specdeck-bench, specdeck-models."""
