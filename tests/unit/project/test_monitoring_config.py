"""The monitoring set-up (deploy/monitoring/, deploy/keda/, compose's `monitoring`
profile) and the worker's --autoscale: what operators deploy must be coherent.

Prometheus's config, alerts and every dashboard query are checked by promtool, the alerts
by its unit tests (deploy/monitoring/tests/); the KEDA example by the lists a real Celery
producer fills (tests/cluster/test_monitoring_config.py). Docker does not run on the test
machines: compose is checked as YAML.
"""

import json
import re
import shutil
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from cli import services
from cli.main import cli
from quotaflow import preflight
from quotaflow.constants import QUEUES
from tests.harness.promtool import promtool
from tests.harness.servers import ROOT

MONITORING = ROOT / "deploy" / "monitoring"
KEDA = ROOT / "deploy" / "keda"
WORKER_METRICS_PORT = 9101
TOKEN_FILE = "metrics_token"  # prometheus.yml's credentials_file, relative to it

# The metrics quotaflow exports (API /metrics and `quotaflow worker --metrics-port`).
METRICS = {
    "quotaflow_budget_utilisation", "quotaflow_budget_available_requests",
    "quotaflow_budget_available_tokens", "quotaflow_budget_limit_requests_per_minute",
    "quotaflow_budget_limit_tokens_per_minute", "quotaflow_admitted_requests_total",
    "quotaflow_admitted_tokens_total", "quotaflow_provider_responses_total",
    "quotaflow_provider_tokens_total", "quotaflow_circuit_state", "quotaflow_queue_depth",
    "quotaflow_queue_oldest_age_seconds", "quotaflow_requests", "quotaflow_jobs",
}
HISTOGRAMS = {"quotaflow_admission_wait_seconds", "quotaflow_provider_latency_seconds"}
KNOWN = METRICS | {f"{h}_{s}" for h in HISTOGRAMS for s in ("bucket", "sum", "count")}


def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yml").read_text())


def _dashboard() -> dict[str, Any]:
    return json.loads((MONITORING / "grafana" / "dashboards" / "quotaflow.json").read_text())


def _queries(dashboard: dict[str, Any]) -> list[str]:
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    return [t["expr"] for p in panels for t in p["targets"]]


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bquotaflow_[a-z_]+\b", expr)) - {"quotaflow_"}


def test_prometheus_config_and_alert_rules_pass_promtool(tmp_path: Path) -> None:
    # check config also checks the rule files it names, relative to the config file, and
    # that the scrape token's file exists: as in the container, it lies beside the config
    # (compose mounts the secret there; no token is in the repository).
    shutil.copy(MONITORING / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copytree(MONITORING / "rules", tmp_path / "rules")
    (tmp_path / TOKEN_FILE).write_text("a-scrape-token\n")
    assert "SUCCESS" in promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert "SUCCESS: 4 rules found" in promtool(
        "check", "rules", str(MONITORING / "rules" / "quotaflow.rules.yml"))
    rules = yaml.safe_load((MONITORING / "rules" / "quotaflow.rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert _metric_names(rule["expr"]) <= KNOWN, rule["alert"]


def test_alerts_fire_on_the_series_they_are_about() -> None:
    """promtool's unit tests: 429s, a stale queue, an open circuit, a target down."""
    promtool("test", "rules", str(MONITORING / "tests" / "alerts.test.yml"))


def test_dashboard_queries_are_valid_promql_on_quotaflow_metrics(tmp_path: Path) -> None:
    dashboard = _dashboard()
    queries = _queries(dashboard)
    assert len(queries) >= 15
    for expr in queries:
        assert _metric_names(expr) <= KNOWN, expr
    used = set().union(*map(_metric_names, queries))
    # What the dashboard must show: tokens admitted against the budget, 429s, latency
    # percentiles, queue depth and age, circuit states.
    for name in ("quotaflow_admitted_tokens_total", "quotaflow_budget_limit_tokens_per_minute",
                 "quotaflow_provider_responses_total", "quotaflow_provider_latency_seconds_bucket",
                 "quotaflow_queue_depth", "quotaflow_queue_oldest_age_seconds",
                 "quotaflow_circuit_state"):
        assert name in used, name
    assert any('code="429"' in q for q in queries)
    assert {"histogram_quantile(0.5,", "histogram_quantile(0.95,"} <= {
        q.split(" ")[0] for q in queries if q.startswith("histogram_quantile")}
    # promtool parses PromQL in rule files: every query as a recording rule, with
    # Grafana's variables as Grafana would fill them.
    filled = [q.replace("$__rate_interval", "1m").replace("$deployment", ".*") for q in queries]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(filled)]}]}
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    promtool("check", "rules", str(path))


def test_grafana_provisioning_matches_the_dashboard_and_compose() -> None:
    provisioning = MONITORING / "grafana" / "provisioning"
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    [source] = datasource["datasources"]
    assert source["url"] == "http://prometheus:9090"
    dashboard = _dashboard()
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == source["uid"], panel["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    providers = yaml.safe_load((provisioning / "dashboards" / "quotaflow.yml").read_text())
    path = providers["providers"][0]["options"]["path"]
    grafana = _compose()["services"]["grafana"]
    assert f"./deploy/monitoring/grafana/dashboards:{path}:ro" in grafana["volumes"]
    assert "./deploy/monitoring/grafana/provisioning:/etc/grafana/provisioning:ro" in (
        grafana["volumes"])


def test_compose_monitoring_profile_scrapes_the_api_and_every_worker() -> None:
    compose = _compose()
    services = compose["services"]
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert prometheus["profiles"] == grafana["profiles"] == ["monitoring"]
    assert prometheus["image"].startswith("prom/prometheus:")
    assert grafana["image"].startswith("grafana/grafana:")
    assert {"prometheus-data", "grafana-data"} <= set(compose["volumes"])
    mounts = {v.split(":")[1]: v.split(":")[0] for v in prometheus["volumes"]}
    assert mounts["/etc/prometheus/prometheus.yml"] == "./deploy/monitoring/prometheus.yml"
    assert mounts["/etc/prometheus/rules"] == "./deploy/monitoring/rules"
    for service in (prometheus, grafana):
        assert all(port.startswith("127.0.0.1:") for port in service["ports"])

    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    # Every scrape sends the token, from the secret compose makes of the variable the API
    # and the workers read, mounted where the config's relative path points.
    for job in jobs.values():
        assert job["authorization"] == {"type": "Bearer", "credentials_file": TOKEN_FILE}
    assert compose["secrets"]["metrics_token"] == {"environment": "QUOTAFLOW_METRICS_TOKEN"}
    assert prometheus["secrets"] == [{"source": "metrics_token",
                                      "target": f"/etc/prometheus/{TOKEN_FILE}"}]
    for name in ("api", "worker-realtime", "worker-bulk"):
        assert services[name]["environment"]["QUOTAFLOW_METRICS_TOKEN"] == (
            "${QUOTAFLOW_METRICS_TOKEN:-}"), name
    api_port = services["api"]["command"][services["api"]["command"].index("--port") + 1]
    assert jobs["quotaflow-api"]["static_configs"][0]["targets"] == [f"api:{api_port}"]
    [dns] = jobs["quotaflow-worker"]["dns_sd_configs"]
    assert dns["type"] == "A" and dns["port"] == WORKER_METRICS_PORT
    # Every worker service, in any profile, is scraped on the port it serves metrics on.
    workers = {name for name, s in services.items()
               if s.get("command", [None, None])[:2] == ["quotaflow", "worker"]}
    assert workers == {"worker-realtime", "worker-bulk", "worker-gpu0", "worker-vllm"}
    assert set(dns["names"]) == workers
    for name in workers:
        env = services[name]["environment"]
        assert env["QUOTAFLOW_WORKER_METRICS_PORT"] == str(WORKER_METRICS_PORT), name
        assert env["QUOTAFLOW_BROKER_URL"] == "redis://redis:6379/0", name  # anchor kept


def _keda(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((KEDA / name).read_text()))


def keda_redis_lists() -> list[str]:
    """Every Redis list a ScaledObject of the example watches: the standard and bulk
    workers' (scaledobject-redis.yaml) and the realtime workers' (worker-realtime.yaml)."""
    [scaled] = _keda("scaledobject-redis.yaml")
    realtime = _keda("worker-realtime.yaml")[1]
    return [t["metadata"]["listName"] for s in (scaled, realtime)
            for t in s["spec"]["triggers"] if t["type"] == "redis"]


def test_keda_example_scales_the_worker_deployment_on_its_queues() -> None:
    [deployment] = _keda("worker.yaml")
    assert deployment["kind"] == "Deployment"
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["quotaflow", "worker"]
    help_text = CliRunner().invoke(cli, ["worker", "--help"]).output
    assert all(option in help_text for option in command[2:] if option.startswith("--"))
    consumed = command[command.index("--queues") + 1].split(",")
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["QUOTAFLOW_WORKER_METRICS_PORT"] == str(WORKER_METRICS_PORT)
    for name in ("scaledobject-redis.yaml", "scaledobject-prometheus.yaml"):
        [scaled] = _keda(name)
        assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["kind"] == "ScaledObject"
        assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert scaled["spec"]["minReplicaCount"] >= 1  # running batches keep a worker
    # The lists watched are the queues the worker consumes, no more, no fewer.
    [scaled] = _keda("scaledobject-redis.yaml")
    assert sorted(t["metadata"]["listName"] for t in scaled["spec"]["triggers"]) == sorted(
        consumed)
    [prom] = _keda("scaledobject-prometheus.yaml")[0]["spec"]["triggers"]
    assert _metric_names(prom["metadata"]["query"]) == {"quotaflow_queue_depth"}
    assert all(q in prom["metadata"]["query"] for q in consumed)


def _command_options_exist(command: list[str], name: str) -> None:
    help_text = CliRunner().invoke(cli, [name, "--help"]).output
    assert command[:2] == ["quotaflow", name]
    assert all(option in help_text for option in command[2:] if option.startswith("--"))


def test_keda_example_runs_a_realtime_worker_that_never_scales_to_zero() -> None:
    deployment, scaled = _keda("worker-realtime.yaml")
    assert deployment["kind"] == "Deployment" and scaled["kind"] == "ScaledObject"
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    _command_options_exist(command, "worker")
    assert command[command.index("--queues") + 1] == "realtime"
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] >= 1  # a realtime batch finds a worker at once
    assert [t["metadata"]["listName"] for t in scaled["spec"]["triggers"]] == ["realtime"]
    # Every queue has a consumer somewhere in the example.
    [bulk] = _keda("worker.yaml")
    bulk_command = bulk["spec"]["template"]["spec"]["containers"][0]["command"]
    consumed = {q for c in (command, bulk_command)
                for q in c[c.index("--queues") + 1].split(",")}
    assert consumed == set(QUEUES)
    assert sorted(keda_redis_lists()) == sorted(QUEUES)


def test_the_api_runs_several_processes_in_compose_and_kubernetes() -> None:
    deployment, service = _keda("api.yaml")
    assert deployment["spec"]["replicas"] >= 2
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    _command_options_exist(container["command"], "api")
    assert int(container["command"][container["command"].index("--workers") + 1]) >= 2
    assert service["kind"] == "Service"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    compose_api = _compose()["services"]["api"]["command"]
    _command_options_exist(compose_api, "api")
    assert int(compose_api[compose_api.index("--workers") + 1]) >= 2


def _celery_argv(monkeypatch, *args: str) -> tuple[int, list[str], str]:
    captured: list[str] = []
    monkeypatch.setattr(services, "_exec_celery",
                        lambda *argv, env=None: captured.extend(argv))
    # The settings' checks need PostgreSQL and Redis (tests/cluster/test_preflight.py).
    monkeypatch.setattr(preflight, "ensure_ready", lambda *_a, **_k: None)
    result = CliRunner().invoke(cli, ["worker", *args])
    return result.exit_code, captured, result.output


def test_worker_autoscale_is_passed_to_celery(monkeypatch) -> None:
    code, argv, output = _celery_argv(monkeypatch, "--autoscale", "8,2", "--queues", "bulk")
    assert code == 0, output
    assert "--autoscale=8,2" in argv and argv[argv.index("-Q") + 1] == "bulk"
    code, argv, _ = _celery_argv(monkeypatch, "--queues", "bulk")
    assert code == 0 and not any(a.startswith("--autoscale") for a in argv)


def test_worker_autoscale_rejects_what_celery_would_not_take(monkeypatch) -> None:
    for bad in ("8", "8,", "a,b", "2,8", "0,0", "8,-1", "8,2,1"):
        code, argv, output = _celery_argv(monkeypatch, "--autoscale", bad)
        assert code == 2 and not argv, bad
        assert "Invalid value for '--autoscale'" in output and "MAX" in output, output
    code, argv, output = _celery_argv(monkeypatch, "--autoscale", "4,1",
                                      "--deployment", "local-qwen")
    assert code == 2 and not argv and "--autoscale needs the process pool" in output
