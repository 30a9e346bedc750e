"""OpenAI's Batch object (openai.types.Batch) with quotaflow's fields, and its list page."""

import openai.types
from pydantic import Field

from api.schemas.common import OpenAIList


class Batch(openai.types.Batch):
    """openai.types.Batch, plus the queue it runs on and its output's retention."""

    # OpenAI's is always a str; a job made by POST /jobs has no file.
    input_file_id: str | None = Field(  # type: ignore[assignment]
        description="null for a job made by POST /jobs (from an upload, not a file)")

    queue: str = Field(description="quotaflow: realtime, standard or bulk")
    output_expires_at: int | None = Field(
        description="quotaflow: when the output and error files go (null: kept, or running)")
    deleted: bool = Field(description="quotaflow: whether the output and error files are gone")


class BatchList(OpenAIList[Batch]):
    """A page of the tenant's batches, newest first."""
