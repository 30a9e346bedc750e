"""A request's sampling fields beyond temperature, top_p and max_tokens: applied by the
engine that can, refused by name where it cannot.

An OpenAI line may ask for stop sequences, a seed, penalties, a bias on tokens or a
JSON answer. vLLM applies all of them; quotaflow's transformers engine applies none,
and a field dropped in silence would change the answer's meaning (a JSON schema not
followed, a stop sequence run past). So a line with a field its engine does not apply
fails with a 400 naming the field and the engine that would, like any field without a
faithful translation. Fields that do not change the answer (user, metadata, store,
service_tier, ...) are ignored, as the providers' own batch endpoints do for most.
"""

from typing import Any

from quotaflow.errors import PermanentProviderError

# Fields a local engine may apply, and where the request's value goes.
STOP, SEED, PRESENCE, FREQUENCY, BIAS, FORMAT = (
    "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias", "response_format")
SAMPLING_FIELDS = (STOP, SEED, PRESENCE, FREQUENCY, BIAS, FORMAT)
# Fields no local engine applies: tools need a chat template's tool parser (run vLLM as
# a server with one, as an `openai` deployment), logprobs an answer shape of their own.
NEVER_APPLIED = ("tools", "tool_choice", "functions", "function_call", "logprobs",
                 "top_logprobs", "audio", "modalities", "prediction")
VLLM_APPLIES = frozenset(SAMPLING_FIELDS)


def _set(value: Any) -> bool:
    """Whether a field asks for anything: null, false, "" and [] are its defaults."""
    return value not in (None, False, "", [], {})


def extra_sampling(body: dict[str, Any], engine: str,
                   applies: frozenset[str]) -> dict[str, Any]:
    """GenerationRequest's keyword arguments for the fields the engine applies; a 400
    naming the first field it does not."""
    if never := [field for field in NEVER_APPLIED if _set(body.get(field))]:
        raise bad_request(f"'{never[0]}' is not applied by local engines; run the model "
                          "behind a vLLM server (with a tool parser, for tools) as an "
                          "`openai` deployment instead")
    response_format = body.get(FORMAT)
    if isinstance(response_format, dict) and response_format.get("type") == "text":
        response_format = None
    asked = {field for field in SAMPLING_FIELDS
             if _set(response_format if field == FORMAT else body.get(field))}
    if refused := sorted(asked - applies):
        raise bad_request(f"'{refused[0]}' is not applied by the {engine} engine; use "
                          "engine = 'vllm', or leave the field out")
    extra: dict[str, Any] = {}
    if STOP in asked:
        stop = body[STOP]
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise bad_request("'stop' must be a string or a list of non-empty strings")
        extra["stop"] = tuple(stops)
    if SEED in asked:
        if not isinstance(body[SEED], int) or isinstance(body[SEED], bool):
            raise bad_request("'seed' must be an integer")
        extra["seed"] = body[SEED]
    for field in (PRESENCE, FREQUENCY):
        if field in asked:
            extra[field] = _number(body, field, -2.0, 2.0)
    if BIAS in asked:
        extra["logit_bias"] = _bias(body[BIAS])
    if FORMAT in asked:
        extra["structured"] = _structured(response_format)
    return extra


def _number(body: dict[str, Any], field: str, low: float, high: float) -> float:
    value = body[field]
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
        raise bad_request(f"'{field}' must be a number from {low:g} to {high:g}")
    return float(value)


def _bias(bias: Any) -> dict[int, float]:
    try:
        return {int(token): float(value) for token, value in dict(bias).items()}
    except (TypeError, ValueError) as exc:
        raise bad_request("'logit_bias' must map token ids to numbers") from exc


def _structured(response_format: Any) -> dict[str, Any]:
    """vLLM's StructuredOutputsParams keywords for OpenAI's response_format."""
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if isinstance(schema, dict):
            return {"json": schema}
        raise bad_request("'response_format' json_schema needs json_schema.schema, an object")
    raise bad_request(f"'response_format' type {kind!r} is not one of text, json_object, "
                   "json_schema")


def bad_request(message: str) -> PermanentProviderError:
    """A line the engine cannot run as written: a 400 in OpenAI's error shape."""
    return PermanentProviderError(message, status_code=400,
                                  body={"error": {"message": message,
                                                  "type": "invalid_request_error"}})
