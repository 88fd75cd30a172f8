"""Constrained decoding: every answer follows a grammar (a JSON schema, Lark, a regex, GBNF).

Built on llguidance (the constrained-decoding library llama.cpp itself can use): it
compiles a grammar once, computes the set of tokens allowed next in microseconds, checks a
token sequence against it, and rolls back. The loop asks three things of a
:class:`GrammarMatcher`:

- :meth:`~GrammarMatcher.allowed_prefix`: how many of a draft's tokens the grammar allows,
  in order. A draft ends before its first forbidden token, before verification (the cut
  tokens count as ignored).
- :meth:`~GrammarMatcher.masked_rows`: the target's rows with every token the grammar
  forbids at that position set to -inf. Row ``j`` is masked as it stands after the
  draft's first ``j`` tokens; draft token ``j`` is consumed only when row ``j + 1`` is
  asked for, so after a verdict the matcher has consumed exactly the accepted tokens.
- :meth:`~GrammarMatcher.consume`: the round's own token (the corrected or bonus token,
  which the masked row made sure is allowed).

At temperature 0 the target's token is then the argmax of its masked logits, at every
position, with or without a draft: the text is exactly plain constrained decoding's. With
sampling the distribution is the constrained one (the masked row is what the target's
probabilities come from; a draft's own distribution needs no mask, since a forbidden draft
token never reaches verification).

The grammar's tokenizer is built once per engine from the engine's own token texts
(:func:`grammar_tokenizer`), so any engine works; special tokens (those with no text)
are never allowed inside the grammar's text, the end-of-generation token only where the
grammar is complete.
"""

from __future__ import annotations

import json
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.errors import SettingsError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Sequence

    import llguidance

    from backends.engines.interface import LogitRows, ModelEngine

# The grammars a front end can ask for, by the name of their source language.
GRAMMAR_KINDS = ("json_schema", "lark", "regex", "gbnf")
MAX_ERROR_LENGTH = 240  # of a grammar's error in a one-line message
# Any JSON object (OpenAI's ``{"type": "json_object"}``).
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}

_tokenizers: weakref.WeakKeyDictionary[ModelEngine, llguidance.LLTokenizer] = (
    weakref.WeakKeyDictionary()
)


def compile_grammar(kind: str, source: Any) -> str:
    """``source`` in the language ``kind`` names, as a grammar llguidance runs.

    A schema or grammar llguidance cannot compile is a one-line SettingsError naming the
    problem (an unknown keyword, a syntax error).
    """
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import GbnfToLarkError, gbnf_to_lark

    try:
        if kind == "json_schema":
            if not isinstance(source, (dict, bool)):
                raise SettingsError("invalid json schema: it must be an object")
            # Compact JSON: no whitespace between tokens, so a model cannot pad an answer
            # with blank lines forever, and the scaffolding (quotes, colons, the keys of
            # required properties) is left to the grammar alone.
            grammar = LLMatcher.grammar_from_json_schema(
                json.dumps(source), defaults={"whitespace_flexible": False}
            )
        elif kind == "lark":
            grammar = LLMatcher.grammar_from_lark(_text(source, kind))
        elif kind == "regex":
            grammar = LLMatcher.grammar_from_regex(_text(source, kind))
        elif kind == "gbnf":
            grammar = LLMatcher.grammar_from_lark(gbnf_to_lark(_text(source, kind)))
        else:
            raise SettingsError(
                f"unknown grammar kind {kind!r} (one of {', '.join(GRAMMAR_KINDS)})"
            )
    except (ValueError, TypeError, GbnfToLarkError) as error:
        raise SettingsError(f"invalid {kind.replace('_', ' ')}: {_one_line(error)}") from None
    check_grammar(grammar, kind)
    return grammar


def check_grammar(grammar: str, kind: str = "grammar") -> None:
    """A one-line SettingsError where llguidance cannot run ``grammar``."""
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise SettingsError(f"invalid {kind.replace('_', ' ')}: {_one_line(messages[0])}")


def grammar_tokenizer(engine: ModelEngine) -> llguidance.LLTokenizer:
    """The grammar library's view of ``engine``'s tokenizer, built once per engine.

    Made from the engine's own token texts (about a second for 152k tokens).
    """
    cached = _tokenizers.get(engine)
    if cached is None:
        cached = _tokenizers[engine] = _build_tokenizer(engine)
    return cached


class GrammarMatcher:
    """One answer's place in its grammar (see the module docstring for how the loop uses it)."""

    def __init__(self, engine: ModelEngine, grammar: str) -> None:
        from llguidance import LLMatcher

        self._matcher = LLMatcher(grammar_tokenizer(engine), grammar, log_level=0)
        if self._matcher.is_error():
            raise SettingsError(f"invalid grammar: {_one_line(self._matcher.get_error())}")
        self._width = engine.vocab.n_vocab
        self._ends = engine.vocab.end_of_generation_ids
        self._drafted = 0  # tokens a draft model drafted into the grammar, to roll back

    @property
    def stopped(self) -> bool:
        """Whether the grammar is complete and allows nothing more."""
        return bool(self._matcher.is_stopped())

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens``, from the first, the grammar allows in order.

        Never past an end-of-generation token: the end comes from the target's own row,
        where the grammar is complete, so nothing is ever verified after it.
        """
        ends = [index for index, token in enumerate(tokens) if token in self._ends]
        tokens = tokens[: ends[0]] if ends else tokens
        if not tokens:
            return 0
        return int(self._matcher.validate_tokens(list(tokens)))

    def allowed(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Which tokens the grammar allows next, as a mask over the logit row."""
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        if self._matcher.is_error():  # e.g. a grammar that can never finish, past its limits
            raise SettingsError(f"the grammar cannot go on: {self._error()}")
        allowed = np.unpackbits(bits, bitorder="little").astype(bool)
        if allowed.shape[0] < self._width:
            allowed = np.concatenate([allowed, np.zeros(self._width - allowed.shape[0], bool)])
        return allowed[: self._width]

    def masked(self, row: LogitRows) -> LogitRows:
        """``row`` with every token the grammar forbids next at -inf (a new array)."""
        allowed = self.allowed()
        if not allowed.any():
            raise SettingsError("the grammar allows no token here: it can never be finished")
        masked: LogitRows = np.where(allowed, row, np.float32(-np.inf)).astype(
            np.float32, copy=False
        )
        return masked

    def masked_rows(self, rows: Iterable[LogitRows], draft: Sequence[int]) -> Iterator[LogitRows]:
        """Rows 0..k for ``draft``, each masked after the draft tokens before it."""
        for index, row in enumerate(rows):
            if index > 0:
                self.consume(draft[index - 1])
            yield self.masked(row)

    def consume(self, token: int) -> None:
        """Move past ``token``; it must be allowed (the masks make sure of it)."""
        if not self._matcher.consume_token(token) or self._matcher.is_error():
            raise SettingsError(f"the grammar cannot take token {token}: {self._error()}")

    def _error(self) -> str:
        """The matcher's error, without the parser state and grammar llguidance appends."""
        return _one_line(self._matcher.get_error()).split(" <state>")[0][:MAX_ERROR_LENGTH]

    def consume_drafted(self, token: int) -> None:
        """Move past a token a draft model drafted (undone by :meth:`rollback_draft`)."""
        self.consume(token)
        self._drafted += 1

    def rollback_draft(self) -> None:
        """Back to where the grammar stood before the draft model drafted."""
        if self._drafted:
            self._matcher.rollback(self._drafted)
            self._drafted = 0

    def forced(self, limit: int) -> list[int]:
        """The next tokens the grammar allows alone (up to ``limit``), without consuming them.

        Where exactly one token is allowed, plain constrained decoding takes it whatever
        the logits say, so drafting it is free and its acceptance certain.
        """
        forced: list[int] = []
        while len(forced) < limit and not self._matcher.is_stopped():
            allowed = np.flatnonzero(self.allowed())
            if allowed.shape[0] != 1:
                break
            token = int(allowed[0])
            if token in self._ends or not self._matcher.consume_token(token):
                break  # the end is the target's own token (allowed_prefix says why)
            forced.append(token)
        if forced:
            self._matcher.rollback(len(forced))
        return forced


def _build_tokenizer(engine: ModelEngine) -> llguidance.LLTokenizer:
    """The grammar library's tokenizer from ``engine``'s token texts.

    Tokens with no text (special ones: chat markers, end of generation) get a name that
    llguidance reads as special (a 0xFF byte first), so the grammar's text never holds them.
    """
    from llguidance import LLTokenizer, TokenizerWrapper

    vocab = engine.vocab
    tokens: list[bytes] = []
    special: list[int] = []
    for token in range(vocab.n_vocab):
        text = engine.token_bytes(token)
        if not text:
            special.append(token)
            text = b"\xff<special_%d>" % token
        tokens.append(text)
    # The grammar's end: every end-of-generation token, the model's EOS first among them.
    ends = sorted(vocab.end_of_generation_ids) or [vocab.eos_id or 0]
    end = vocab.eos_id if vocab.eos_id in ends else ends[0]

    class _EngineTokenizer:
        """What llguidance's TokenizerWrapper reads."""

        eos_token_id = end
        bos_token_id = vocab.bos_id
        special_token_ids = special

        def __init__(self) -> None:
            self.tokens = tokens

        def __call__(self, text: str | bytes) -> list[int]:
            if isinstance(text, bytes):
                text = text.decode("utf-8", errors="replace")
            return engine.tokenize(text, add_special=False, parse_special=False)

    return LLTokenizer(TokenizerWrapper(_EngineTokenizer()), eos_token=ends)


def _text(source: Any, kind: str) -> str:
    if not isinstance(source, str) or not source.strip():
        raise SettingsError(f"a {kind} grammar must be a non-empty string")
    return source


def _one_line(error: object) -> str:
    return " ".join(str(error).split())
