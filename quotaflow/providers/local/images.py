"""An image part's URL as a picture the engine can take: a base64 data URL decoded, an
http(s) URL fetched (as vLLM's own server does for `image_url` parts).

A URL that cannot give an image fails its line by its part's place (400); a fetch that
timed out or met a server error may work later, and is retried as any provider call.
Called off the event loop (the engine's thread or asyncio.to_thread): a fetch blocks.
Pillow, which both engines' installs bring, is imported when an image is first loaded.
"""

import base64
import binascii
import io
import urllib.error
import urllib.request
from typing import Any

from quotaflow.errors import RetryableProviderError
from quotaflow.providers.local.content import ImageRef
from quotaflow.providers.local.sampling import bad_request

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # OpenAI's limit on one image
FETCH_TIMEOUT_S = 20.0


def load_image(image: ImageRef, timeout_s: float = FETCH_TIMEOUT_S) -> Any:
    """The image as an RGB PIL image."""
    from PIL import Image, UnidentifiedImageError

    data = _data_url_bytes(image) if image.url.startswith("data:") else _fetched(image,
                                                                                  timeout_s)
    try:
        picture = Image.open(io.BytesIO(data))
        picture.load()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise bad_request(f"{image.param}: the image cannot be read ({exc})",
                          image.param) from exc
    return picture.convert("RGB")


def _data_url_bytes(image: ImageRef) -> bytes:
    header, _, payload = image.url.partition(",")
    if not header.endswith(";base64") or not payload:
        raise bad_request(f"{image.param}: a data URL must be data:image/...;base64,<data>",
                          image.param)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"{image.param}: the data URL's base64 does not decode",
                          image.param) from exc


def _fetched(image: ImageRef, timeout_s: float) -> bytes:
    try:
        with urllib.request.urlopen(image.url, timeout=timeout_s) as response:
            data: bytes = response.read(MAX_IMAGE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        if exc.code < 500 and exc.code != 429:
            raise bad_request(f"{image.param}: fetching the image got HTTP {exc.code}",
                              image.param) from exc
        raise RetryableProviderError(f"{image.param}: fetching the image got HTTP "
                                     f"{exc.code}") from exc
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise RetryableProviderError(f"{image.param}: the image could not be fetched "
                                     f"({exc})") from exc
    if len(data) > MAX_IMAGE_BYTES:
        raise bad_request(f"{image.param}: the image is over {MAX_IMAGE_BYTES} bytes",
                          image.param)
    return data
