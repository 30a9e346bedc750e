"""OpenAI's Batch API example, as its docs write it, run against quotaflow.

Nothing here names quotaflow: the official SDK reads OPENAI_BASE_URL and OPENAI_API_KEY,
so, with a batchinput.jsonl of /v1/chat/completions lines in the current directory,

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=$QUOTAFLOW_API_KEY \
        python examples/openai_batch.py

runs it on a quotaflow cluster (tests/cluster/test_message_batches.py runs it so).
"""

import time

from openai import OpenAI

client = OpenAI()

# Upload the batch input file
batch_input_file = client.files.create(file=open("batchinput.jsonl", "rb"),  # noqa: SIM115
                                       purpose="batch")

# Create the batch
batch_input_file_id = batch_input_file.id
batch = client.batches.create(
    input_file_id=batch_input_file_id,
    endpoint="/v1/chat/completions",
    completion_window="24h",
    metadata={"description": "nightly eval job"},
)

# Check its status until it is done
while batch.status not in ("completed", "failed", "expired", "cancelled"):
    time.sleep(1)
    batch = client.batches.retrieve(batch.id)
print(f"status {batch.status}")

# Retrieve the results
file_response = client.files.content(batch.output_file_id)
print(file_response.text)
