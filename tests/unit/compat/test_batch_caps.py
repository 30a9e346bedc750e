"""A batch's own caps through OpenAI's Batch API: the body's fields (what the OpenAI SDK
sends with extra_body), else metadata; a bad value is refused naming where it was."""

import pytest

from quotaflow.compat.openai_batches import cap_choice
from quotaflow.errors import InvalidParameter


def test_the_body_field_wins_over_metadata() -> None:
    assert cap_choice("max_rpm", 120, {"quotaflow_max_rpm": "60"}) == 120
    assert cap_choice("max_rpm", None, {"quotaflow_max_rpm": "60"}) == 60
    assert cap_choice("max_tpm", None, {"team": "search"}) is None
    assert cap_choice("max_tpm", None, None) is None


@pytest.mark.parametrize("value", ["", "sixty", "-3", "1.5", "0"])
def test_a_bad_metadata_cap_names_its_key(value: str) -> None:
    with pytest.raises(InvalidParameter) as refused:
        cap_choice("max_tpm", None, {"quotaflow_max_tpm": value})
    assert refused.value.param == "metadata.quotaflow_max_tpm"
    assert "quotaflow_max_tpm" in str(refused.value)
