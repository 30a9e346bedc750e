"""Names shared by the API, the workers and the CLI, kept in one place.

The API enqueues tasks by name (it never imports workers/), so the task and
queue names here are the contract between the two.
"""

from typing import Final

QUEUE_REALTIME: Final = "realtime"
QUEUE_STANDARD: Final = "standard"
QUEUE_BULK: Final = "bulk"
QUEUES: Final = (QUEUE_REALTIME, QUEUE_STANDARD, QUEUE_BULK)
DEFAULT_QUEUE: Final = QUEUE_STANDARD
# Job statuses that end a job (models.JobStatus.FINAL, as the API reports them), for the
# clients that follow a job over HTTP without the models.
FINAL_STATUSES: Final = ("completed", "failed", "expired", "cancelled")

# A local deployment's batches go to queues of their own, consumed only by the workers
# that hold its model (`quotaflow worker --deployment NAME`): local.NAME.PRIORITY.
LOCAL_QUEUE_PREFIX: Final = "local"


def local_queue(deployment: str, priority: str) -> str:
    """The queue of a local deployment's batches of one priority class."""
    return f"{LOCAL_QUEUE_PREFIX}.{deployment}.{priority}"


TASK_PROCESS_BATCH: Final = "quotaflow.process_batch"

REDIS_PREFIX: Final = "quotaflow"

# The endpoints quotaflow accepts in a batch line, as OpenAI's Batch API names them
# (which deployments serve which: quotaflow/providers/capabilities.py).
ENDPOINT_RESPONSES: Final = "/v1/responses"
ENDPOINT_CHAT: Final = "/v1/chat/completions"
ENDPOINT_COMPLETIONS: Final = "/v1/completions"
ENDPOINT_EMBEDDINGS: Final = "/v1/embeddings"
ENDPOINT_MODERATIONS: Final = "/v1/moderations"
ENDPOINTS: Final = (ENDPOINT_RESPONSES, ENDPOINT_CHAT, ENDPOINT_COMPLETIONS, ENDPOINT_EMBEDDINGS,
                    ENDPOINT_MODERATIONS)
# Endpoints whose answers have no output tokens: nothing but the input is admitted.
INPUT_ONLY_ENDPOINTS: Final = frozenset({ENDPOINT_EMBEDDINGS, ENDPOINT_MODERATIONS})

# Anthropic's Messages API, where provider = "anthropic" deployments send every request.
ENDPOINT_MESSAGES: Final = "/v1/messages"
# The key of a stored request body that keeps an Anthropic-format line's own params
# (formats.py), so an anthropic deployment sends them as they were written.
ANTHROPIC_PARAMS: Final = "_anthropic_params"
# A job's output lines: OpenAI batch output lines, or Anthropic's Message Batches results.
OUTPUT_OPENAI: Final = "openai"
OUTPUT_ANTHROPIC: Final = "anthropic"
OUTPUT_FORMATS: Final = (OUTPUT_OPENAI, OUTPUT_ANTHROPIC)

MOCK_PROVIDER: Final = "mock"

# The tenant of embedded runs, auth-off development servers and pre-tenant jobs.
DEFAULT_TENANT: Final = "default"
