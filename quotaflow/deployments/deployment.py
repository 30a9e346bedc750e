"""One deployment: a provider endpoint + model + key with its own limits and prices.

Its fields are the `[deployments.NAME]` table of the deployments file
(quotaflow/deployments/catalog.py reads the file and holds the routes between them); the
checks here are the ones a single table can fail.
"""
import os
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from quotaflow.deployments.adapters import check_adapters, served_models
from quotaflow.deployments.extras import ExtraValue, check_headers
from quotaflow.deployments.google import check_google
from quotaflow.deployments.limits import Budget, Refunds
from quotaflow.deployments.price_fields import LongContextPrices, check_prices, prices_of
from quotaflow.deployments.pricing import Prices
from quotaflow.errors import ConfigError

ProviderKind = Literal["openai", "mock", "local", "anthropic", "openai-batch", "anthropic-batch",
                       "gemini", "vertex", "bedrock", "azure", "azure-batch"]
# Kinds whose lines go to the provider's own Batch API (quotaflow/offload/), not one call each.
BATCH_KINDS = frozenset({"openai-batch", "anthropic-batch", "azure-batch"})
# The providers' per-batch limits (lines, bytes), unless a deployment sets lower ones:
# OpenAI's Batch API 50,000 requests / 200 MB a file; Anthropic's 100,000 / 256 MB;
# Azure OpenAI's 100,000 / 200 MB.
BATCH_LIMITS = {"openai-batch": (50_000, 200 * 1024 * 1024),
                "anthropic-batch": (100_000, 256 * 1024 * 1024),
                "azure-batch": (100_000, 200 * 1024 * 1024)}
# Anthropic's Messages API version header, unless a deployment names another.
ANTHROPIC_VERSION = "2023-06-01"
# The in-process engines a `local` deployment can run on (quotaflow/providers/local/).
LocalEngine = Literal["transformers", "vllm"]
VllmRunner = Literal["auto", "generate", "pooling"]
VllmScheduling = Literal["priority", "fcfs"]
LocalDtype = Literal["auto", "float32", "float16", "bfloat16"]
# Which Bedrock Runtime operation a `bedrock` deployment calls (quotaflow/providers/bedrock.py).
BedrockApi = Literal["converse", "invoke"]


class Deployment(BaseModel):
    """One place a model can be called: provider + endpoint + model + key."""

    name: str = Field(
        json_schema_extra={"default_text": "the table's NAME"},
        description="The deployment's name: `NAME` of its `[deployments.NAME]` table, set from "
        "the table (routes, metrics, limits and provenance name it).")
    provider: ProviderKind = Field(
        description="The kind of provider: `openai` (any OpenAI-compatible API), `mock` "
        "(simulated, in process), `local` (a model in the worker), `anthropic` (the Messages "
        "API), `openai-batch` or `anthropic-batch` (the providers' Batch APIs, bulk jobs "
        "only), `gemini` (Google's Gemini API), `vertex` (Vertex AI), `bedrock` (AWS "
        "Bedrock), `azure` (Azure OpenAI: deployment-name or `/openai/v1/` paths, "
        "`api-key` or Entra ID; docs/deployments/azure.md) or `azure-batch` (Azure "
        "OpenAI's Batch API, a global-batch deployment; bulk jobs only).")
    model: str = Field(
        description="The model sent to the provider (a `local` deployment's: the name "
        "requests use and answers carry). A model with no route goes to every deployment "
        "whose `model` it is.")
    base_url: str | None = Field(
        default=None,
        description="The provider's URL: required for `openai` (e.g. "
        "`https://api.openai.com/v1`), `anthropic` (`https://api.anthropic.com`; `/v1/messages` "
        "is added), `azure` (`https://NAME.openai.azure.com`, or `.../openai/v1` for the v1 "
        "API) and the batch kinds; any proxy or gateway in front of them may stand in.")
    api_key_env: str | None = Field(
        default=None,
        description="The environment variable holding the API key, read at call time; the key "
        "is never stored or logged. Unset: no key is sent.")
    api_version: str | None = Field(
        default=None,
        description="`azure`: the `api-version` query parameter (e.g. `2024-10-21`); required "
        "with the deployment-name path, optional with the `/openai/v1` path.")
    headers: dict[str, ExtraValue] = Field(
        default_factory=dict, json_schema_extra={"default_text": "none"},
        description="HTTP headers sent with every call (`OpenAI-Organization`, a gateway's "
        "tenant header); a value is a string or `{ env = \"NAME\" }`, read from that "
        "environment variable at call time. Never logged.")
    query: dict[str, ExtraValue] = Field(
        default_factory=dict, json_schema_extra={"default_text": "none"},
        description="Query parameters added to every call's URL; values as for `headers`. "
        "Never logged.")
    rpm: int = Field(
        gt=0,
        description="Requests per minute; `rpm` x `burst_seconds` / 60 must hold a request. "
        "Batch kinds default to a figure that never binds (their batch limits stand "
        "instead).")
    tpm: int = Field(
        default=0, gt=0, json_schema_extra={"default_text": "required, or itpm + otpm"},
        description="Tokens per minute, input and output together (OpenAI's TPM); required "
        "unless an `anthropic` deployment gives `itpm` and `otpm`, whose sum it then is.")
    itpm: int | None = Field(
        default=None, gt=0,
        description="`anthropic` only: input tokens per minute, limited apart from output "
        "(set with `otpm`, instead of `tpm`).")
    otpm: int | None = Field(
        default=None, gt=0,
        description="`anthropic` only: output tokens per minute (set with `itpm`).")
    anthropic_version: str = Field(
        default=ANTHROPIC_VERSION,
        description="`anthropic` and `anthropic-batch`: the `anthropic-version` header of every "
        "call.")
    project: str | None = Field(
        default=None, description="`vertex` (required): the Google Cloud project id.")
    location: str | None = Field(
        default=None,
        description="`vertex` (required): the Vertex AI location, e.g. `us-central1` or "
        "`global`.")
    credentials_file: str | None = Field(
        default=None,
        description="`vertex`: a service-account JSON key file; unset: google-auth's "
        "application default credentials.")
    burst_seconds: float = Field(
        default=60.0, gt=0, le=60,
        description="The window the provider enforces its per-minute limits over: 60 for a "
        "minute, 1 for providers that enforce per second (OpenAI says it may). The buckets "
        "hold limit x `burst_seconds` / 60.")
    default_max_tokens: int = Field(
        default=1024, gt=0,
        description="Counted at admission (and sent to Anthropic, which requires one) when a "
        "request sets no max tokens; keep it at or above the provider's own default so "
        "quotaflow never under-counts.")
    reconcile_usage: bool | Literal["auto"] = Field(
        default="auto",
        description="Whether the provider gives back the unused part of `max_tokens` after a "
        "call: `auto` learns it from its rate-limit headers (no refunds until they show "
        "them), `true` and `false` force it (`true` for a server sending no such headers, "
        "such as vLLM).")
    safety_margin_s: float = Field(
        default=0.25, ge=0, le=10,
        description="Budget kept in hand, in seconds of refill: at least the time a request "
        "takes to reach the provider (a full provider bucket loses that refill).")
    timeout_s: float = Field(default=60.0, gt=0,
                             description="Seconds one HTTP call to the provider may take.")
    max_concurrency: int = Field(
        default=16, gt=0,
        description="Calls in flight per batch run on this deployment; raise it (64-256) to "
        "feed an inference server's batching.")
    weight: float = Field(
        default=1.0, gt=0,
        description="Routing: utilisation is divided by it, so a deployment of weight 2 runs "
        "twice as full as its peers, and ties are broken in proportion to the weights.")
    quota: str | None = Field(
        default=None,
        description="Deployments naming one quota share one upstream limit (one key or "
        "organisation behind several endpoints): they spend one budget, must declare the same "
        "limits, and a 429 quiets them all.")
    circuit_failures: int = Field(
        default=5, gt=0,
        description="The circuit opens after this many failures in a row (5xx, timeouts, "
        "resets, malformed answers; never 429s).")
    circuit_cooldown_s: float = Field(
        default=30.0, gt=0,
        description="How long an open circuit waits before it lets one probe request through.")
    input_per_mtok: float | None = Field(
        default=None, ge=0,
        description="Price per million prompt tokens (with `output_per_mtok`: both or "
        "neither); without prices usage is counted but its cost is unknown.")
    output_per_mtok: float | None = Field(
        default=None, ge=0, description="Price per million completion tokens.")
    cached_input_per_mtok: float | None = Field(
        default=None, ge=0,
        description="Price per million prompt tokens read from the provider's cache "
        "(OpenAI's `cached_tokens`, Anthropic's `cache_read_input_tokens`, Gemini's cached "
        "content; needs the other two prices); unset: billed as any input.")
    cache_write_per_mtok: float | None = Field(
        default=None, ge=0,
        description="Price per million prompt tokens written to the cache (Anthropic's "
        "`cache_creation_input_tokens`, Bedrock's `cacheWriteInputTokens`; 1.25 x input "
        "at Anthropic); unset: billed as any input.")
    cache_write_1h_per_mtok: float | None = Field(
        default=None, ge=0,
        description="Price per million tokens of 1-hour cache writes (Anthropic's "
        "`ephemeral_1h_input_tokens`, 2 x input); unset: at `cache_write_per_mtok`.")
    long_context: LongContextPrices | None = Field(
        default=None, json_schema_extra={"default_text": "none"},
        description="A long-context tier: `{ above_tokens = 200000, input_per_mtok = ..., "
        "output_per_mtok = ... }` (and the cache prices the deployment sets); a request "
        "whose prompt has more than `above_tokens` tokens is priced at it, all its tokens.")
    currency: str = Field(
        default="USD", min_length=3, max_length=3,
        description="The prices' currency: one for all priced deployments.")

    batch_max_lines: int | None = Field(
        default=None, gt=0,
        description="Batch kinds: the most lines one provider batch holds (unset: the "
        "provider's own limit, 50,000 at OpenAI, 100,000 at Anthropic and Azure).")
    batch_max_bytes: int | None = Field(
        default=None, gt=0,
        description="Batch kinds: the most bytes one provider batch holds (unset: 200 MB at "
        "OpenAI, 256 MB at Anthropic).")
    batch_max_tokens: int | None = Field(
        default=None, gt=0,
        description="Batch kinds: the most estimated prompt tokens one provider batch holds "
        "(your organisation's enqueued-token limit; unset: none).")
    completion_window: str = Field(
        default="24h", description="`openai-batch`: the completion window its batches ask for.")

    engine: LocalEngine = Field(
        default="transformers",
        description="`local`: the in-process engine: `transformers` (quotaflow's dynamic "
        "batcher; any model transformers loads, CPU or GPU) or `vllm` (vLLM's continuous "
        "batching, paged KV cache and per-request priority; the worker runs under an "
        "interpreter with vLLM installed).")
    model_path: str | None = Field(
        default=None,
        description="`local` (required): a directory written by `save_pretrained` (weights "
        "and tokenizer), or a hub id where the worker may download.")
    adapters: dict[str, str] = Field(
        default_factory=dict, json_schema_extra={"default_text": "none"},
        description="`local`: LoRA adapters, name -> a directory written by peft's "
        "`save_pretrained` (e.g. `{ support = \"/models/support-lora\" }`). A line whose "
        "`model` is an adapter's name runs with that adapter, one whose `model` is `model` on "
        "the base weights; routes find the deployment by its adapters' names too, and with "
        "adapters any other model fails its line. vLLM serves them in one continuous batch; "
        "transformers runs one adapter per model batch (peft).")
    dtype: LocalDtype = Field(
        default="auto",
        description="`local`: `auto` is bfloat16 on a GPU that supports it (float16 without "
        "bf16), float32 on a CPU (CPUs are slow in half precision).")
    device: str = Field(
        default="auto",
        description="`local`: `auto` is cuda when present, else cpu; or `cpu`, `cuda`, "
        "`cuda:1`. A named device that is not there is refused before the model loads.")
    max_batch_size: int = Field(
        default=16, gt=0, le=4096, description="`local`: the most requests in one model batch.")
    max_batch_tokens: int = Field(
        default=65536, gt=0,
        description="`local`: the most padded tokens in one model batch (rows x (longest "
        "prompt + largest max_tokens)), which bounds its memory.")
    max_wait_ms: float = Field(
        default=20.0, ge=0, le=10_000,
        description="`local`: how long the first request of a model batch waits for more to "
        "join it.")
    max_model_len: int | None = Field(
        default=None, gt=0,
        description="`local`, engine `vllm`: the longest prompt + reply in tokens (unset: the "
        "model's own context).")
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1,
        description="`local`, engine `vllm`: the share of GPU memory vLLM may take for weights "
        "and KV cache (on CPU the KV cache is VLLM_CPU_KVCACHE_SPACE GiB instead).")
    tensor_parallel_size: int = Field(
        default=1, gt=0,
        description="`local`, engine `vllm`: the GPUs one model is split over.")
    enable_prefix_caching: bool | None = Field(
        default=None,
        description="`local`, engine `vllm`: reuse the KV cache of shared prompt prefixes "
        "(unset: vLLM's default for the model).")
    max_num_seqs: int | None = Field(
        default=None, gt=0,
        description="`local`, engine `vllm`: the most sequences in one scheduler step (unset: "
        "vLLM's default). The transformers engine's equivalent is max_batch_size.")
    enforce_eager: bool = Field(
        default=False,
        description="`local`, engine `vllm`: skip graph capture and torch.compile (faster start,"
        " slower steps; worth it for tests and short runs on CPU).")
    scheduling_policy: VllmScheduling = Field(
        default="priority",
        description="`local`, engine `vllm`: `priority` schedules a request by its queue "
        "(realtime before standard before bulk, then by arrival); `fcfs` by arrival only.")
    engine_nice: int = Field(
        default=19, ge=0, le=19,
        description="`local`, engine `vllm`: how many nice steps below the worker vLLM's "
        "engine processes run: on a CPU host the engine takes every core, and the worker's "
        "leases, cancels and result writes beside it must not wait for a core. The kernel "
        "weighs each of the engine's threads on its own, so it takes all 19 steps to keep "
        "their sum below one worker thread (0: the worker's priority).")
    runner: VllmRunner = Field(
        default="auto",
        description="`local`, engine `vllm`: `generate` (chat and completions), `pooling` "
        "(embeddings; a causal LM is converted), or `auto` (vLLM picks from the model).")
    default_temperature: float = Field(
        default=1.0, ge=0, le=2,
        description="`local`: the temperature of requests that set none (0: greedy).")
    default_top_p: float = Field(default=1.0, gt=0, le=1,
                                 description="`local`: the top_p of requests that set none.")

    region: str | None = Field(
        default=None,
        description="`bedrock`: the AWS region its requests are signed for and sent to "
        "(`https://bedrock-runtime.{region}.amazonaws.com` unless `base_url` is set); unset: "
        "the AWS configuration's (AWS_REGION, AWS_DEFAULT_REGION, the profile's).")
    aws_profile: str | None = Field(
        default=None,
        description="`bedrock`: the AWS profile whose credentials sign its requests; unset: "
        "AWS's default chain (environment, shared files, container or instance role).")
    bedrock_api: BedrockApi = Field(
        default="converse",
        description="`bedrock`: `converse` (the Converse API, any model) or `invoke` "
        "(InvokeModel with Anthropic Messages bodies, Claude models only).")

    @model_validator(mode="before")
    @classmethod
    def _batch_defaults(cls, value: Any) -> Any:
        """A batch deployment is never admitted call by call: its provider's batch limits
        stand instead of rpm/tpm, which default to figures that never bind."""
        if isinstance(value, dict) and value.get("provider") in BATCH_KINDS:
            value = {"rpm": 1_000_000, "tpm": 1_000_000_000, **value}
        return value

    @model_validator(mode="after")
    def _check(self) -> "Deployment":
        if self.provider in BATCH_KINDS and not self.base_url:
            raise ValueError(f"provider {self.provider!r} needs base_url (e.g. "
                             "https://api.openai.com/v1 or https://api.anthropic.com)")
        if self.provider == "openai" and not self.base_url:
            raise ValueError("provider 'openai' needs base_url (e.g. http://127.0.0.1:8000/v1)")
        if self.provider in ("azure", "azure-batch"):
            self._check_azure()
        check_headers(self.headers)
        check_adapters(self.provider, self.model, self.adapters)
        if (self.headers or self.query) and self.provider in ("mock", "local"):
            raise ValueError(f"provider {self.provider!r} makes no HTTP calls: headers and "
                             "query apply to the kinds that do")
        if self.provider == "anthropic" and not self.base_url:
            raise ValueError("provider 'anthropic' needs base_url (e.g. https://api.anthropic.com;"
                             " quotaflow calls {base_url}/v1/messages)")
        self._check_token_limits()
        check_google(self.provider, self.project, self.location, self.api_key_env,
                     self.credentials_file)
        if self.provider == "local" and not self.model_path:
            raise ValueError("provider 'local' needs model_path (a directory written by "
                             "save_pretrained, e.g. /models/qwen2.5-0.5b-instruct)")
        check_prices(self)
        if self.rpm * self.burst_seconds / 60 < 1:
            raise ValueError(
                f"rpm {self.rpm} x burst_seconds {self.burst_seconds:g} / 60 holds less than "
                "one request, so nothing could ever be sent; raise rpm or burst_seconds")
        return self

    def _check_azure(self) -> None:
        if self.provider == "azure-batch" and (self.azure_v1 or not self.api_version
                                               or not self.base_url):
            raise ValueError("provider 'azure-batch' needs the resource's endpoint as "
                             "base_url (https://NAME.openai.azure.com, not .../openai/v1) "
                             "and api_version (e.g. \"2024-10-21\")")
        if not self.base_url:
            raise ValueError("provider 'azure' needs base_url (https://NAME.openai.azure.com, or "
                             "https://NAME.openai.azure.com/openai/v1 for the v1 API)")
        if not self.azure_v1 and not self.api_version:
            raise ValueError("provider 'azure' needs api_version (e.g. \"2024-10-21\") for "
                             "the deployment-name path; or end base_url in /openai/v1")
        if "api-version" in self.query:
            raise ValueError("query: set api-version with api_version, not query")

    @property
    def azure_v1(self) -> bool:
        """An `azure` deployment on Azure's v1 API (base_url ends in /openai/v1)."""
        return (self.base_url or "").rstrip("/").endswith("/openai/v1")

    def _check_token_limits(self) -> None:
        """tpm, or (anthropic only) itpm and otpm: one token budget or two."""
        split = (self.itpm is not None, self.otpm is not None)
        if any(split) and self.provider != "anthropic":
            raise ValueError(f"itpm/otpm are Anthropic's separate input and output token limits;"
                             f" provider {self.provider!r} has one token limit: set tpm")
        if split == (True, False) or split == (False, True):
            raise ValueError("set itpm and otpm together (Anthropic limits input and output "
                             "tokens apart), or neither and tpm")
        if all(split):
            assert self.itpm is not None and self.otpm is not None
            if self.tpm and self.tpm != self.itpm + self.otpm:  # the sum: validated before
                raise ValueError("set tpm or itpm and otpm, not both: with itpm and otpm the "
                                 "input and output tokens have separate budgets")
            self.tpm = self.itpm + self.otpm
        elif not self.tpm:
            more = " (or itpm and otpm)" if self.provider == "anthropic" else ""
            raise ValueError(f"tpm{more} is required: the provider's tokens-per-minute limit")

    def serves(self, model: str) -> bool:
        """Whether a line of that model can run here: its own model, or one of its adapters."""
        return model in served_models(self.model, self.adapters)

    @property
    def is_batch(self) -> bool:
        """Its lines go to the provider's Batch API (quotaflow/offload/)."""
        return self.provider in BATCH_KINDS

    @property
    def batch_limits(self) -> tuple[int, int, int | None]:
        """(lines, bytes, prompt tokens) one provider batch may hold."""
        lines, size = BATCH_LIMITS.get(self.provider, (50_000, 200 * 1024 * 1024))
        return (min(lines, self.batch_max_lines or lines),
                min(size, self.batch_max_bytes or size), self.batch_max_tokens)

    @property
    def split_tokens(self) -> bool:
        """Input and output tokens are limited apart (itpm and otpm)."""
        return self.itpm is not None and self.otpm is not None

    @cached_property
    def prices(self) -> Prices | None:
        """What its tokens cost, or None where the file gives no prices."""
        if self.input_per_mtok is None or self.output_per_mtok is None:
            return None
        return prices_of(self, self.currency.upper())

    @cached_property
    def budget(self) -> Budget:
        """Its limits as the limiter's buckets see them: derived here, once, for every
        reader (routing, admission, estimates, gauges)."""
        tpm, itpm = self.tpm, 0.0
        if self.itpm is not None and self.otpm is not None:
            tpm, itpm = self.otpm, self.itpm
        return Budget(self.budget_name, self.rpm, tpm, self.burst_seconds,
                      flight_timeout_s=4 * self.timeout_s + 60, margin_s=self.safety_margin_s,
                      refunds=Refunds.of(self.reconcile_usage), itpm=itpm)

    @property
    def budget_name(self) -> str:
        """The limiter bucket this deployment spends: its quota's, or its own."""
        return f"quota:{self.quota}" if self.quota else self.name

    def api_key(self) -> str | None:
        """The key from the environment, read at call time and never stored."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(
                f"deployment {self.name!r} reads its API key from ${self.api_key_env}, "
                "which is not set"
            )
        return key
