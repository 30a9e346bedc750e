"""A local line's content parts: text and images reach the engine, anything a deployment
cannot serve fails the line naming the part's type, its place and the deployment (never
a silent drop). Engine-free: a fake tokenizer that records the template's messages."""

import base64
import io
from typing import Any

import pytest
from PIL import Image

from quotaflow.constants import ANTHROPIC_PARAMS, ENDPOINT_CHAT
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import PermanentProviderError, RetryableProviderError, UnservedContent
from quotaflow.providers.local.content import ImageRef
from quotaflow.providers.local.images import load_image
from quotaflow.providers.local.requests import GenerationRequest, parts_for
from quotaflow.providers.local.sampling import VLLM_APPLIES
from quotaflow.providers.translate.body import request_body


class FakeEngine:
    max_context = 4096
    applies = VLLM_APPLIES

    def __init__(self, takes_images: bool) -> None:
        self.takes_images = takes_images
        self.templated: list[dict[str, Any]] = []

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        self.templated = messages
        return [1, 2, 3]

    def text_ids(self, text: str) -> list[int]:
        return [1, 2]


DEPLOYMENT = Deployment(name="vlm-one", provider="local", engine="vllm", model="tiny-vlm",
                        model_path="/models/tiny-vlm", rpm=10, tpm=1000)


def png_data_url(colour: str = "red") -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 3), colour).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def send(engine: FakeEngine, messages: list[dict[str, Any]]) -> GenerationRequest:
    body = {"model": "tiny-vlm", "max_tokens": 4, "messages": messages}
    (part,) = parts_for(ENDPOINT_CHAT, body, engine, DEPLOYMENT)
    return part.payload


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": "low"}}


def test_a_vision_model_gets_its_images_in_place_and_in_order() -> None:
    # Given a vision-capable engine and a line with text, a URL image and a base64 image
    engine = FakeEngine(takes_images=True)
    data_url = png_data_url()
    messages = [{"role": "system", "content": [{"type": "text", "text": "be brief"}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "compare "}, image("https://x.test/a.png"),
                    {"type": "text", "text": " with "}, image(data_url)]}]
    # When it is turned into engine work
    request = send(engine, messages)
    # Then the template sees each image as its placeholder, where the line had it; a
    # message of text parts only is one string; the URLs go with the request, in order
    assert engine.templated[0] == {"role": "system", "content": "be brief"}
    assert engine.templated[1]["content"] == [
        {"type": "text", "text": "compare "}, {"type": "image"},
        {"type": "text", "text": " with "}, {"type": "image"}]
    assert request.images == (ImageRef("https://x.test/a.png", "messages[1].content[1]"),
                              ImageRef(data_url, "messages[1].content[3]"))


def test_an_image_for_a_text_model_fails_naming_the_part_and_the_deployment() -> None:
    with pytest.raises(UnservedContent) as caught:
        send(FakeEngine(takes_images=False), [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"}, image("https://x.test/a.png")]}])
    error = caught.value
    assert error.status_code == 400 and error.param == "messages[0].content[1]"
    assert error.part_type == "image_url" and error.deployment == "vlm-one"
    assert "cannot serve a 'image_url' part" in str(error) and "takes no images" in str(error)
    assert error.body == {"error": {"message": str(error), "type": "invalid_request_error",
                                    "param": "messages[0].content[1]",
                                    "code": "unsupported_content"}}


@pytest.mark.parametrize("part", [
    {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    {"type": "file", "file": {"file_id": "file-1"}},
    {"type": "video_url", "video_url": {"url": "https://x.test/v.mp4"}},
    {"text": "a part without a type"}])
@pytest.mark.parametrize("takes_images", [True, False])
def test_parts_no_local_engine_serves_fail_by_type(part: dict[str, Any],
                                                   takes_images: bool) -> None:
    with pytest.raises(UnservedContent) as caught:
        send(FakeEngine(takes_images), [{"role": "user", "content": [
            {"type": "text", "text": "hi"}, part]}])
    assert caught.value.part_type == str(part.get("type"))
    assert f"a {str(part.get('type'))!r} part" in str(caught.value)


def test_an_assistant_refusal_part_is_its_text() -> None:
    engine = FakeEngine(takes_images=False)
    send(engine, [{"role": "user", "content": "hi"},
                  {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
                  {"role": "user", "content": "please"}])
    assert engine.templated[1] == {"role": "assistant", "content": "no"}


def test_an_image_url_that_is_not_a_url_is_refused_by_its_place() -> None:
    with pytest.raises(PermanentProviderError) as caught:
        send(FakeEngine(takes_images=True), [{"role": "user", "content": [
            image("file:///etc/passwd")]}])
    assert caught.value.body["error"]["param"] == "messages[0].content[0].image_url.url"


def test_an_anthropic_image_block_reaches_the_engine_as_a_data_url() -> None:
    # Given an Anthropic line with a base64 image block, for a local (OpenAI-family) model
    data = png_data_url().split(",", 1)[1]
    params = {"model": "tiny-vlm", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": data}},
        {"type": "text", "text": "what colour?"}]}]}
    body = request_body({ANTHROPIC_PARAMS: params}, DEPLOYMENT)
    # When the translated body is turned into engine work
    (part,) = parts_for(ENDPOINT_CHAT, body, FakeEngine(takes_images=True), DEPLOYMENT)
    # Then its image is there, as the data URL an OpenAI line would carry
    (ref,) = part.payload.images
    assert ref.url == f"data:image/png;base64,{data}"
    assert load_image(ref).getpixel((0, 0)) == (255, 0, 0)


def test_a_data_url_loads_as_an_rgb_image_and_a_bad_one_fails_by_its_place() -> None:
    picture = load_image(ImageRef(png_data_url("blue"), "messages[0].content[0]"))
    assert picture.size == (4, 3) and picture.mode == "RGB"
    for url in ("data:image/png;base64,@@@", "data:image/png,rawbytes",
                "data:image/png;base64," + base64.b64encode(b"not an image").decode()):
        with pytest.raises(PermanentProviderError) as caught:
            load_image(ImageRef(url, "messages[0].content[2]"))
        assert caught.value.body["error"]["param"] == "messages[0].content[2]"


def test_an_image_host_that_cannot_be_reached_is_worth_another_try() -> None:
    with pytest.raises(RetryableProviderError, match="could not be fetched"):
        load_image(ImageRef("http://127.0.0.1:9/a.png", "messages[0].content[0]"), 2.0)
