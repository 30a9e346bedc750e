"""Counting a prompt's tokens the way the model will, for `quotaflow estimate`.

The limiter and the providers admit a request by about characters / 4
(quotaflow/budget/tokens.py); what a request is billed for is the model's own token
count. For OpenAI's models that count is made offline with `bpe-openai` (the
tiktoken encodings, bundled in the wheel: no download, no network), chosen by the
model's name; any other model is counted at characters / 4, and the estimate says
which counter each route used, so nobody reads a guess as a measurement.
"""

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import cast

from quotaflow.budget.tokens import estimate_tokens

CHARS_PER_4 = "chars/4"
# The encodings bpe-openai bundles; older ones (r50k, p50k: davinci and before) would need
# tiktoken's download, so their models are counted at characters / 4.
BUNDLED = frozenset({"o200k_base", "cl100k_base"})
# Model name prefixes of OpenAI's families bpe-openai's own table may not list yet
# (gpt-5, o3, dated snapshots): longest first, so "gpt-4o" wins over "gpt-4".
_PREFIXES = (
    ("gpt-4o", "o200k_base"), ("gpt-4.1", "o200k_base"), ("gpt-4.5", "o200k_base"),
    ("gpt-5", "o200k_base"), ("o1", "o200k_base"), ("o3", "o200k_base"), ("o4", "o200k_base"),
    ("chatgpt-4o", "o200k_base"), ("gpt-4", "cl100k_base"), ("gpt-3.5", "cl100k_base"),
    ("gpt-35", "cl100k_base"), ("text-embedding-3", "cl100k_base"),
    ("text-embedding-ada-002", "cl100k_base"),
)


@dataclass(frozen=True)
class TokenCounter:
    """A way of counting a text's tokens, and its name for the report (an encoding's
    name such as o200k_base, or chars/4)."""

    name: str
    count: Callable[[str], int]


def encoding_name(model: str) -> str | None:
    """The tiktoken encoding of an OpenAI model, or None for any other model. The
    provider prefix of names such as "openai/gpt-4o" is ignored."""
    bpe_openai = _bpe_openai()
    name = model.rsplit("/", 1)[-1].strip().lower()
    if not name:
        return None
    try:
        known = bpe_openai.encoding_name_for_model(name)
    except (KeyError, bpe_openai.UnsupportedModelError):  # not in its table
        known = next((enc for prefix, enc in _PREFIXES if name.startswith(prefix)), None)
    return known if known in BUNDLED else None


@cache
def counter_for(model: str) -> TokenCounter:
    """The counter for a model's prompts: its encoding, else characters / 4."""
    name = encoding_name(model)
    if name is None:
        return TokenCounter(CHARS_PER_4, estimate_tokens)
    return _encoding_counter(name)


@cache
def _encoding_counter(name: str) -> TokenCounter:
    with warnings.catch_warnings():  # its data loads through importlib.resources' old API
        warnings.simplefilter("ignore", DeprecationWarning)
        encoding = _bpe_openai().get_encoding(name)
    # Special-token text in a prompt ("<|endoftext|>") is counted as ordinary text, as
    # the API does, rather than refused.
    return TokenCounter(name, lambda text: len(encoding.encode(text, disallowed_special=())))


@cache
def _bpe_openai() -> ModuleType:
    """bpe-openai, imported when an estimate first needs it (it reads the cl100k table as
    it loads: most of a second), with its use of a deprecated importlib API quiet."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import bpe_openai
    return cast(ModuleType, bpe_openai)
