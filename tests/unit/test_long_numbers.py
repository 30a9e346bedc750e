"""Integers orjson cannot hold exactly reach the database as written (quotaflow/jsoncodec.py,
quotaflow/ingest/jsonlines.py): a request's numbers are the user's, never rounded."""

import pytest

from quotaflow import jsoncodec
from quotaflow.ingest.jsonlines import load_object


@pytest.mark.parametrize("number", [
    -(2 ** 63) - 1,  # 19 digits, one below int64's least: orjson made it a float
    -(10 ** 19) + 1,
    -(10 ** 19),  # 20 digits
    2 ** 64,  # beyond uint64
    -(2 ** 70),
    12345678901234567890123,
])
def test_integers_beyond_64_bits_are_kept_exact(number: int) -> None:
    obj = load_object(b'{"seed": %d, "n": [1, %d]}' % (number, number))
    assert obj == {"seed": number, "n": [1, number]}
    assert type(obj["seed"]) is int


@pytest.mark.parametrize("number", [-(2 ** 63), 2 ** 63 - 1, 2 ** 64 - 1, -1234567890123456789])
def test_integers_within_64_bits_are_exact_on_the_quick_path(number: int) -> None:
    assert load_object(b'{"seed": %d}' % number) == {"seed": number}


def test_a_long_run_of_digits_inside_a_string_changes_nothing() -> None:
    assert load_object(b'{"id": "-12345678901234567890", "x": 1.5}') == {
        "id": "-12345678901234567890", "x": 1.5}


def test_bodies_parsed_together_keep_a_long_number_whichever_body_holds_it() -> None:
    # Given a claim's bodies, one of them holding an integer beyond 64 bits
    big = 2 ** 70
    texts = ['{"seed": 1}', f'{{"seed": {big}}}', '{"n": [1.5, "x"]}']
    # When they are parsed together (the test for long numbers made once over all)
    values = jsoncodec.loads_many(texts)
    # Then each is what loads gives alone, the long one exact
    assert values == [jsoncodec.loads(text) for text in texts]
    assert values[1]["seed"] == big and type(values[1]["seed"]) is int
    # And without one, the quick path gives the same objects
    assert jsoncodec.loads_many([texts[0], texts[2]]) == [{"seed": 1}, {"n": [1.5, "x"]}]
    assert jsoncodec.loads_many([]) == []
