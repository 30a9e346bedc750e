"""Anthropic's Message Batches example, as its docs write it, run against quotaflow.

Nothing here names quotaflow: the official SDK reads ANTHROPIC_BASE_URL and
ANTHROPIC_API_KEY, so

    ANTHROPIC_BASE_URL=http://127.0.0.1:8000 ANTHROPIC_API_KEY=$QUOTAFLOW_API_KEY \
        python examples/message_batches.py

runs it on a quotaflow cluster whose deployments serve claude-sonnet-4-5
(tests/cluster/test_message_batches.py runs it so).
"""

import time

import anthropic
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from anthropic.types.messages.batch_create_params import Request

client = anthropic.Anthropic()

# Create a batch
message_batch = client.messages.batches.create(
    requests=[
        Request(
            custom_id="my-first-request",
            params=MessageCreateParamsNonStreaming(
                model="claude-sonnet-4-5",
                max_tokens=1024,
                messages=[{"role": "user", "content": "Hello, world"}],
            ),
        ),
        Request(
            custom_id="my-second-request",
            params=MessageCreateParamsNonStreaming(
                model="claude-sonnet-4-5",
                max_tokens=1024,
                messages=[{"role": "user", "content": "Hi again, friend"}],
            ),
        ),
    ]
)
print(f"created {message_batch.id} {message_batch.processing_status}")

# Poll until it has ended
while True:
    message_batch = client.messages.batches.retrieve(message_batch.id)
    if message_batch.processing_status == "ended":
        break
    print(f"Batch {message_batch.id} is still processing...")
    time.sleep(1)
print(f"ended {message_batch.request_counts.succeeded} succeeded")

# Stream the results, one request at a time
for result in client.messages.batches.results(message_batch.id):
    match result.result.type:
        case "succeeded":
            print(f"Success! {result.custom_id}: {result.result.message.content[0].text}")
        case "errored":
            if result.result.error.error.type == "invalid_request_error":
                print(f"Validation error {result.custom_id}")
            else:
                print(f"Server error {result.custom_id}")
        case "expired":
            print(f"Request expired {result.custom_id}")

# List the batches of the workspace, 20 to a page (the SDK follows the cursors)
listed = [batch.id for batch in client.messages.batches.list(limit=20)]
print(f"listed {message_batch.id in listed}")

# Cancel a batch, then delete it once it has ended
other = client.messages.batches.create(requests=[Request(
    custom_id="to-cancel", params=MessageCreateParamsNonStreaming(
        model="claude-sonnet-4-5", max_tokens=1024,
        messages=[{"role": "user", "content": "never mind"}]))])
canceled = client.messages.batches.cancel(other.id)
print(f"cancel {canceled.processing_status}")
while client.messages.batches.retrieve(other.id).processing_status != "ended":
    time.sleep(1)
deleted = client.messages.batches.delete(other.id)
print(f"deleted {deleted.type}")
