"""Integers orjson cannot hold exactly reach the database as written (quotaflow/jsoncodec.py,
quotaflow/ingest/jsonlines.py): a request's numbers are the user's, never rounded. And
what is not JSON (NaN, Infinity) is refused wherever quotaflow parses it."""

import pytest

from quotaflow import jsoncodec
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import RetryableProviderError
from quotaflow.ingest.jsonlines import load_object
from quotaflow.providers.openai_compat import OpenAICompatProvider


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


@pytest.mark.parametrize("text", [b'{"x": NaN}', b'{"x": [1, Infinity]}', b'{"x": -Infinity}',
                                  b'{"seed": 123456789012345678901234, "x": NaN}'])
def test_nan_and_infinity_are_not_json(text: bytes) -> None:
    # Python's json takes them, PostgreSQL's json refuses them: an answer holding one
    # is not JSON, whichever parser reads it (the long number takes the slow one)
    with pytest.raises(ValueError):
        jsoncodec.loads(text)
    with pytest.raises(ValueError):
        jsoncodec.loads_many([text.decode()])


def test_an_answer_holding_nan_is_a_malformed_answer_not_a_stored_one() -> None:
    # Given an OpenAI-compatible deployment answering 200 with NaN in its body
    provider = OpenAICompatProvider(Deployment(
        name="gpt", provider="openai", base_url="http://127.0.0.1:1/v1", model="m",
        rpm=1000, tpm=1000000))
    # Then the answer is refused as malformed (retried, then the line fails with that
    # reason) rather than kept as text no chunk write could store
    with pytest.raises(RetryableProviderError, match="malformed response"):
        provider._interpret(200, {}, None, b'{"choices": [], "score": NaN}')
