"""Webhooks: a tenant's endpoints hear when its jobs end, as Standard Webhooks.

    tables.py     endpoints, deliveries (the outbox) and their attempts, in PostgreSQL
    guard.py      where an endpoint may point: no loopback, private, link-local ... address
    signing.py    each endpoint's secret, derived from QUOTAFLOW_WEBHOOK_SECRET_KEY
    endpoints.py  register, list and remove endpoints; the deliveries they were sent
    outbox.py     the sweep (ended jobs -> deliveries), claims and retries
    sender.py     one attempt: a signed POST to the checked address, no redirects
    loop.py       a round of the delivery loop, which workers run in a thread

Nothing on a batch's path writes here: a job's end is noticed by the sweep, which reads
jobs in a final status that it has not yet notified (`jobs.notified_at`), however they
ended (the last batch, a cancel, the completion window, a refused file).
"""

# The events a job's end gives, by its final status (OpenAI's batch webhook events).
EVENT_BY_STATUS = {
    "completed": "batch.completed",
    "failed": "batch.failed",
    "expired": "batch.expired",
    "cancelled": "batch.cancelled",
}
EVENT_TYPES = tuple(EVENT_BY_STATUS.values())
