"""Pieces the answer models share: numbers kept as the domain wrote them, list pages."""

from typing import Annotated, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, WithJsonSchema

# An int or a float, sent as it was computed: validating `0` as a float would write `0.0`.
Number = Annotated[int | float, WithJsonSchema({"type": "number"})]

Item = TypeVar("Item")


class Answer(BaseModel):
    """A quotaflow object: the fields it always has, in the order they are written."""

    model_config = ConfigDict(extra="forbid")


class OpenAIList(BaseModel, Generic[Item]):
    """OpenAI's list page: `after` (the last id) asks for the next one."""

    object: Literal["list"]
    data: list[Item]
    first_id: str | None
    last_id: str | None
    has_more: bool


class AnthropicList(BaseModel, Generic[Item]):
    """Anthropic's list page: `after_id` pages towards older objects, `before_id` newer."""

    data: list[Item]
    has_more: bool
    first_id: str | None
    last_id: str | None


class Deleted(Answer):
    """A deleted object's id, as OpenAI answers a delete."""

    id: str
    object: str
    deleted: Literal[True]


class Health(Answer):
    status: Literal["ok"]
