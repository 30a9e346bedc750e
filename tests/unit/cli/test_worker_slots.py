"""Which `quotaflow worker` keeps a realtime slot (issue 30, part 6): the plain command
and any worker consuming realtime beside other queues start a threads companion on
`realtime` alone; a worker without realtime, with one queue, a --deployment worker and
--realtime-slots 0 exec one Celery worker as before. The slot's effect under a flood is
measured in tests/cluster/test_realtime_flood.py; the supervisor in
tests/cluster/test_worker_group.py."""

from typing import Any

import pytest
from click.testing import CliRunner

from cli import services
from cli.main import cli
from cli.worker_group import Child, companion_node
from quotaflow import preflight


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(preflight, "ensure_ready", lambda *_a, **_k: None)
    monkeypatch.setattr(services, "_exec_celery",
                        lambda *argv, env=None: seen.update(exec=list(argv), env=env))
    monkeypatch.setattr(services.worker_group, "exec_or_group",
                        lambda children: seen.update(group=list(children)))
    return seen


def _queues(argv: list[str]) -> str:
    return argv[argv.index("-Q") + 1]


def test_a_plain_worker_keeps_a_thread_for_realtime(started: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli, ["worker", "--concurrency", "4", "--name", "w1@host"])
    assert result.exit_code == 0, result.output
    main, slot = started["group"]
    assert isinstance(main, Child) and isinstance(slot, Child)
    # the pool keeps every queue, realtime included, at the concurrency asked for
    assert _queues(main.argv) == "realtime,standard,bulk"
    assert main.argv[main.argv.index("--concurrency") + 1] == "4"
    assert main.argv[main.argv.index("-n") + 1] == "w1@host"
    # the slot: realtime alone, one thread, a name of its own
    assert _queues(slot.argv) == "realtime"
    assert slot.argv[slot.argv.index("--concurrency") + 1] == "1"
    assert slot.argv[slot.argv.index("--pool") + 1] == "threads"
    assert slot.argv[slot.argv.index("-n") + 1] == "w1-realtime@host"
    # the pool's main process delivers webhooks and polls provider batches; the slot not
    assert slot.env["QUOTAFLOW_WEBHOOK_DELIVERY"] == "false"
    assert slot.env["QUOTAFLOW_PROVIDER_BATCH_LOOP"] == "false"
    assert "QUOTAFLOW_WORKER_METRICS_PORT" in slot.drop


def test_the_slot_writes_its_metrics_where_the_pool_serves_them(
        started: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli, ["worker", "--metrics-port", "9101",
                                      "--realtime-slots", "2"])
    assert result.exit_code == 0, result.output
    main, slot = started["group"]
    assert main.env["QUOTAFLOW_WORKER_METRICS_PORT"] == "9101"
    assert slot.env["PROMETHEUS_MULTIPROC_DIR"] == main.env["PROMETHEUS_MULTIPROC_DIR"]
    assert slot.argv[slot.argv.index("--concurrency") + 1] == "2"


@pytest.mark.parametrize("args", [["--queues", "standard,bulk"], ["--queues", "realtime"],
                                  ["--realtime-slots", "0"]])
def test_no_slot_where_it_would_change_nothing_or_is_refused(
        started: dict[str, Any], args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["worker", *args])
    assert result.exit_code == 0, result.output
    assert "group" not in started and "-Q" in started["exec"]


def test_the_setting_turns_it_off_too(started: dict[str, Any],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from quotaflow.config import get_settings

    monkeypatch.setenv("QUOTAFLOW_WORKER_REALTIME_SLOTS", "0")
    get_settings.cache_clear()
    try:
        assert CliRunner().invoke(cli, ["worker"]).exit_code == 0
    finally:
        get_settings.cache_clear()
    assert "group" not in started and _queues(started["exec"]) == "realtime,standard,bulk"


def test_companion_names_keep_celerys_name_at_host_form() -> None:
    assert companion_node("quotaflow-12@box") == "quotaflow-12-realtime@box"
    assert companion_node("bulk@%h") == "bulk-realtime@%h"
