"""A prompt as the model's token ids: both local engines feed their models ids, so usage
counts are the tokenizer's, the same whichever engine runs the model."""

import threading
from typing import Any

from quotaflow.providers.local.sampling import bad_request


class PromptIds:
    """Chat messages and completion prompts as token ids, with the engine's tokenizer.

    The Rust tokenizer refuses concurrent use ("Already borrowed"): callers' threads encode
    while a batch thread decodes, so every use holds `tokenizer_lock`."""

    name: str
    tokenizer: Any
    tokenizer_lock: threading.Lock
    # A vision-language model's processor, where its chat template (the one that places
    # the image token) is the processor's; None: the tokenizer's template.
    templater: Any = None
    takes_images: bool = False

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        template = self.templater or self.tokenizer
        if not template.chat_template:
            raise bad_request(f"the model of deployment {self.name!r} has no chat template; "
                              "send /v1/completions requests or add chat_template to its "
                              "tokenizer_config.json")
        with self.tokenizer_lock:
            text = template.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=True)
            # The template writes the special tokens (BOS) itself.
            return self._encode(text, special=False)

    def text_ids(self, text: str) -> list[int]:
        with self.tokenizer_lock:
            return self._encode(text, special=True)

    def _encode(self, text: str, special: bool) -> list[int]:
        """The text's ids from the Rust tokenizer itself where there is one: transformers'
        `__call__` around it (a BatchEncoding, its checks) cost several times the encoding."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])
        ids: list[int] = backend.encode(text, add_special_tokens=special).ids
        return ids
