"""Whether a draft model can draft for a main model: llama.cpp's rule of one shared tokenizer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from backends.errors import IncompatiblePairError

if TYPE_CHECKING:
    from backends.models.gguf_info import ModelInfo, VocabInfo

# The same limits as llama.cpp's common/speculative.cpp (common_speculative_are_compatible):
# vocabularies may differ by a few padding tokens at the end, and ids below 5 (the special
# tokens, which often differ in text only) are not compared.
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5

_QUOTED_TOKEN_MAX_CHARS = 40


def compatibility_problem(main: ModelInfo, draft: ModelInfo) -> str | None:
    """Say why draft cannot draft for main, in one line, or None when llama.cpp accepts the pair.

    The checks and their order are llama.cpp's: the same vocabulary type; the same add-BOS
    flag and, only when BOS is added, the same BOS id; likewise for EOS; sizes within 128
    tokens; identical token texts from id 5 up to the smaller vocabulary.
    """
    main_vocab, draft_vocab = main.vocab, draft.vocab
    main_name, draft_name = _quote(main.name), _quote(draft.name)

    families = _families(main, draft)
    if main_vocab.vocab_type != draft_vocab.vocab_type:
        return (
            f"incompatible pair: {families}draft {draft_name} has the "
            f"{_describe_type(draft_vocab)} vocabulary of {draft_vocab.size:,} tokens, main "
            f"{main_name} has {_describe_type(main_vocab)} with {main_vocab.size:,} "
            "(llama.cpp needs the same tokenizer)"
        )

    for token_kind in ("BOS", "EOS"):
        problem = _special_token_problem(token_kind, main, draft)
        if problem is not None:
            return problem

    size_difference = abs(main_vocab.size - draft_vocab.size)
    if size_difference > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return (
            f"incompatible pair: {families}the vocabularies differ by {size_difference:,} tokens "
            f"(main {main_name} has {main_vocab.size:,}, "
            f"draft {draft_name} has {draft_vocab.size:,}; "
            f"llama.cpp allows at most {SPEC_VOCAB_MAX_SIZE_DIFFERENCE})"
        )

    token_id = first_differing_token(main_vocab, draft_vocab)
    if token_id is not None:
        differing, compared = count_differing_tokens(main_vocab, draft_vocab)
        return (
            f"incompatible pair: {families}{differing:,} of {compared:,} token texts differ; the "
            f"first, token {token_id}, is {_quote_token(main_vocab, token_id)} in main "
            f"{main_name} but {_quote_token(draft_vocab, token_id)} in draft {draft_name} "
            "(llama.cpp needs identical token texts)"
        )
    return None


def check_compatibility(main: ModelInfo, draft: ModelInfo) -> None:
    """Raise IncompatiblePairError, with the reason, unless draft can draft for main."""
    problem = compatibility_problem(main, draft)
    if problem is not None:
        raise IncompatiblePairError(problem)


def first_differing_token(main: VocabInfo, draft: VocabInfo) -> int | None:
    """The first id (from 5, below both sizes) whose text differs between the vocabularies."""
    start = SPEC_VOCAB_CHECK_START_TOKEN_ID
    end = min(main.size, draft.size, len(main.tokens), len(draft.tokens))
    if main.tokens is draft.tokens or main.tokens[start:end] == draft.tokens[start:end]:
        return None  # one C-speed comparison settles the common case
    for token_id in range(start, end):
        if main.tokens[token_id] != draft.tokens[token_id]:
            return token_id
    return None


def count_differing_tokens(main: VocabInfo, draft: VocabInfo) -> tuple[int, int]:
    """(how many ids differ in text, how many were compared), over llama.cpp's checked range."""
    start = SPEC_VOCAB_CHECK_START_TOKEN_ID
    end = min(main.size, draft.size, len(main.tokens), len(draft.tokens))
    differing = sum(
        1 for token_id in range(start, end) if main.tokens[token_id] != draft.tokens[token_id]
    )
    return differing, max(0, end - start)


def _families(main: ModelInfo, draft: ModelInfo) -> str:
    """A prefix naming both families when the architectures differ, else ""."""
    if main.architecture == draft.architecture:
        return ""
    return f"another family ({draft.architecture}; main: {main.architecture}): "


def _special_token_problem(token_kind: str, main: ModelInfo, draft: ModelInfo) -> str | None:
    attribute = token_kind.lower()
    main_adds: bool = getattr(main.vocab, f"add_{attribute}")
    draft_adds: bool = getattr(draft.vocab, f"add_{attribute}")
    if main_adds != draft_adds:
        adder, other = (main, draft) if main_adds else (draft, main)
        adder_role, other_role = ("main", "draft") if main_adds else ("draft", "main")
        return (
            f"incompatible pair: {adder_role} {_quote(adder.name)} adds a {token_kind} token to "
            f"prompts, {other_role} {_quote(other.name)} does not "
            f"(llama.cpp needs the same add-{token_kind} setting)"
        )
    # Like llama.cpp, the ids only matter when the token is actually added.
    main_id: int | None = getattr(main.vocab, f"{attribute}_id")
    draft_id: int | None = getattr(draft.vocab, f"{attribute}_id")
    if main_adds and main_id != draft_id:
        return (
            f"incompatible pair: main {_quote(main.name)} uses {token_kind} token "
            f"{_describe_id(main.vocab, main_id)}, draft {_quote(draft.name)} uses "
            f"{_describe_id(draft.vocab, draft_id)} (llama.cpp needs the same {token_kind} token)"
        )
    return None


def _describe_type(vocab: VocabInfo) -> str:
    if vocab.vocab_type == vocab.model_type:
        return _quote(vocab.model_type or "unknown")
    return f"{vocab.vocab_type} ({vocab.model_type})"


def _describe_id(vocab: VocabInfo, token_id: int | None) -> str:
    if token_id is None:
        return "none"
    return f"{token_id} {_quote_token(vocab, token_id)}"


def _quote_token(vocab: VocabInfo, token_id: int) -> str:
    if not 0 <= token_id < len(vocab.tokens):
        return "(no text)"
    return _quote(vocab.tokens[token_id])


def _quote(text: str) -> str:
    """repr() keeps the message on one line: newlines and control characters are escaped."""
    if len(text) > _QUOTED_TOKEN_MAX_CHARS:
        text = text[: _QUOTED_TOKEN_MAX_CHARS - 1] + "…"
    return repr(text)
