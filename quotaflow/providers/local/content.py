"""A chat line's content parts as the model's chat template takes them, and its images;
a part the deployment cannot serve fails the line.

Local engines once kept only the text parts of a message: a line with an image was
answered from its text alone, and "succeeded". Now text parts (and an assistant's
`refusal`) become the template's text; an `image_url` part (a URL, or a base64 data
URL, as OpenAI lines carry them; an Anthropic `image` block arrives translated to one,
quotaflow/providers/translate/) becomes the template's `{"type": "image"}` placeholder
where the deployment's model takes images, its URL kept, in order, for the engine to
load (images.py); any other part (audio, a file, an image for a text-only model, a type
nobody knows) fails the line with UnservedContent naming the part's type, where it is,
and the deployment. Torch- and vLLM-free.
"""

from dataclasses import dataclass
from typing import Any

from quotaflow.errors import UnservedContent
from quotaflow.providers.local.sampling import bad_request

# A text-bearing part's type, and the key of its text.
TEXT_KEYS = {"text": "text", "refusal": "refusal"}
IMAGE = "image_url"
IMAGE_URL_SCHEMES = ("http://", "https://", "data:image/")
ENGINES_TAKE = "local engines take text and image_url parts"


@dataclass(frozen=True)
class ImageRef:
    """One image of a prompt: its URL (http(s) or a base64 data URL) and where the line
    had it (`messages[0].content[1]`), to name in an error."""

    url: str
    param: str


@dataclass(frozen=True)
class Prompt:
    """The messages as the chat template takes them, and the images they place."""

    messages: list[dict[str, Any]]
    images: tuple[ImageRef, ...]


def template_messages(messages: list[Any], deployment: str, takes_images: bool) -> Prompt:
    """A message whose content is a list of text parts becomes one string (chat templates
    of text models want strings); one with images keeps its parts, each image as the
    template's `{"type": "image"}`."""
    out: list[dict[str, Any]] = []
    images: list[ImageRef] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request(f"messages[{index}] must be an object", f"messages[{index}]")
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts, placed = _parts(content, f"messages[{index}].content", deployment,
                               takes_images)
        images += placed
        if placed:
            out.append({**message, "content": parts})
        else:
            out.append({**message, "content": "".join(p["text"] for p in parts)})
    return Prompt(out, tuple(images))


def _parts(content: list[Any], path: str, deployment: str,
           takes_images: bool) -> tuple[list[dict[str, Any]], list[ImageRef]]:
    parts: list[dict[str, Any]] = []
    images: list[ImageRef] = []
    for n, part in enumerate(content):
        where = f"{path}[{n}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_KEYS:
            text = part.get(TEXT_KEYS[kind])
            if not isinstance(text, str):
                raise bad_request(f"{where}.{TEXT_KEYS[kind]} must be a string", where)
            parts.append({"type": "text", "text": text})
        elif kind == IMAGE and takes_images:
            images.append(ImageRef(_image_url(part, where), where))
            parts.append({"type": "image"})
        elif kind == IMAGE:
            raise UnservedContent(deployment, IMAGE, where, "its model takes no images")
        else:
            why = ENGINES_TAKE if takes_images else "its model takes text parts only"
            raise UnservedContent(deployment, str(kind), where, why)
    return parts, images


def _image_url(part: dict[str, Any], where: str) -> str:
    """The part's URL: `image_url` as {"url", "detail"} (or, as some clients send it, the
    URL itself). `detail` is not applied: vLLM's own server ignores it too."""
    image = part.get(IMAGE)
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url.startswith(IMAGE_URL_SCHEMES):
        raise bad_request(f"{where}.image_url.url must be an http(s) URL or a base64 "
                          "data:image/... URL", f"{where}.image_url.url")
    return url
