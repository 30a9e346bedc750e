"""The OpenAPI schema says what the routes really answer, and what they take.

Each route lists its error statuses itself (api.errors.responses). FastAPI adds a 422
to every route with parameters; under /v1 a parameter that does not validate is
OpenAI's 400 instead (api/errors.py), so there the 422 is taken out again. A route
states rules across its form's fields (both or neither) as FORM_RULES in its
`openapi_extra`, put into the form's schema here. A query,
header or form parameter is left out rather than sent as null, so its schema does not
offer null (a generated client or fuzzer would send the text "null"). A form's file is
also spelled `format: binary`, which client generators read as a file upload. A boolean
sent as text takes the words pydantic reads as one (`true`, `0`, `yes`, `off`, ... in
any case), and the schema says so. An optional form field sent empty is one left out
(FastAPI reads it so), which its schema allows, unless a rule pairs it with another.
"""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.errors import ErrorBody, responses

V1_PREFIX = "/v1/"
NULL = {"type": "null"}
FORMS = ("multipart/form-data", "application/x-www-form-urlencoded")
FORM_RULES = "x-form-rules"
# The texts pydantic reads as a boolean, in any case.
BOOL_WORDS = ("true", "false", "t", "f", "yes", "no", "y", "n", "on", "off", "1", "0")
BOOL_TEXT = {"type": "string", "pattern": "^(" + "|".join(
    "".join(f"[{c}{c.upper()}]" if c.isalpha() else c for c in word)
    for word in BOOL_WORDS) + ")$"}


def install(app: FastAPI) -> None:
    def schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version,
                                   description=app.description, routes=app.routes)
            app.openapi_schema = _never_null(_scoped_answer_403(_v1_answers_400(document)))
        return app.openapi_schema

    app.openapi = schema  # type: ignore[method-assign]  # FastAPI's way to extend it


def _v1_answers_400(document: dict[str, Any]) -> dict[str, Any]:
    error_ref = {"$ref": f"#/components/schemas/{ErrorBody.__name__}"}
    bad_request = responses(400)[400]
    for path, operations in document.get("paths", {}).items():
        if not path.startswith(V1_PREFIX):
            continue
        for operation in operations.values():
            answers = operation.get("responses", {})
            if answers.pop("422", None) is not None and "400" not in answers:
                answers["400"] = {"description": bad_request["description"],
                                  "content": {"application/json": {"schema": error_ref}}}
    return document


def _scoped_answer_403(document: dict[str, Any]) -> dict[str, Any]:
    """Every route that takes a key (it answers 401) may answer 403: a key whose scope is
    below the route's (api/scopes.py), in the same error shape as its 401."""
    forbidden = responses(403)[403]
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            answers = operation.get("responses", {})
            if "401" in answers and "403" not in answers:
                answers["403"] = {"description": forbidden["description"],
                                  "content": answers["401"].get("content", {})}
    return document


def _never_null(document: dict[str, Any]) -> dict[str, Any]:
    """Parameters and form fields: optional, never null."""
    schemas = document.get("components", {}).get("schemas", {})
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if "schema" in parameter:
                    parameter["schema"] = _bool_text(without_null(parameter["schema"]))
            rules = operation.pop(FORM_RULES, {})
            for media_type in FORMS:
                form = operation.get("requestBody", {}).get("content", {}).get(media_type)
                ref = (form or {}).get("schema", {}).get("$ref", "")
                body = schemas.get(ref.rpartition("/")[2], {})
                for name, field in body.get("properties", {}).items():
                    field = _bool_text(_as_file(without_null(field)))
                    optional = name not in [*body.get("required", []),
                                            *rules.get("dependentRequired", {})]
                    body["properties"][name] = _or_empty(field) if optional else field
                body.update(rules)
    return document


def _bool_text(field: dict[str, Any]) -> dict[str, Any]:
    if field.get("type") != "boolean":
        return field
    rest = {key: value for key, value in field.items() if key != "type"}
    return {**rest, "anyOf": [{"type": "boolean"}, BOOL_TEXT]}


def _or_empty(field: dict[str, Any]) -> dict[str, Any]:
    keywords = ("title", "description", "default")
    core = {key: value for key, value in field.items() if key not in keywords}
    return {**{key: field[key] for key in keywords if key in field},
            "anyOf": [core, {"const": ""}]}


def _as_file(field: dict[str, Any]) -> dict[str, Any]:
    if field.get("contentMediaType") == "application/octet-stream":
        return {**field, "format": "binary"}
    return field


def without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """`anyOf: [X, null]` (pydantic's `X | None`) as X, the keywords beside it kept."""
    options = schema.get("anyOf")
    if not options or NULL not in options:
        return schema
    rest = [option for option in options if option != NULL]
    merged = {key: value for key, value in schema.items()
              if key != "anyOf" and not (key == "default" and value is None)}
    if len(rest) == 1:
        return {**rest[0], **merged}
    return {**merged, "anyOf": rest}
