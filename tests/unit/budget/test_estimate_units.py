"""`quotaflow estimate`'s arithmetic without services: which tokenizer counts a model's
prompts, and the time a demand takes at its budgets (quotaflow/budget/job_time.py)."""

import pytest

from cli.estimate import duration as shown_duration
from quotaflow.budget.job_time import duration, job_duration, route_budgets
from quotaflow.deployments.catalog import Deployments, Route
from quotaflow.deployments.deployment import Deployment
from quotaflow.ingest.tokenizers import CHARS_PER_4, counter_for, encoding_name


@pytest.mark.parametrize(("model", "encoding"), [
    ("gpt-4o-mini", "o200k_base"),          # in bpe-openai's own table
    ("gpt-4o-2024-08-06", "o200k_base"),    # by prefix
    ("gpt-4.1-nano", "o200k_base"),
    ("gpt-5-mini", "o200k_base"),
    ("o1-preview", "o200k_base"),
    ("o3-mini", "o200k_base"),
    ("openai/gpt-4o", "o200k_base"),        # a provider prefix is ignored
    ("gpt-4-turbo", "cl100k_base"),
    ("gpt-3.5-turbo-0125", "cl100k_base"),
    ("text-embedding-3-small", "cl100k_base"),
    ("llama-3.1-8b", None),                 # not OpenAI's: characters / 4
    ("mock", None),
    ("davinci", None),                      # r50k: not bundled, so not guessed
])
def test_the_tokenizer_is_chosen_by_the_model_name(model: str, encoding: str | None) -> None:
    assert encoding_name(model) == encoding
    assert counter_for(model).name == (encoding or CHARS_PER_4)


def test_counters_count_differently_and_say_so() -> None:
    text = "1234567890" * 10  # o200k_base splits digits in threes: 34 tokens, not 25
    assert counter_for("gpt-4o").count(text) == 34
    assert counter_for("llama").count(text) == 25
    # special-token text is ordinary text in a prompt, never an error
    assert counter_for("gpt-4o").count("<|endoftext|>") > 1


def _deployment(name: str, **limits: object) -> Deployment:
    return Deployment(name=name, provider="openai", model=name, base_url="http://x/v1",
                      **{"rpm": 120, "tpm": 1_000_000, **limits})


def test_rpm_binds_and_the_full_bucket_counts() -> None:
    # 120 rpm over a minute: 119.5 requests at once (0.25 s of refill kept as margin),
    # then 2 a second: the 150th is admitted 15.25 s after the first, not 75 s.
    budget = (_deployment("a")).budget
    took = duration([budget], requests=150, tokens=150 * 50, floor=0.0)
    assert took.binding == "rpm"
    assert took.seconds == pytest.approx(15.25)
    assert took.tpm_seconds == 0


def test_tpm_binds_at_a_per_second_provider() -> None:
    # 6,000 tpm enforced per second: 100 tokens a second, 75 usable at once.
    budget = (_deployment("a", rpm=6_000, tpm=6_000, burst_seconds=1)).budget
    took = duration([budget], requests=30, tokens=1_575, floor=0.0)
    assert took.binding == "tpm"
    assert took.seconds == pytest.approx(15.0)
    assert took.rpm_seconds == 0


def test_a_queue_floor_slows_only_the_start() -> None:
    budget = (_deployment("a")).budget
    realtime = duration([budget], 150, 1, floor=0.0).seconds
    bulk = duration([budget], 150, 1, floor=0.2).seconds  # 24 requests left to realtime
    assert bulk - realtime == pytest.approx(24 / 2)


def test_a_job_that_fits_the_buckets_takes_no_time() -> None:
    took = duration([(_deployment("a")).budget], requests=10, tokens=500, floor=0.0)
    assert took.seconds == 0 and took.binding == "rpm"


def test_budgets_add_up_and_a_shared_quota_counts_once() -> None:
    deployments = Deployments(
        deployments={"a": _deployment("a"), "b": _deployment("b"),
                     "c": _deployment("c", quota="org"), "d": _deployment("d", quota="org")},
        routes={"two": Route(deployments=["a", "b"]), "shared": Route(deployments=["c", "d"]),
                "with-fallback": Route(deployments=["a"], fallback=["b"])})
    assert set(route_budgets(deployments, "two")) == {"a", "b"}
    assert set(route_budgets(deployments, "shared")) == {"quota:org"}
    assert set(route_budgets(deployments, "with-fallback")) == {"a"}
    two = job_duration(deployments, {"two": (360, 1)}, 0.0)
    shared = job_duration(deployments, {"shared": (360, 1)}, 0.0)
    assert two is not None and shared is not None
    assert two.seconds == pytest.approx((360 - 239) / 4)  # 240 rpm, 4 a second
    assert shared.seconds == pytest.approx((360 - 119.5) / 2)


def test_routes_sharing_a_deployment_are_one_demand() -> None:
    deployments = Deployments(
        deployments={"a": _deployment("a"), "b": _deployment("b")},
        routes={"x": Route(deployments=["a"]), "y": Route(deployments=["a"]),
                "z": Route(deployments=["b"])})
    together = job_duration(deployments, {"x": (150, 1), "y": (150, 1), "z": (150, 1)}, 0.0)
    assert together is not None
    assert together.seconds == pytest.approx((300 - 119.5) / 2)  # x and y; z beside them


def test_durations_read_as_people_read_them() -> None:
    assert shown_duration(15.25) == "15.2 s"
    assert shown_duration(185) == "3 min 05 s"
    assert shown_duration(7440) == "2 h 04 min"
