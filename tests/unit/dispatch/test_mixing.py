"""Size-aware dispatch order (quotaflow/dispatch/mixing.py), without services."""

import random

from quotaflow.dispatch.mixing import mixed_order
from quotaflow.dispatch.queues import BatchRef


def refs(count: int) -> list[BatchRef]:
    return [BatchRef("j", i * 10, i * 10 + 9) for i in range(count)]


def test_a_clustered_file_is_queued_at_the_jobs_own_mix() -> None:
    # 6 light batches (20 tokens a request), then 4 heavy ones (300)
    loads = [(10, 200)] * 6 + [(10, 3000)] * 4
    order = [ref.first_line // 10 for ref in mixed_order(refs(10), loads)]
    assert sorted(order) == list(range(10))  # every batch once
    # each class keeps its line order
    assert [i for i in order if i < 6] == list(range(6))
    assert [i for i in order if i >= 6] == list(range(6, 10))
    # and every prefix asks for tokens per request near the job's (1,320 / 10 = 132)
    ratio = sum(t for _, t in loads) / sum(r for r, _ in loads)
    for end in range(4, 11):
        done = [loads[i] for i in order[:end]]
        mix = sum(t for _, t in done) / sum(r for r, _ in done)
        assert abs(mix - ratio) / ratio < 0.6, (order, end, mix)
    # where line order would ask 20 a request for the first 6 batches
    assert order[:2] != [0, 1]


def test_a_mixed_file_keeps_its_line_order_give_or_take_a_neighbour() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        loads = [(100, sum(rng.choice((20, 300)) for _ in range(100))) for _ in range(30)]
        order = [ref.first_line // 10 for ref in mixed_order(refs(30), loads)]
        assert all(abs(position - line) <= 2 for position, line in enumerate(order)), order


def test_unknown_loads_keep_line_order() -> None:
    assert mixed_order(refs(5), []) == refs(5)
    assert mixed_order(refs(5), [(1, 0)] * 5) == refs(5)
