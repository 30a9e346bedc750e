"""The transformers engine: one model and its tokenizer, loaded once, run in batches.

This is the only module that imports torch and transformers; it is imported
when a `local` deployment is first used, so the rest of quotaflow runs
without the `local` extra. Batches are left-padded and generated together;
each row has its own max_tokens, temperature and top_p, and stops at its own
EOS. A row that stops leaves the batch (its KV cache rows are dropped), so the
steps after it cost only what the rows still generating need; transformers'
generate() would carry it, padded, until the longest row ends.
"""

import contextlib
import inspect
import os
import threading
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError, EngineStopped, RetryableProviderError
from quotaflow.providers.local.lora import LoraAdapters
from quotaflow.providers.local.prompt_ids import PromptIds
from quotaflow.providers.local.requests import EMBED, Generated, GenerationRequest, split_kind

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def pick_device(name: str, device: str) -> torch.device:
    """auto: the first CUDA device this process sees (CUDA_VISIBLE_DEVICES pins it), else CPU.

    A named device that is not there is refused before the model loads, with
    the reason; torch's own error ("Torch not compiled with CUDA enabled") comes
    only after the weights are read and does not say which setting to change.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"deployment {name!r}: device {device!r} is not a device torch "
                          "knows; use 'auto', 'cpu', 'cuda' or 'cuda:N'") from exc
    if chosen.type != "cuda":
        return chosen
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen == 0:
        raise ConfigError(
            f"deployment {name!r}: device {device!r}, but this process sees no CUDA device "
            f"(torch {torch.__version__} built for {'CUDA' if torch.version.cuda else 'CPU only'}"
            f", CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!s}); "
            "run the worker on a GPU host with a CUDA build of torch, or set device = 'auto'")
    if chosen.index is not None and chosen.index >= seen:
        raise ConfigError(f"deployment {name!r}: device {device!r}, but this process sees "
                          f"{seen} CUDA device(s), numbered from 0 (CUDA_VISIBLE_DEVICES "
                          "renumbers the ones it keeps)")
    return chosen


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        return DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32  # half precision on CPU is slower, not faster


def next_tokens(logits: torch.Tensor, temperatures: torch.Tensor,
                top_ps: torch.Tensor) -> torch.Tensor:
    """One token per row: its argmax at temperature 0, else sampled with its temperature
    and top-p."""
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    if not bool((temperatures > 0).any()):
        return greedy
    scaled = logits / temperatures.clamp(min=1e-5).unsqueeze(1)
    ordered, order = torch.sort(scaled, descending=True)
    probs = ordered.softmax(dim=-1)
    # Drop a token once the ones before it already cover top_p (the first always stays).
    probs = probs.masked_fill((probs.cumsum(dim=-1) - probs) > top_ps.unsqueeze(1), 0.0)
    picked = torch.multinomial(probs, num_samples=1)
    sampled = order.gather(1, picked).squeeze(1)
    return torch.where(temperatures == 0, greedy, sampled)


class TransformersEngine(PromptIds):
    """A causal LM from a local directory (or hub id), on the chosen device and dtype."""

    applies: frozenset[str] = frozenset()  # no sampling field beyond temperature, top_p
    # A causal LM takes no image parts: a line with one fails naming it (content.py).
    takes_images = False
    stopped = False  # set by close(): the batch in hand ends at its next step

    def __init__(self, deployment: Deployment) -> None:
        self.name = deployment.name
        self.device = pick_device(self.name, deployment.device)
        self.dtype = pick_dtype(deployment.dtype, self.device)
        path = deployment.model_path
        assert path is not None  # a local deployment names one (Deployment's validator)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"deployment {self.name!r}: cannot load a model from {path!r} ({exc}); "
                "model_path must be a directory written by save_pretrained (config.json, "
                "weights, tokenizer files)") from exc
        # transformers types the wrapper of .to as unbound (its self the model).
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]
        # LoRA adapters go into the model's own layers: the calls below stay as they are.
        self.adapters = LoraAdapters(self.model, deployment) if deployment.adapters else None
        # The prompt's pass needs the logits of its last position only: over a vocabulary of
        # 150k, all of them would take more memory than the rest of the batch.
        accepts = inspect.signature(model.forward).parameters
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in accepts else {}
        # The cache's keyword: `cache` since transformers 5.24 (`past_key_values` warns
        # there, and goes in 5.40), `past_key_values` before.
        self._cache_arg = "cache" if "cache" in accepts else "past_key_values"
        cache_accepts = inspect.signature(DynamicCache.__init__).parameters
        self._cache_options: dict[str, Any] = ({"config": model.config}
                                               if "config" in cache_accepts else {})
        self.eos_ids = _eos_ids(self.tokenizer, model)
        if not self.eos_ids:
            raise ConfigError(f"deployment {self.name!r}: the model at {path!r} names no EOS "
                              "token, so generation could not stop before max_tokens")
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]
        config = model.config
        self.max_context: int | None = (getattr(config, "max_position_embeddings", None)
                                        or getattr(config, "n_positions", None))
        # The Rust tokenizer refuses concurrent use ("Already borrowed"): callers'
        # threads encode while the batch thread decodes.
        self.tokenizer_lock = threading.Lock()

    def close(self) -> None:
        """Stop the batch in hand at its next step (its requests are handed back): the
        model lives in this process, but a thread still inside torch when the
        interpreter exits aborts it ("terminate called without an active exception")."""
        self.stopped = True

    def run_batch(self, kind: Hashable, payloads: Sequence[Any]) -> list[Any]:
        """The batcher's callback: errors of the device become retryable provider errors.
        A batch's kind names its LoRA adapter, if any (the batcher groups by it)."""
        kind, adapter = split_kind(kind)
        try:
            with torch.inference_mode(), self._adapter(adapter):
                if kind == EMBED:
                    return self.embed(payloads)
                return self.generate(payloads)
        except torch.cuda.OutOfMemoryError as exc:
            raise RetryableProviderError(
                f"{self.name}: out of memory running a batch of {len(payloads)}; lower "
                "max_batch_tokens or max_batch_size") from exc
        except RuntimeError as exc:
            raise RetryableProviderError(f"{self.name}: the model failed: {exc}") from exc

    def _adapter(self, adapter: str | None) -> Any:
        """The adapter's context for a batch: nothing to switch on a model without any (a
        request names an adapter only where its deployment has them: adapters.py)."""
        if self.adapters is None:
            return contextlib.nullcontext()
        return self.adapters.use(adapter)

    def _left_padded(self, rows: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row):] = 1
        return ids.to(self.device), mask.to(self.device)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generated]:
        """Greedy or sampled decoding of the batch, one step for all rows still going."""
        ids, mask = self._left_padded([r.input_ids for r in requests])
        limits = [r.max_new_tokens for r in requests]
        temperatures = torch.tensor([r.temperature for r in requests], device=self.device)
        top_ps = torch.tensor([r.top_p for r in requests], device=self.device)
        tokens: list[list[int]] = [[] for _ in requests]
        live = list(range(len(requests)))  # batch row -> request index, for rows still going
        # Left padding: each row's positions count its own tokens only, as generate() does.
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        cache = self._new_cache()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         use_cache=True, **{self._cache_arg: cache}, **self._last_logits_only)
        last = positions[:, -1:]
        while True:
            if self.stopped:
                raise EngineStopped(f"{self.name}: the engine is shutting down")
            chosen = next_tokens(out.logits[:, -1, :], temperatures, top_ps)
            going = []
            for row, token in enumerate(chosen.tolist()):
                owner = live[row]
                tokens[owner].append(token)
                if token not in self.eos_ids and len(tokens[owner]) < limits[owner]:
                    going.append(row)
            if not going:
                break
            if len(going) < len(live):
                keep = torch.tensor(going, device=self.device)
                cache.batch_select_indices(keep)
                mask, last, chosen = mask[keep], last[keep], chosen[keep]
                temperatures, top_ps = temperatures[keep], top_ps[keep]
                live = [live[row] for row in going]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
            last = last + 1
            out = self.model(input_ids=chosen.unsqueeze(1), attention_mask=mask,
                             position_ids=last, use_cache=True, **{self._cache_arg: cache})
        return [self._finished(row) for row in tokens]

    def _new_cache(self) -> DynamicCache:
        """A cache laid out for the model's layers (sliding ones too), where the installed
        transformers can read that from the config."""
        return DynamicCache(**self._cache_options)

    def _finished(self, tokens: list[int]) -> Generated:
        """Count up to and including the first EOS; the rest is padding after the stop."""
        stop = next((i for i, t in enumerate(tokens) if t in self.eos_ids), None)
        kept = tokens if stop is None else tokens[:stop]
        with self.tokenizer_lock:
            text = self.tokenizer.decode(kept, skip_special_tokens=True)
        if stop is None:
            return Generated(len(tokens), text, "length")
        return Generated(stop + 1, text, "stop")

    def embed(self, rows: Sequence[list[int]]) -> list[list[float]]:
        """Mean of the last hidden states over the prompt, L2-normalised as OpenAI's are."""
        ids, mask = self._left_padded(rows)
        hidden = self.model(input_ids=ids, attention_mask=mask,
                            output_hidden_states=True).hidden_states[-1].float()
        weights = mask.unsqueeze(-1).float()
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1)
        return torch.nn.functional.normalize(pooled, dim=-1).cpu().tolist()


def _eos_ids(tokenizer: Any, model: Any) -> list[int]:
    """Every id that ends a reply: the tokenizer's EOS and the model's generation config's."""
    ids: list[int] = []
    configured = getattr(model.generation_config, "eos_token_id", None)
    for value in (tokenizer.eos_token_id, configured):
        for token in value if isinstance(value, list) else [value]:
            if token is not None and token not in ids:
                ids.append(int(token))
    return ids
