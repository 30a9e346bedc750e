"""Three deployments of one model on real workers: work spreads in proportion to their
budgets, a deployment that starts failing is circuit broken and the others take its share,
and once it recovers a probe closes its circuit again."""

import time
from pathlib import Path

import httpx
import pytest

from quotaflow.budget.circuit import CircuitState, RedisCircuitBreaker
from quotaflow.config import Settings
from tests.harness.cluster import (
    one_result_per_line,
    start_provider,
    start_workers,
    submit_and_finish,
)
from tests.harness.factories import chat_line
from tests.harness.servers import REDIS_URL, service_env

# Per-minute windows hold a whole minute's budget, more than these jobs ask for: the
# providers are never saturated, so the split is the router's doing alone (saturated
# providers each deliver their own rate whatever the routing, and would prove nothing).
RPM = {"a": 1200, "b": 2400, "c": 3600}
COOLDOWN_S = 2

pytestmark = pytest.mark.timeout(300)


def deployments_toml(urls: dict[str, str]) -> str:
    tables = "".join(
        f'[deployments.{name}]\nprovider = "openai"\nbase_url = "{url}/v1"\nmodel = "{name}"\n'
        f"rpm = {RPM[name]}\ntpm = 100000000\ntimeout_s = 2\n"
        f"circuit_failures = 3\ncircuit_cooldown_s = {COOLDOWN_S}\n"
        for name, url in urls.items())
    return tables + '[routes]\n"*" = ["a", "b", "c"]\n'


def run_job(sessions, settings: Settings, prefix: str, items: int) -> dict:
    view = submit_and_finish(sessions, settings,
                             [chat_line(f"{prefix}{i}") for i in range(items)], timeout=120)
    assert view["status"] == "completed"
    assert view["request_counts"]["completed"] == items
    assert one_result_per_line(sessions, view["id"]) == (items, items)
    return view


def provider_stats(urls: dict[str, str], reset: bool = False) -> dict[str, dict]:
    stats = {name: httpx.get(f"{url}/stats").json() for name, url in urls.items()}
    if reset:
        for url in urls.values():
            httpx.post(f"{url}/stats/reset").raise_for_status()
    return stats


def shares(stats: dict[str, dict], names: list[str]) -> dict[str, float]:
    total = sum(stats[name]["admitted"] for name in names)
    result = {name: stats[name]["admitted"] / total for name in names}
    print("  ".join(f"{name}: {stats[name]['admitted']} admitted ({result[name]:.3f}), "
                    f"{stats[name]['requests_total']} calls, "
                    f"{stats[name]['rejected_429']} 429s" for name in names))  # shown by -s
    return result


def test_work_follows_the_budgets_and_avoids_a_failing_deployment(
        pg_url: str, pg_sessions, redis_url: str, tmp_path: Path) -> None:
    procs, urls = [], {}
    try:
        # Given three strict providers of 1200, 2400 and 3600 RPM,
        # one deployment each in one group, and two Celery workers
        for name, rpm in RPM.items():
            (tmp_path / name).mkdir()  # a log folder each
            proc, urls[name] = start_provider(tmp_path / name, "--rpm", str(rpm),
                                              "--tpm", "100000000",
                                              "--latency-ms", "20")
            procs.append(proc)
        path = tmp_path / "deployments.toml"
        path.write_text(deployments_toml(urls))
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(path))
        procs += start_workers(env, tmp_path, "routing")
        # Runs of 20 (none growing): a run never has more waiting than one deployment's
        # max_concurrency, which would spill its calls onto the others whatever budgets.
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=20,
                            largest_batch_size=20, deployments_file=path, _env_file=None)
        deployments = settings.load_deployments()

        # When a job of 1800 requests runs
        run_job(pg_sessions, settings, "spread", 1800)
        # Then each provider took its budget's share, within 10%, without a single 429
        spread = provider_stats(urls, reset=True)
        assert [spread[name]["rejected_429"] for name in RPM] == [0, 0, 0]
        for name, share in shares(spread, list(RPM)).items():
            assert share == pytest.approx(RPM[name] / sum(RPM.values()), rel=0.10), spread

        # When c starts failing every request with a 500 and another job runs
        httpx.put(f"{urls['c']}/faults", json={"500": 1.0}).raise_for_status()
        run_job(pg_sessions, settings, "broken", 1200)
        broken = provider_stats(urls, reset=True)
        # Then every request still succeeded, on a and b, in their budgets' proportion;
        # c saw its circuit's run of failures, what was in flight then, and a probe per
        # cooldown, and its circuit is open
        assert broken["c"]["admitted"] == 0
        assert broken["c"]["requests_total"] < 90, broken["c"]
        assert broken["a"]["admitted"] + broken["b"]["admitted"] == 1200
        assert shares(broken, ["a", "b"])["a"] == pytest.approx(1 / 3, rel=0.10), broken
        assert [broken[name]["rejected_429"] for name in ("a", "b")] == [0, 0]
        circuits = RedisCircuitBreaker(REDIS_URL)
        assert circuits.state(deployments.deployments["c"]).state != CircuitState.CLOSED

        # When c recovers, a probe after the cooldown closes its circuit and it works again
        httpx.put(f"{urls['c']}/faults", json={"500": 0}).raise_for_status()
        time.sleep(COOLDOWN_S + 0.5)
        run_job(pg_sessions, settings, "healed", 600)
        healed = provider_stats(urls)
        assert healed["c"]["admitted"] > 100, healed["c"]
        assert circuits.state(deployments.deployments["c"]).state == CircuitState.CLOSED
        circuits.close()
    finally:
        for proc in reversed(procs):
            proc.stop()
