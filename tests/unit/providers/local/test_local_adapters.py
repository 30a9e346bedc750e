"""LoRA adapters of local deployments: declared and checked in the deployments file, found
by routes under their names, picked by a line's model, and passed to vLLM as engine
arguments. Torch-, peft- and vLLM-free."""

import json
from pathlib import Path

import pytest

from quotaflow.constants import ANTHROPIC_PARAMS
from quotaflow.deployments.catalog import Deployments, load_deployments
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError, PermanentProviderError
from quotaflow.providers.local.adapters import adapter_for, adapter_ids, vllm_lora_args
from quotaflow.providers.local.requests import Part, batch_kind, split_kind
from quotaflow.providers.local.vllm_options import engine_args
from quotaflow.providers.translate.body import request_body


def write_adapter(path: Path, rank: int, pattern: dict[str, int] | None = None) -> str:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "rank_pattern": pattern or {}}))
    return str(path)


def local(tmp_path: Path, engine: str = "transformers", **adapters: str) -> Deployment:
    return Deployment(name="tiny-local", provider="local", engine=engine, model="tiny",
                      model_path=str(tmp_path), rpm=10, tpm=1000, adapters=adapters)


def test_the_file_declares_adapters_and_routes_find_them_by_name(tmp_path: Path) -> None:
    # Given a deployments file whose local deployment names two adapters, and a remote one
    path = tmp_path / "deployments.toml"
    path.write_text('[deployments.tiny-local]\nprovider = "local"\nmodel = "tiny"\n'
                    f'model_path = "{tmp_path}"\nrpm = 10\ntpm = 1000\n'
                    'adapters = { support = "/a/support", legal = "/a/legal" }\n'
                    '[deployments.remote]\nprovider = "mock"\nmodel = "gpt"\nrpm = 10\n'
                    'tpm = 1000\n')
    deployments = load_deployments(path)
    assert deployments.deployments["tiny-local"].adapters == {"support": "/a/support",
                                                             "legal": "/a/legal"}
    # Then each adapter's name is a model routed to the local deployment, as its own is
    for model in ("tiny", "support", "legal"):
        assert deployments.route_name_for(model) == model
        assert deployments.local_deployment_for(model).name == "tiny-local"
    assert deployments.route_for("gpt").deployments == ["remote"]
    assert deployments.route_name_for("other") is None


@pytest.mark.parametrize(("fields", "message"), [
    ({"adapters": {"tiny": "/a"}}, "is the deployment's model"),
    ({"adapters": {"sup port": "/a"}}, "is not a model name"),
    ({"adapters": {"support": " "}}, "has no path"),
    ({"provider": "mock", "model_path": None, "adapters": {"support": "/a"}},
     "provider 'mock' serves its adapters"),
])
def test_adapters_that_could_not_be_told_apart_are_refused(fields: dict, message: str) -> None:
    table = {"name": "d", "provider": "local", "model": "tiny", "model_path": "/m",
             "rpm": 10, "tpm": 1000, **fields}
    with pytest.raises(ValueError, match=message):
        Deployment(**table)


def test_a_lines_model_picks_its_adapter(tmp_path: Path) -> None:
    deployment = local(tmp_path, support="/a/support", legal="/a/legal")
    assert adapter_for({"model": "support"}, deployment) == "support"
    assert adapter_for({"model": "legal"}, deployment) == "legal"
    # The base model, or no model at all: the base weights
    assert adapter_for({"model": "tiny"}, deployment) is None
    assert adapter_for({}, deployment) is None
    # Any other model fails its line, naming it and what the deployment serves
    with pytest.raises(PermanentProviderError) as refused:
        adapter_for({"model": "medical"}, deployment)
    assert refused.value.status_code == 400
    assert refused.value.body["error"]["param"] == "model"
    assert "does not serve model 'medical'" in str(refused.value)
    assert "'tiny', 'support', 'legal'" in str(refused.value)
    # Without adapters a deployment answers whatever its route sends, as before
    assert adapter_for({"model": "anything"}, local(tmp_path)) is None


def test_a_batch_is_grouped_by_adapter() -> None:
    base = Part("generate", 3, 4, None)
    adapted = Part("generate", 3, 4, None, "support")
    assert batch_kind(base) == "generate" and split_kind(batch_kind(base)) == ("generate", None)
    assert batch_kind(adapted) != batch_kind(base)
    assert split_kind(batch_kind(adapted)) == ("generate", "support")


def test_vllm_gets_lora_arguments_from_the_adapters(tmp_path: Path) -> None:
    # Given adapters of rank 4 and of rank 8 with one module at 12
    deployment = local(tmp_path / "m", "vllm",
                       support=write_adapter(tmp_path / "support", 4),
                       legal=write_adapter(tmp_path / "legal", 8, {"q_proj": 12}))
    # Then vLLM may run both in one batch (with an empty slot more, which vLLM's CPU ops
    # take for the base model's rows), at the smallest rank it builds holding 12
    args = engine_args(deployment)
    assert {k: args[k] for k in ("enable_lora", "max_loras", "max_cpu_loras",
                                 "max_lora_rank")} == {
        "enable_lora": True, "max_loras": 3, "max_cpu_loras": 3, "max_lora_rank": 16}
    assert adapter_ids(deployment) == {"support": 1, "legal": 2}
    # and a deployment without adapters has no LoRA arguments
    assert "enable_lora" not in engine_args(local(tmp_path / "m", "vllm"))


def test_a_missing_or_oversized_adapter_is_refused_before_loading(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"adapter 'support' at .* holds no adapter_config"):
        vllm_lora_args(local(tmp_path, "vllm", support=str(tmp_path / "nowhere")))
    with pytest.raises(ConfigError, match="rank 1024 is above vLLM's largest LoRA rank"):
        vllm_lora_args(local(tmp_path, "vllm", big=write_adapter(tmp_path / "big", 1024)))


def test_deployments_without_adapters_route_as_before() -> None:
    table = Deployments(deployments={"m": Deployment(name="m", provider="mock", model="x",
                                                     rpm=10, tpm=1000)}, routes={})
    assert table.route_name_for("x") == "x" and table.route_name_for("y") is None


def test_a_local_deployment_with_adapters_is_sent_the_lines_own_model(tmp_path: Path) -> None:
    body = {"model": "support", "messages": [{"role": "user", "content": "hi"}]}
    # With adapters, the line's model reaches the local provider, which picks by it
    assert request_body(body, local(tmp_path, support="/a"))["model"] == "support"
    anthropic = {ANTHROPIC_PARAMS: {"model": "support", "max_tokens": 4,
                                    "messages": [{"role": "user", "content": "hi"}]}}
    assert request_body(anthropic, local(tmp_path, support="/a"))["model"] == "support"
    # Without, the deployment's model, as for every OpenAI-compatible deployment
    assert request_body(body, local(tmp_path))["model"] == "tiny"
