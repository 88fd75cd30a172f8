"""Would a tree with the draft model's second choice pay? (issue 14, tree verification)

A tree verification batch holds, besides the draft's chain, its second choice at one
position as a sibling branch: when the target rejects the chain there and takes the
second choice, the sibling's row gives one more token in the same round. Two
measurements on the default pair (llama.cpp, temperature 0):

1. **Exactness and cost.** The main model is loaded with two sequences sharing one KV
   buffer (``n_seq_max`` 2, ``kv_unified``). After a plain greedy answer to the prose
   prompt, at every 6th answer position a batch holds a chain with a wrong token at depth
   d (0, 1, 2) in sequence 0 and the right token at depth d in sequence 1 (the chain's
   first d tokens, and the cache, in both). The rows a tree would use must equal plain
   decoding's logits bit for bit, and so must plain decoding after the branch is dropped
   (the cache stays in position order). Prints the checks and the batch costs by rows.
2. **An oracle over real auto runs.** For every round in which the target rejected a
   draft-model token, whether the draft's second choice there (recorded as it drafted)
   was the target's token. Each such hit would add one token; every draft-model round
   would pay one more verification row (its cost from the planner's calibration).
   Prints hits and the estimated speed ratio, with and without the extra rows' cost.

    .venv/bin/python -m benchmarks.sibling_tree [--prompts prose,docstrings] [--max-tokens 160]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.engines.interface import ChatMessage
from backends.engines.llama import LlamaEngine, LlamaLoadSettings
from backends.engines.weight_placement import cpu_model_name
from backends.models.provision import DEFAULT_DRAFT_KEY, DEFAULT_MAIN_KEY, model_path
from backends.speculation.drafters import DraftModelDrafter
from backends.speculation.loop import SpeculativeDecoder
from backends.speculation.methods import build_decoder
from backends.speculation.types import GenerationSettings
from benchmarks.vs_llama_cpp import PROMPTS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from backends.engines.interface import LogitRows
    from backends.speculation.types import Draft

CONTEXT = 1024
EXACT_ANSWER_TOKENS = 90
EXACT_EVERY = 6
SIBLING_DEPTHS = (0, 1, 2)


def _two_sequence_context(params: Any) -> None:
    params.n_seq_max = 2
    params.kv_unified = True


def check_sibling_exactness(text: str) -> None:
    """Part 1: sibling rows and the cache after them against plain decoding, bitwise."""
    import llama_cpp

    plain_init = llama_cpp.llama_init_from_model

    def init_two_sequences(model: Any, params: Any) -> Any:
        _two_sequence_context(params)
        return plain_init(model, params)

    llama_cpp.llama_init_from_model = init_two_sequences
    try:
        engine = LlamaEngine(model_path(DEFAULT_MAIN_KEY), LlamaLoadSettings(n_ctx=CONTEXT))
    finally:
        llama_cpp.llama_init_from_model = plain_init
    try:
        _exactness(engine, text)
    finally:
        engine.close()


def _exactness(engine: LlamaEngine, text: str) -> None:
    prompt = SpeculativeDecoder(engine).prompt_tokens([ChatMessage("user", text)])
    engine.truncate(0)
    plain_rows = [engine.evaluate(prompt, 1)[0].copy()]  # plain_rows[i] predicts answer[i]
    answer: list[int] = []
    for _ in range(EXACT_ANSWER_TOKENS):
        answer.append(int(np.argmax(plain_rows[-1])))
        plain_rows.append(engine.evaluate(answer[-1:], 1)[0].copy())
    # The engine keeps one sequence; this drives its llama.cpp context directly.
    native, context, memory = engine._llama, engine._ctx, engine._memory
    batch = native.llama_batch_init(64, 0, 2)
    base = len(prompt)
    exact = differ = 0
    seconds_by_rows: dict[int, list[float]] = {}
    try:
        for at in range(0, EXACT_ANSWER_TOKENS - 10, EXACT_EVERY):
            for depth in SIBLING_DEPTHS:
                engine.truncate(base + at)
                have = len(engine.cached_tokens) - base
                if have < at:
                    engine.evaluate(answer[have:at], 1)
                native.llama_memory_seq_cp(memory, 0, 1, -1, -1)
                wrong = (answer[at + depth] + 7) % 1000 + 100
                chain = [*answer[at : at + depth], wrong, *answer[at + depth + 1 : at + depth + 3]]
                rows = [
                    (t, base + at + i, (0, 1) if i < depth else (0,)) for i, t in enumerate(chain)
                ]
                rows.append((answer[at + depth], base + at + depth, (1,)))
                for index, (token, position, sequences) in enumerate(rows):
                    batch.token[index] = token
                    batch.pos[index] = position
                    batch.logits[index] = True
                    batch.n_seq_id[index] = len(sequences)
                    for slot, sequence in enumerate(sequences):
                        batch.seq_id[index][slot] = sequence
                batch.n_tokens = len(rows)
                started = time.perf_counter()
                if native.llama_decode(context, batch) != 0:
                    raise SystemExit("llama_decode refused a two-sequence batch")
                seconds_by_rows.setdefault(len(rows), []).append(time.perf_counter() - started)
                logits = np.ctypeslib.as_array(
                    native.llama_get_logits(context), shape=(len(rows), engine.vocab.n_vocab)
                ).copy()
                pairs = [(logits[i], plain_rows[at + i + 1]) for i in range(depth)]
                pairs.append((logits[-1], plain_rows[at + depth + 1]))  # the sibling's row
                native.llama_memory_seq_rm(memory, 1, -1, -1)
                native.llama_memory_seq_rm(memory, 0, base + at, -1)
                engine._tokens[base + at :] = []
                after = engine.evaluate(answer[at : at + depth + 3], depth + 3)
                pairs += [(after[i], plain_rows[at + i + 1]) for i in range(depth + 3)]
                for ours, plain in pairs:
                    if np.array_equal(ours, plain):
                        exact += 1
                    else:
                        differ += 1
    finally:
        native.llama_batch_free(batch)
    print(f"sibling rows and the rows after them: {exact} bit-exact, {differ} differ")
    costs = {rows: 1000 * statistics.median(s) for rows, s in sorted(seconds_by_rows.items())}
    print(
        "two-sequence batch costs: " + ", ".join(f"{r} rows {ms:.1f} ms" for r, ms in costs.items())
    )


@dataclass
class _DraftCall:
    position: int  # answer tokens before the draft
    tokens: list[int]
    second_choices: list[int]  # per draft step, the draft model's second choice


def sibling_oracle(key: str, text: str, max_tokens: int) -> None:
    """Part 2: second-choice hits in one real auto run of ``key``."""
    main = LlamaEngine(model_path(DEFAULT_MAIN_KEY), LlamaLoadSettings(n_ctx=CONTEXT))
    draft = LlamaEngine(
        model_path(DEFAULT_DRAFT_KEY), LlamaLoadSettings(n_ctx=CONTEXT), is_draft=True
    )
    try:
        _oracle(key, text, max_tokens, main, draft)
    finally:
        draft.close()
        main.close()


def _oracle(key: str, text: str, max_tokens: int, main: LlamaEngine, draft: LlamaEngine) -> None:
    decoder = build_decoder("auto", main, draft)
    decoder.prepare()
    planner = decoder.planner
    assert planner is not None
    drafter = next(d for d in planner.drafters if isinstance(d, DraftModelDrafter))
    prompt = decoder.prompt_tokens([ChatMessage("user", text)])
    calls: list[_DraftCall] = []
    seconds: list[int] = []
    draft_evaluate, draft_method = draft.evaluate, drafter.draft

    def evaluate(tokens: Sequence[int], logit_rows: int) -> LogitRows:
        rows = draft_evaluate(tokens, logit_rows)
        seconds.append(int(np.argsort(-rows[-1])[1]))
        return rows

    def recorded(context: Sequence[int], *args: Any, **kwargs: Any) -> Draft:
        seconds.clear()
        made = draft_method(context, *args, **kwargs)
        calls.append(_DraftCall(len(context) - len(prompt), list(made.tokens), list(seconds)))
        return made

    draft.evaluate = evaluate  # type: ignore[method-assign]
    drafter.draft = recorded  # type: ignore[method-assign]
    result = decoder.run(prompt, GenerationSettings(max_tokens=max_tokens))
    answer = [t.token_id for t in result.tokens]
    stats = result.stats
    costs = planner.target_costs
    rejected = hits = 0
    extra_seconds = 0.0
    rounds = [call for call in calls if call.tokens]
    for call in rounds:
        length = len(call.tokens)
        extra_seconds += max(0.0, costs.cost(length + 2) - costs.cost(length + 1))
        kept = 0
        while kept < length and answer[call.position + kept : call.position + kept + 1] == [
            call.tokens[kept]
        ]:
            kept += 1
        if kept == length or call.position + kept >= len(answer):
            continue
        rejected += 1
        hits += call.second_choices[kept] == answer[call.position + kept]
    seconds_taken, tokens = stats.generation_seconds, stats.generated_tokens
    saved = hits * seconds_taken / tokens  # a hit saves about one token's average time
    with_rows = seconds_taken / (seconds_taken + extra_seconds - saved)
    free_rows = seconds_taken / (seconds_taken - saved)
    print(
        f"{key}: {tokens} tokens, {stats.rounds} rounds, {len(rounds)} draft-model rounds, "
        f"{rejected} of them rejected, the second choice right in {hits}: "
        f"x{with_rows:.3f} with one more row per draft-model round "
        f"(+{1000 * extra_seconds:.0f} ms), x{free_rows:.3f} if rows were free "
        f"(auto ran at {tokens / seconds_taken:.1f} tok/s)"
    )


def main() -> None:
    """Run both parts and print what they found."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--prompts", default="prose,docstrings,new-function")
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    texts = {p.key: p.text for p in PROMPTS}
    wanted = args.prompts.split(",")
    unknown = sorted(set(wanted) - set(texts))
    if unknown:
        parser.error(f"unknown prompt {', '.join(unknown)} (known: {', '.join(texts)})")
    print(f"{cpu_model_name()}, default pair, temperature 0")
    check_sibling_exactness(texts["prose"])
    for key in wanted:
        sibling_oracle(key, texts[key], args.max_tokens)


if __name__ == "__main__":
    main()
