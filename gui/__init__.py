"""SpecDeck's PySide6 window (built on the engines of `backends`)."""
