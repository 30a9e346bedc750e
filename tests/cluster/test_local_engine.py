"""The transformers engine and the local provider on a tiny random GPT-2, loaded by the real
loading code from a directory written with save_pretrained (no model hub)."""

import os

# No model hub here: every model is built and loaded from a local directory.
os.environ["HF_HUB_OFFLINE"] = "1"

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from quotaflow.constants import ENDPOINT_CHAT, ENDPOINT_COMPLETIONS, ENDPOINT_EMBEDDINGS
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError, PermanentProviderError, UnservedContent
from quotaflow.providers import local, make_provider
from quotaflow.providers.local.engine import TransformersEngine, next_tokens
from quotaflow.providers.local.requests import GenerationRequest
from tests.harness.servers import ROOT
from tests.harness.tiny_model import SENTENCES, save_tiny_model

# With this offset about half of the greedy replies below end at EOS, the rest at max_tokens.
MIXED_EOS_BIAS = 0.1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "gpt2", eos_bias=MIXED_EOS_BIAS)


def local_deployment(path: Path, name: str = "tiny-local", **options: object) -> Deployment:
    return Deployment(name=name, provider="local", model="tiny", model_path=str(path),
                      rpm=10_000, tpm=10_000_000, **options)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> TransformersEngine:
    return TransformersEngine(local_deployment(model_dir))


def reference_greedy(engine: TransformersEngine, ids: list[int], limit: int) -> list[int]:
    """Greedy decoding the plain way: one sequence, no padding, no cache, no generate()."""
    tokens = list(ids)
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(limit):
            logits = engine.model(input_ids=torch.tensor([tokens])).logits[0, -1]
            token = int(logits.argmax())
            out.append(token)
            tokens.append(token)
            if token in engine.eos_ids:
                break
    return out


def prompts(count: int) -> list[str]:
    return [f"{SENTENCES[i % 7]} number {i}" + " and the sea" * (i % 3) for i in range(count)]


def test_batched_generation_matches_one_sequence_at_a_time(engine: TransformersEngine) -> None:
    # Given prompts of different lengths, each with its own max_tokens
    requests = [GenerationRequest(engine.chat_ids([{"role": "user", "content": p}]), 5 + i,
                                  0.0, 1.0) for i, p in enumerate(prompts(16))]
    # When they are generated as one left-padded batch
    batched = engine.generate(requests)
    # Then each equals plain greedy decoding of its prompt alone: same tokens counted up to
    # and including EOS (or max_tokens), same text, same reason
    for request, generated in zip(requests, batched, strict=True):
        expected = reference_greedy(engine, request.input_ids, request.max_new_tokens)
        ended = expected[-1] in engine.eos_ids
        assert generated.completion_tokens == len(expected)
        assert generated.finish_reason == ("stop" if ended else "length")
        text_ids = expected[:-1] if ended else expected
        assert generated.text == engine.tokenizer.decode(text_ids, skip_special_tokens=True)
    # And the batch held both kinds of ending, so each row really stopped on its own
    reasons = [g.finish_reason for g in batched]
    assert "stop" in reasons and "length" in reasons
    assert all(g.completion_tokens == r.max_new_tokens
               for g, r in zip(batched, requests, strict=True) if g.finish_reason == "length")


def test_a_row_that_stops_leaves_the_batch(engine: TransformersEngine) -> None:
    # Given rows with different max_tokens, some of which end earlier at EOS
    requests = [GenerationRequest(engine.chat_ids([{"role": "user", "content": p}]), 3 + i,
                                  0.0, 1.0) for i, p in enumerate(prompts(12))]
    rows_per_pass: list[int] = []
    hook = engine.model.register_forward_hook(
        lambda module, args, kwargs, out: rows_per_pass.append(kwargs["input_ids"].shape[0]),
        with_kwargs=True)
    try:
        generated = engine.generate(requests)
    finally:
        hook.remove()
    # Then the prompt pass holds every row, and each later pass only the rows still going:
    # a row is fed back once per token after its first, and never after its last
    assert rows_per_pass[0] == len(requests)
    decode = rows_per_pass[1:]
    assert sum(decode) == sum(g.completion_tokens - 1 for g in generated)
    assert decode == sorted(decode, reverse=True)
    assert decode[-1] == 1 and len(decode) == max(g.completion_tokens for g in generated) - 1


def test_top_p_keeps_at_least_the_likeliest_token() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.9]])
    for _ in range(20):
        picked = next_tokens(logits, torch.tensor([1.0, 1.0]), torch.tensor([1e-6, 1e-6]))
        assert picked.tolist() == [1, 0]
    greedy = next_tokens(logits, torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]))
    assert greedy.tolist() == [1, 0]


def test_greedy_rows_stay_greedy_in_a_batch_that_samples(engine: TransformersEngine) -> None:
    ids = [engine.chat_ids([{"role": "user", "content": p}]) for p in prompts(6)]
    requests = [GenerationRequest(row, 10, 0.0 if i % 2 == 0 else 1.0, 0.9)
                for i, row in enumerate(ids)]
    torch.manual_seed(1)
    mixed = engine.generate(requests)
    for request, generated in zip(requests, mixed, strict=True):
        assert 1 <= generated.completion_tokens <= 10
        if request.temperature == 0:
            assert generated.completion_tokens == len(
                reference_greedy(engine, request.input_ids, 10))


@pytest.fixture
def provider(model_dir: Path) -> Iterator[local.LocalProvider]:
    deployment = local_deployment(model_dir, max_batch_size=8, max_wait_ms=50,
                                  default_max_tokens=12, default_temperature=0.0)
    yield make_provider(deployment)


def test_chat_answer_has_openai_shape_and_real_usage(provider: local.LocalProvider,
                                                     engine: TransformersEngine) -> None:
    messages = [{"role": "system", "content": "answer in one line"},
                {"role": "user", "content": "what is the weather like on the coast"}]
    response = asyncio.run(provider.send(ENDPOINT_CHAT, {"model": "tiny", "messages": messages,
                                                         "max_tokens": 9}))
    body = response.body
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    # prompt_tokens: the chat template's tokens, counted independently here
    template = engine.tokenizer.apply_chat_template(messages, tokenize=False,
                                                    add_generation_prompt=True)
    expected_prompt = len(engine.tokenizer(template, add_special_tokens=False)["input_ids"])
    prompt_ids = engine.chat_ids(messages)
    expected = reference_greedy(engine, prompt_ids, 9)
    assert body["usage"] == {"prompt_tokens": expected_prompt,
                             "completion_tokens": len(expected),
                             "total_tokens": expected_prompt + len(expected)}
    assert (response.prompt_tokens, response.completion_tokens) == (expected_prompt,
                                                                      len(expected))


def test_completions_and_embeddings_endpoints(provider: local.LocalProvider,
                                              engine: TransformersEngine) -> None:
    prompt = "the quick brown fox jumps over the lazy dog"
    completion = asyncio.run(provider.send(ENDPOINT_COMPLETIONS, {"prompt": prompt,
                                                                 "max_tokens": 4})).body
    assert completion["object"] == "text_completion"
    assert completion["usage"]["prompt_tokens"] == len(engine.tokenizer(prompt)["input_ids"])
    assert 1 <= completion["usage"]["completion_tokens"] <= 4
    texts = ["the tide comes in", "a question about the moon and the sea", "the tide comes in"]
    embedded = asyncio.run(provider.send(ENDPOINT_EMBEDDINGS, {"input": texts})).body
    assert embedded["object"] == "list"
    assert [d["index"] for d in embedded["data"]] == [0, 1, 2]
    vectors = [torch.tensor(d["embedding"]) for d in embedded["data"]]
    assert all(v.shape == (32,) and abs(float(v.norm()) - 1) < 1e-4 for v in vectors)
    # The same text gets the same vector, whatever it was padded against
    assert torch.allclose(vectors[0], vectors[2], atol=1e-4)
    assert not torch.allclose(vectors[0], vectors[1], atol=1e-2)
    assert embedded["usage"]["prompt_tokens"] == sum(
        len(engine.tokenizer(t)["input_ids"]) for t in texts)


def test_concurrent_requests_meet_in_model_batches(provider: local.LocalProvider) -> None:
    # Given 24 chat requests sent concurrently, as the executor sends them
    async def send_all() -> list:
        return await asyncio.gather(*(
            provider.send(ENDPOINT_CHAT, {"messages": [{"role": "user", "content": p}]})
            for p in prompts(24)))

    batcher = provider.runner.batcher
    before = len(batcher.batch_sizes)
    responses = asyncio.run(send_all())
    # Then every one is answered, and the model ran them in batches of up to 8
    assert len(responses) == 24
    sizes = batcher.batch_sizes[before:]
    assert sum(sizes) == 24 and max(sizes) == 8 and len(sizes) <= 5


def test_requests_the_engine_cannot_serve_are_refused_with_400(
        provider: local.LocalProvider) -> None:
    too_long = " ".join(["the sea"] * 200)
    with pytest.raises(PermanentProviderError, match="exceed the model's context of 256") as e:
        asyncio.run(provider.send(ENDPOINT_COMPLETIONS, {"prompt": too_long}))
    assert e.value.status_code == 400
    with pytest.raises(PermanentProviderError, match="'n' is not applied by the transformers"):
        asyncio.run(provider.send(ENDPOINT_CHAT, {"messages": [{"role": "user",
                                                                "content": "hi"}], "n": 2}))


def test_an_image_part_fails_its_line_naming_the_part_and_the_deployment(
        provider: local.LocalProvider) -> None:
    # Given a chat line with a text part and an image (the tiny GPT-2 takes no images)
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what?"},
                                                      image]}], "max_tokens": 4}
    # When it is sent, then it fails (400) naming the part's type, place and deployment,
    # rather than being answered from its text alone
    with pytest.raises(UnservedContent) as caught:
        asyncio.run(provider.send(ENDPOINT_CHAT, body))
    assert caught.value.status_code == 400
    assert caught.value.param == "messages[0].content[1]"
    assert "'image_url'" in str(caught.value) and "'tiny-local'" in str(caught.value)
    assert caught.value.body["error"]["code"] == "unsupported_content"


def test_a_model_without_chat_template_refuses_chat_but_completes(tmp_path: Path) -> None:
    path = save_tiny_model(tmp_path / "plain")
    config = path / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"chat_template"', '"unused_template"'))
    for extra in path.glob("chat_template.*"):
        extra.unlink()
    plain = TransformersEngine(local_deployment(path))
    with pytest.raises(PermanentProviderError, match="has no chat template"):
        plain.chat_ids([{"role": "user", "content": "hi"}])
    assert plain.text_ids("the tide")


def test_a_bad_model_path_is_a_config_error_that_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must be a directory written by save_pretrained"):
        TransformersEngine(local_deployment(tmp_path / "missing"))


@pytest.mark.parametrize(("device", "reason"), [
    ("gpu", "not a device torch knows"),
    ("cuda", "sees no CUDA device"),
    ("cuda:7", "sees no CUDA device"),
])
def test_a_device_that_is_not_there_is_refused_before_loading(
        model_dir: Path, device: str, reason: str) -> None:
    if torch.cuda.is_available() and device != "gpu":
        pytest.skip("this host has a GPU; the case is a CPU-only one")
    with pytest.raises(ConfigError, match=f"deployment 'tiny-local': device '{device}'.*{reason}"):
        TransformersEngine(local_deployment(model_dir, device=device))


def test_a_worker_without_the_model_never_loads_it(model_dir: Path) -> None:
    # Given a process restricted as a Celery worker without --deployment is
    local.serve_only([])
    try:
        with pytest.raises(ConfigError, match="quotaflow worker --deployment other"):
            make_provider(local_deployment(model_dir, name="other"))
    finally:
        local.serve_only(None)


def test_quotaflow_runs_without_the_local_extra(model_dir: Path) -> None:
    # Given a Python where torch cannot be imported
    script = f"""
import sys
sys.modules["torch"] = None  # import torch now raises ImportError
import quotaflow.execution, quotaflow.dispatch.queues, quotaflow.runtime, api.app, cli.main
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError
from quotaflow.providers import make_provider
deployment = Deployment(name="gpu", provider="local", model="m", model_path={str(model_dir)!r},
                        rpm=10, tpm=1000)
try:
    make_provider(deployment)
except ConfigError as exc:
    print(exc)
"""
    env = {**os.environ, "QUOTAFLOW_BROKER_URL": "redis://127.0.0.1:1/0"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, env=env, cwd=ROOT)
    # Then everything else imports, and a local deployment says what to install
    assert result.returncode == 0, result.stderr
    assert "pip install 'quotaflow[local]'" in result.stdout
