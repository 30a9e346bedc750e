"""Settings and deployments files: unusable values are refused with a message that says why."""

from pathlib import Path

import pytest

from quotaflow.config import Settings
from quotaflow.deployments.catalog import load_deployments
from quotaflow.errors import ConfigError

VALID = '''
[deployments.main]
provider = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "m"
rpm = 60
tpm = 1000
'''


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deployments.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("change", "message"), [
    (("rpm = 60", "rpm = 0"), "rpm\n  Input should be greater than 0"),
    (("tpm = 1000", "tpm = -5"), "tpm\n  Input should be greater than 0"),
    (("rpm = 60\n", ""), "rpm\n  Field required"),
    (("tpm = 1000", 'tpm = "lots"'), "tpm\n  Input should be a valid integer"),
    (("rpm = 60", "rpm = 30\nburst_seconds = 1"), "holds less than one request"),
    (('base_url = "http://127.0.0.1:9/v1"\n', ""), "provider 'openai' needs base_url"),
    (('provider = "openai"', 'provider = "nonesuch"'),
     "Input should be 'openai', 'mock', 'local', 'anthropic', 'openai-batch'"),
])
def test_bad_limits_are_refused(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    path = write(tmp_path, VALID.replace(*change))
    with pytest.raises(ConfigError, match="is invalid") as error:
        load_deployments(path)
    assert message in str(error.value)


def test_route_to_an_unknown_deployment_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, VALID + '[routes]\n"gpt" = "elsewhere"\n')
    with pytest.raises(ConfigError, match="route 'gpt' names unknown deployment 'elsewhere'"):
        load_deployments(path)


def test_unreadable_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_deployments(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_deployments(write(tmp_path, "[deployments.x\n"))
    with pytest.raises(ConfigError, match=r"has no \[deployments.NAME\] tables"):
        load_deployments(write(tmp_path, "[routes]\n"))


def test_api_key_is_read_from_the_environment_only(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, VALID.replace('model = "m"', 'model = "m"\napi_key_env = "QF_K"'))
    deployment = load_deployments(path).deployments["main"]
    monkeypatch.delenv("QF_K", raising=False)
    with pytest.raises(ConfigError, match=r"reads its API key from \$QF_K, which is not set"):
        deployment.api_key()
    monkeypatch.setenv("QF_K", "sk-secret")
    assert deployment.api_key() == "sk-secret"
    assert "sk-secret" not in repr(deployment)


def test_unsafe_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="must be below visibility_timeout_s"):
        Settings(visibility_timeout_s=600, task_time_limit_s=900, _env_file=None)
    with pytest.raises(ValueError, match="floor_bulk"):
        Settings(floor_bulk=1.5, _env_file=None)


LOCAL = """
[deployments.gpu]
provider = "local"
model = "qwen"
model_path = "/models/qwen"
rpm = 6000
tpm = 600000
"""


def test_a_local_deployment_needs_a_model_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="provider 'local' needs model_path"):
        load_deployments(write(tmp_path, LOCAL.replace('model_path = "/models/qwen"\n', "")))
    with pytest.raises(ConfigError, match="max_batch_size\n  Input should be greater than 0"):
        load_deployments(write(tmp_path, LOCAL + "max_batch_size = 0\n"))
    gpu = load_deployments(write(tmp_path, LOCAL)).deployments["gpu"]
    assert (gpu.engine, gpu.device, gpu.dtype, gpu.max_batch_size) == (
        "transformers", "auto", "auto", 16)


def test_a_route_names_at_most_one_local_deployment(tmp_path: Path) -> None:
    second = LOCAL.replace("[deployments.gpu]", "[deployments.gpu2]")
    text = LOCAL + second + VALID + '[routes]\n"qwen" = ["gpu", "gpu2"]\n'
    with pytest.raises(ConfigError, match="names local deployments \\['gpu', 'gpu2'\\]"):
        load_deployments(write(tmp_path, text))
    mixed = load_deployments(write(tmp_path, LOCAL + VALID + '[routes]\n"qwen" = '
                                   '{ deployments = ["main"], fallback = ["gpu"] }\n'))
    assert mixed.local_deployment_for("qwen").name == "gpu"
    assert mixed.local_deployment_for("m") is None


def test_a_renamed_setting_is_still_read_under_its_former_name(monkeypatch):
    monkeypatch.setenv("QUOTAFLOW_LEASE_SECONDS", "45")
    with pytest.warns(FutureWarning, match="QUOTAFLOW_LEASE_SECONDS is now QUOTAFLOW_LEASE_S"):
        assert Settings(_env_file=None).lease_s == 45
    monkeypatch.setenv("QUOTAFLOW_LEASE_S", "50")  # the new name wins where both are set
    with pytest.warns(FutureWarning):
        assert Settings(_env_file=None).lease_s == 50
    monkeypatch.delenv("QUOTAFLOW_LEASE_SECONDS")
    with pytest.warns(FutureWarning, match="task_time_limit is now task_time_limit_s"):
        assert Settings(task_time_limit=100, _env_file=None).task_time_limit_s == 100


def test_every_duration_in_seconds_ends_in_s():
    for name, field in Settings.model_fields.items():
        says_seconds = "seconds" in (field.description or "").lower().split("(")[0]
        assert not says_seconds or name.endswith("_s") or "window" in name, name
