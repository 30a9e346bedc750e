"""compose.yml and the example deployments file: what users deploy must be coherent.

Docker does not run on the test machines, so this checks the file's structure
and that every command it runs is a real `quotaflow` command.
"""

from pathlib import Path

import yaml
from click.testing import CliRunner

from cli.main import cli
from quotaflow.deployments.catalog import load_deployments
from tests.harness.servers import ROOT

SERVICES = {"redis", "postgres", "migrate", "api", "worker-realtime", "worker-bulk", "flower"}


def test_compose_runs_the_documented_services() -> None:
    compose = yaml.safe_load((ROOT / "compose.yml").read_text())
    assert {n for n, s in compose["services"].items() if "profiles" not in s} == SERVICES
    runner = CliRunner()
    for name in SERVICES - {"redis", "postgres"}:
        service = compose["services"][name]
        command = service["command"]
        assert command[0] == "quotaflow"
        assert service["image"] == "quotaflow:latest"
        # Every option the service passes is one the command accepts.
        result = runner.invoke(cli, [*_subcommand(command[1:]), "--help"])
        assert result.exit_code == 0, (name, result.output)
        for option in (arg for arg in command[1:] if arg.startswith("--")):
            assert option in result.output, (name, option)
    flower_env = compose["services"]["flower"]["environment"]
    assert "QUOTAFLOW_FLOWER_BASIC_AUTH" in flower_env
    workers = {compose["services"][n]["command"][3] for n in ("worker-realtime", "worker-bulk")}
    assert workers == {"realtime", "standard,bulk"}


def test_gpu_profiles_run_a_vllm_server_and_a_pinned_local_worker() -> None:
    compose = yaml.safe_load((ROOT / "compose.yml").read_text())
    vllm, worker = compose["services"]["vllm"], compose["services"]["worker-gpu0"]
    assert vllm["profiles"] == ["vllm"] and vllm["image"].startswith("vllm/vllm-openai")
    assert worker["profiles"] == ["local-gpu"]
    for service in (vllm, worker):
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
    # The worker serves a local deployment of the example file, pinned to the GPU it reserves
    command = worker["command"]
    deployment = command[command.index("--deployment") + 1]
    example = load_deployments(ROOT / "examples" / "deployments.toml")
    assert example.deployments[deployment].provider == "local"
    assert worker["environment"]["CUDA_VISIBLE_DEVICES"] == "0"
    help_text = CliRunner().invoke(cli, ["worker", "--help"]).output
    assert all(o in help_text for o in command[2:] if o.startswith("--"))


def test_the_vllm_engine_profile_runs_a_worker_of_an_engine_deployment_on_vllms_image() -> None:
    compose = yaml.safe_load((ROOT / "compose.yml").read_text())
    worker = compose["services"]["worker-vllm"]
    assert worker["profiles"] == ["vllm-engine"]
    # Its deployment, in the example file, runs on vLLM's engine
    command = worker["command"]
    deployment = command[command.index("--deployment") + 1]
    example = load_deployments(ROOT / "examples" / "deployments.toml")
    assert (example.deployments[deployment].provider,
            example.deployments[deployment].engine) == ("local", "vllm")
    assert example.route_for(example.deployments[deployment].model).deployments == [deployment]
    help_text = CliRunner().invoke(cli, ["worker", "--help"]).output
    assert all(o in help_text for o in command[2:] if o.startswith("--"))
    # built from vLLM's image with quotaflow installed around vLLM's pins, whose entry
    # point (vLLM's server) is replaced, and given the GPU it is pinned to
    dockerfile = (ROOT / worker["build"]["dockerfile"]).read_text()
    assert "FROM vllm/vllm-openai:" in dockerfile and "ENTRYPOINT []" in dockerfile
    assert "-c /tmp/held.txt" in dockerfile
    for package in ("quotaflow", "api", "workers", "cli", "migrations"):
        assert f"COPY {package} {package}" in dockerfile
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["device_ids"] == [worker["environment"]["CUDA_VISIBLE_DEVICES"]]


def _subcommand(args: list[str]) -> list[str]:
    return [arg for arg in args[:2] if not arg.startswith("-")][: 2 if args[0] == "db" else 1]


def test_example_deployments_file_loads() -> None:
    deployments = load_deployments(ROOT / "examples" / "deployments.toml")
    assert deployments.route_for("gpt-4o-mini").deployments == ["openai-mini"]
    assert deployments.route_for("something-else").deployments == ["mock"]


def test_dockerfile_installs_every_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("quotaflow", "api", "workers", "cli", "migrations"):
        assert f"COPY {package} {package}" in dockerfile
    assert Path(ROOT / "pyproject.toml").exists()
