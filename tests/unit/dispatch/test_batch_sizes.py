"""A job's batches: the first GROW_EVERY at QUOTAFLOW_BATCH_SIZE, then doubling to the largest."""

from itertools import islice

from quotaflow.config import Settings
from quotaflow.dispatch.batch_sizes import GROW_EVERY, batch_sizes, cut, sizes_for


def test_sizes_double_every_grow_every_batches_up_to_the_largest() -> None:
    sizes = list(islice(batch_sizes(100, 800), 5 * GROW_EVERY))
    assert sizes == ([100] * GROW_EVERY + [200] * GROW_EVERY + [400] * GROW_EVERY
                     + [800] * 2 * GROW_EVERY)


def test_a_largest_at_or_below_the_first_size_keeps_every_batch_alike() -> None:
    assert set(islice(batch_sizes(100, 100), 4 * GROW_EVERY)) == {100}
    assert set(islice(batch_sizes(500, 100), 4 * GROW_EVERY)) == {500}
    assert set(islice(batch_sizes(300, 500), 4 * GROW_EVERY)) == {300, 500}


def test_cut_covers_every_line_once_in_order() -> None:
    lines = [n for n in range(1, 1000) if n % 7]  # gaps, as pending lines after dedup
    batches = cut("job", lines, batch_sizes(3, 12))
    covered = [n for b in batches for n in lines if b.first_line <= n <= b.last_line]
    assert covered == lines
    counts = [sum(b.first_line <= n <= b.last_line for n in lines) for b in batches]
    assert counts[:GROW_EVERY] == [3] * GROW_EVERY
    assert counts[GROW_EVERY:2 * GROW_EVERY] == [6] * GROW_EVERY
    assert set(counts[3 * GROW_EVERY:-1]) == {12} and 0 < counts[-1] <= 12


def test_the_settings_name_the_first_and_the_largest() -> None:
    settings = Settings(_env_file=None, batch_size=50, largest_batch_size=200)
    assert list(islice(sizes_for(settings), 3 * GROW_EVERY))[::GROW_EVERY] == [50, 100, 200]
    assert cut("job", [], sizes_for(settings)) == []
