"""The OpenAPI schema says what the routes really answer.

Each route lists its error statuses itself (api.errors.responses). FastAPI adds a 422
to every route with parameters; under /v1 a parameter that does not validate is
OpenAI's 400 instead (api/errors.py), so there the 422 is taken out again.
"""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.errors import ErrorBody, responses

V1_PREFIX = "/v1/"


def install(app: FastAPI) -> None:
    def schema() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version,
                                   description=app.description, routes=app.routes)
            app.openapi_schema = _v1_answers_400(document)
        return app.openapi_schema

    app.openapi = schema  # type: ignore[method-assign]


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
