"""Errors SpecDeck reports to the user as one line that names the problem."""

from __future__ import annotations


class SpecDeckError(Exception):
    """Base of every error that is shown to the user as a one-line message."""


class ModelFileError(SpecDeckError):
    """A model file is missing, unreadable, not GGUF, truncated or otherwise corrupt."""


class IncompatiblePairError(SpecDeckError):
    """The draft model cannot draft for the main model (different tokenizers)."""


class ContextOverflowError(SpecDeckError):
    """The prompt (plus what is to be generated) does not fit the model's context."""


class SettingsError(SpecDeckError):
    """A generation or load setting is impossible (e.g. draft_max < 1, temperature < 0)."""


class ProvisioningError(SpecDeckError):
    """A model of the default pair could not be fetched, assembled or verified."""


class EngineError(SpecDeckError):
    """The inference engine failed (e.g. llama_decode returned an error)."""
