"""A request's sampling fields beyond temperature, top_p and max_tokens: applied by the
engine that can, refused by name where it cannot.

An OpenAI line may ask for stop sequences, a seed, several choices (`n`), log
probabilities, penalties, a bias on tokens or a JSON answer; vLLM's own server also
takes `repetition_penalty`, `top_k` and `min_p`. vLLM applies all of them; quotaflow's
transformers engine applies none, and a field dropped in silence would change the
answer's meaning (a JSON schema not followed, a stop sequence run past, one choice where
three were asked). So a line with a field its engine does not apply fails with a 400
naming the field (`param`) and the engine that would. Fields that do not change the
answer (user, metadata, store, service_tier, ...) are ignored, as the providers' own
batch endpoints do for most.
"""

from collections.abc import Callable
from typing import Any

from quotaflow.constants import ENDPOINT_CHAT
from quotaflow.errors import PermanentProviderError

# Fields a local engine may apply, and where the request's value goes.
STOP, SEED, PRESENCE, FREQUENCY, BIAS, FORMAT = (
    "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "response_format")
N, LOGPROBS, TOP_LOGPROBS, REPETITION, TOP_K, MIN_P = (
    "n", "logprobs", "top_logprobs", "repetition_penalty", "top_k", "min_p")
SAMPLING_FIELDS = (STOP, SEED, PRESENCE, FREQUENCY, BIAS, FORMAT, N, LOGPROBS, TOP_LOGPROBS,
                   REPETITION, TOP_K, MIN_P)
# A field's values that ask for nothing, beyond null, false, "", [] and {} (0 == False).
NEUTRAL = {TOP_K: (-1,)}
# Fields no local engine applies: tools need a chat template's tool parser (run vLLM as
# a server with one, as an `openai` deployment).
NEVER_APPLIED = ("tools", "tool_choice", "functions", "function_call", "audio", "modalities",
                 "prediction")
VLLM_APPLIES = frozenset(SAMPLING_FIELDS)
MAX_LOGPROBS = 20  # vLLM's default max_logprobs, and OpenAI's chat bound
MAX_N = 128  # OpenAI's bound


def _set(field: str, value: Any) -> bool:
    """Whether a field asks for anything: null, false, "", [] and the field's neutral
    values are its defaults. Completions' `logprobs: 0` asks (for the chosen tokens')."""
    if field == LOGPROBS:
        return value is not None and value is not False
    if field in (N, REPETITION):  # neutral at 1; 0 asks (and is refused)
        return value is not None and not (type(value) in (int, float) and value == 1)
    return value not in (None, False, "", [], {}) and value not in NEUTRAL.get(field, ())


def extra_sampling(body: dict[str, Any], url: str, engine: str,
                   applies: frozenset[str]) -> dict[str, Any]:
    """GenerationRequest's keyword arguments for the fields the engine applies; a 400
    naming the first field it does not."""
    if never := [field for field in NEVER_APPLIED if _set(field, body.get(field))]:
        raise bad_request(f"'{never[0]}' is not applied by local engines; run the model "
                          "behind a vLLM server (with a tool parser, for tools) as an "
                          "`openai` deployment instead", param=never[0])
    response_format = body.get(FORMAT)
    if isinstance(response_format, dict) and response_format.get("type") == "text":
        response_format = None
    asked = {field for field in SAMPLING_FIELDS
             if _set(field, response_format if field == FORMAT else body.get(field))}
    if refused := sorted(asked - applies):
        raise bad_request(f"'{refused[0]}' is not applied by the {engine} engine; use "
                          "engine = 'vllm', or leave the field out", param=refused[0])
    # GenerationRequest's keywords are the fields' own names.
    extra = {field: PARSE[field](body, field) for field in sorted(asked) if field in PARSE}
    if FORMAT in asked:
        extra["structured"] = _structured(response_format)
    if asked & {LOGPROBS, TOP_LOGPROBS}:
        extra["logprobs"] = _logprobs(body, url)
    return extra


def _stop(body: dict[str, Any], field: str) -> tuple[str, ...]:
    stop = body[field]
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_request("'stop' must be a string or a list of non-empty strings", field)
    return tuple(stops)


def _logprobs(body: dict[str, Any], url: str) -> int:
    """How many top tokens to report beside each chosen one (vLLM's `logprobs`): chat asks
    with `logprobs: true` and `top_logprobs`, completions with `logprobs: N`."""
    if url != ENDPOINT_CHAT:
        if body.get(TOP_LOGPROBS) is not None:
            raise bad_request("'top_logprobs' is a chat field; completions ask with "
                              "'logprobs': N", TOP_LOGPROBS)
        return _integer(body, LOGPROBS, 0, MAX_LOGPROBS)
    if body.get(LOGPROBS) is not True:
        raise bad_request("'top_logprobs' needs 'logprobs': true", LOGPROBS)
    return 0 if body.get(TOP_LOGPROBS) is None else _integer(body, TOP_LOGPROBS, 0,
                                                             MAX_LOGPROBS)


def _integer(body: dict[str, Any], field: str, low: int, high: int) -> int:
    value = body[field]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        if low < -(2**31):
            raise bad_request(f"'{field}' must be an integer", field)
        raise bad_request(f"'{field}' must be an integer from {low} to {high}", field)
    return value


def _number(body: dict[str, Any], field: str, low: float, high: float) -> float:
    value = body[field]
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
        raise bad_request(f"'{field}' must be a number from {low:g} to {high:g}", field)
    return float(value)


def _bias(bias: Any) -> dict[int, float]:
    try:
        return {int(token): float(value) for token, value in dict(bias).items()}
    except (TypeError, ValueError) as exc:
        raise bad_request("'logit_bias' must map token ids to numbers", BIAS) from exc


def _structured(response_format: Any) -> dict[str, Any]:
    """vLLM's structured-output keywords (StructuredOutputsParams, GuidedDecodingParams
    before it) for OpenAI's response_format."""
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if isinstance(schema, dict):
            return {"json": schema}
        raise bad_request("'response_format' json_schema needs json_schema.schema, an object",
                          FORMAT)
    raise bad_request(f"'response_format' type {kind!r} is not one of text, json_object, "
                      "json_schema", FORMAT)


# How each field's value is checked.
PARSE: dict[str, Callable[[dict[str, Any], str], Any]] = {
    STOP: _stop,
    SEED: lambda body, field: _integer(body, field, -(2**63), 2**63 - 1),
    N: lambda body, field: _integer(body, field, 1, MAX_N),
    PRESENCE: lambda body, field: _number(body, field, -2.0, 2.0),
    FREQUENCY: lambda body, field: _number(body, field, -2.0, 2.0),
    REPETITION: lambda body, field: _number(body, field, 0.01, 10.0),
    TOP_K: lambda body, field: _integer(body, field, 1, 2**31 - 1),
    MIN_P: lambda body, field: _number(body, field, 0.0, 1.0),
    BIAS: lambda body, field: _bias(body[field]),
}


def bad_request(message: str, param: str | None = None) -> PermanentProviderError:
    """A line the engine cannot run as written: a 400 in OpenAI's error shape, naming the
    field (`param`) where one is to blame."""
    error: dict[str, Any] = {"message": message, "type": "invalid_request_error"}
    if param is not None:
        error["param"] = param
    return PermanentProviderError(message, status_code=400, body={"error": error})
