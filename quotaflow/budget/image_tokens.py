"""What an image or a file in a prompt costs in tokens at admission (docs/formats/input.md).

An image is never counted as its base64 characters / 4 (a 100 KB PNG would be 34,000
tokens): OpenAI meters it by size and `detail`. "low" is 85 tokens; "high" and "auto"
(and none) scale the image to fit 2048 x 2048, then its shortest side down to 768, and
cost 170 tokens per 512 px tile it covers plus 85. The size is read where it is cheap:
the header of a PNG, GIF or WebP data URL (the first 40 base64 characters; nothing else
of the image is decoded). Where it is not (a URL, a file id, a JPEG or any other data),
the image is taken to be 1024 x 1024 at high detail: 765 tokens, the documented example.

A file part (a PDF: its text plus an image of each page) is taken to cost
FILE_TOKENS (about one page) for a file id or URL, and for inline data one token per
64 base64 characters (48 bytes, so a 50 KB page is about 1,000 tokens), at least
FILE_TOKENS. These are estimates for the limiter; the provider's `usage` settles them.
"""

import base64
import binascii
import math
from typing import Any

LOW_DETAIL_TOKENS = 85
BASE_TOKENS = 85
TILE_TOKENS = 170
TILE_PX = 512
FIT_PX = 2048
SHORT_SIDE_PX = 768
# The size assumed where it cannot be read cheaply: 765 tokens at high detail.
UNKNOWN_SIZE = (1024, 1024)
FILE_TOKENS = 1000
FILE_CHARS_PER_TOKEN = 64
_HEADER_CHARS = 40  # base64 characters of a data URL decoded: 30 bytes of header
_MAX_PREFIX = 128  # "data:image/png;base64," and its parameters


def high_detail_tokens(width: int, height: int) -> int:
    """OpenAI's rule for a high-detail image of that size (an image is scaled down,
    never up)."""
    if width <= 0 or height <= 0:
        return BASE_TOKENS
    w, h = float(width), float(height)
    fit = min(1.0, FIT_PX / max(w, h))
    w, h = w * fit, h * fit
    short = min(1.0, SHORT_SIDE_PX / min(w, h))
    w, h = w * short, h * short
    tiles = math.ceil(round(w, 6) / TILE_PX) * math.ceil(round(h, 6) / TILE_PX)
    return BASE_TOKENS + TILE_TOKENS * tiles


UNKNOWN_IMAGE_TOKENS = high_detail_tokens(*UNKNOWN_SIZE)


def image_tokens(url: Any, detail: Any = None) -> int:
    """An image's tokens: 85 at low detail, else by its size where a data URL's header
    gives it, else UNKNOWN_IMAGE_TOKENS."""
    if detail == "low":
        return LOW_DETAIL_TOKENS
    size = data_url_size(url) if isinstance(url, str) and url.startswith("data:") else None
    return UNKNOWN_IMAGE_TOKENS if size is None else high_detail_tokens(*size)


def file_tokens(data: Any) -> int:
    """A file part's tokens: inline base64 by its length, anything else one page's."""
    if isinstance(data, str) and data:
        comma = data.find(",", 0, _MAX_PREFIX) if data.startswith("data:") else -1
        return max(FILE_TOKENS, (len(data) - comma - 1) // FILE_CHARS_PER_TOKEN)
    return FILE_TOKENS


def data_url_size(url: str) -> tuple[int, int] | None:
    """(width, height) from a base64 data URL's PNG, GIF or WebP header, else None."""
    comma = url.find(",", 0, _MAX_PREFIX)
    if comma < 0 or not url[:comma].endswith(";base64"):
        return None
    head = url[comma + 1:comma + 1 + _HEADER_CHARS]
    try:
        raw = base64.b64decode(head[:len(head) // 4 * 4], validate=True)
    except (binascii.Error, ValueError):
        return None
    return header_size(raw)


def header_size(raw: bytes) -> tuple[int, int] | None:
    """An image's size from its first 30 bytes, for the formats that keep it there."""
    if raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR" and len(raw) >= 24:
        return int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")
    if raw[:6] in (b"GIF87a", b"GIF89a") and len(raw) >= 10:
        return int.from_bytes(raw[6:8], "little"), int.from_bytes(raw[8:10], "little")
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP" and len(raw) >= 30:
        chunk = raw[12:16]
        if chunk == b"VP8X":
            return (int.from_bytes(raw[24:27], "little") + 1,
                    int.from_bytes(raw[27:30], "little") + 1)
        if chunk == b"VP8 ":
            return (int.from_bytes(raw[26:28], "little") & 0x3FFF,
                    int.from_bytes(raw[28:30], "little") & 0x3FFF)
        if chunk == b"VP8L" and raw[20] == 0x2F:
            bits = int.from_bytes(raw[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None
