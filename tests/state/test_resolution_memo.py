"""The resolution memo (node.state.resolution_memo) gives what `resolve` gives.

Seeded random forks of a topic (the property tests' generator): every pair and
triple of states is resolved through a memo and directly, in several orders;
the memo must answer the same, from memory the second time, and stay within
its bound of items.
"""

from __future__ import annotations

import itertools
import random

from node.state import resolve
from node.state.resolution_memo import ResolutionMemo
from tests.state.test_resolution_properties import build_forks, random_plan

TOPICS = 12


def _inputs(seed: int):
    graph = build_forks(random_plan(random.Random(seed)), tick_ms=0)
    states = list(graph.state_after.values())
    rng = random.Random(seed)
    sets = [list(pair) for pair in itertools.combinations(states[-6:], 2)]
    sets += [rng.sample(states, 3) for _ in range(4) if len(states) >= 3]
    return graph, sets


def test_the_memo_answers_as_resolve_does() -> None:
    memo = ResolutionMemo()
    for seed in range(TOPICS):
        graph, sets = _inputs(seed)
        for inputs in sets:
            expected = resolve(inputs, graph.source)
            assert memo.resolve(inputs, graph.source) == expected
            hits = memo.hits
            # Another order of the same inputs is the same key: answered from memory.
            assert memo.resolve(list(reversed(inputs)), graph.source) == expected
            assert memo.hits == hits + 1


def test_a_memoised_result_is_a_copy() -> None:
    memo = ResolutionMemo()
    graph, sets = _inputs(3)
    first = memo.resolve(sets[0], graph.source)
    first.clear()
    assert memo.resolve(sets[0], graph.source) == resolve(sets[0], graph.source)


def test_a_repeated_input_counts_once() -> None:
    memo = ResolutionMemo()
    for seed in range(TOPICS):
        graph, sets = _inputs(seed)
        for inputs in sets:
            repeated = [*inputs, inputs[0]]
            assert memo.resolve(repeated, graph.source) == resolve(repeated, graph.source)
            assert memo.resolve(inputs, graph.source) == resolve(inputs, graph.source)


def test_the_memo_keeps_within_its_items() -> None:
    graph, sets = _inputs(7)
    sizes = [sum(len(s) for s in inputs) + len(resolve(inputs, graph.source))
             for inputs in sets]
    memo = ResolutionMemo(max_items=max(sizes) * 2)
    for inputs in sets:
        memo.resolve(inputs, graph.source)
        assert memo.items <= memo.max_items
    assert 0 < len(memo) < len(sets)
    # The newest entry stays; an entry bigger than the bound is never kept.
    assert memo.resolve(sets[-1], graph.source) == resolve(sets[-1], graph.source)
    tiny = ResolutionMemo(max_items=1)
    tiny.resolve(sets[0], graph.source)
    assert len(tiny) == 0 and tiny.items == 0
