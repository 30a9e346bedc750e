"""Retention's expiry policies, read without a server: what `output_expires_after` and
`expires_after` take, and the parameter a bad one is named by (deleting on the real
PostgreSQL is tests/cluster/test_retention.py)."""

import pytest

from quotaflow.compat import retention
from quotaflow.errors import InvalidParameter


@pytest.mark.parametrize(("value", "param", "words"), [
    ({"anchor": "created_at", "seconds": 60}, "output_expires_after.seconds",
     "between 3600 (1 hour) and 2592000 (30 days), got 60"),
    ({"anchor": "created_at", "seconds": 2592001}, "output_expires_after.seconds", "got 2592001"),
    ({"anchor": "created_at", "seconds": "soon"}, "output_expires_after.seconds",
     "whole number of seconds"),
    ({"anchor": "created_at", "seconds": True}, "output_expires_after.seconds", "whole number"),
    ({"anchor": "completed_at", "seconds": 3600}, "output_expires_after.anchor",
     "must be 'created_at'"),
    ({"seconds": 3600}, "output_expires_after.anchor", "got None"),
    ({"anchor": "created_at"}, "output_expires_after.seconds", "got None"),
    ({"anchor": "created_at", "seconds": 3600, "x": 1}, "output_expires_after", "an object"),
    ("3600", "output_expires_after", "an object"),
])
def test_bad_expiry_policies_name_the_parameter(value: object, param: str, words: str) -> None:
    with pytest.raises(InvalidParameter, match=words.replace("(", r"\(").replace(")", r"\)")
                       ) as refused:
        retention.expires_after("output_expires_after", value)
    assert refused.value.param == param


def test_good_expiry_policies() -> None:
    assert retention.expires_after("p", None) is None
    assert retention.expires_after("p", {"anchor": "created_at", "seconds": 3600}) == 3600
    assert retention.expiry_seconds("expires_after", "created_at", "2592000") == 2592000
