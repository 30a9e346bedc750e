"""The providers' own Batch APIs (OpenAI's Batch API, Anthropic's Message Batches, Azure
OpenAI's Batch API), where a bulk job's lines cost about half what a call each costs.

A bulk job's lines whose route names a batch kind's deployment (BATCH_KINDS) are
not called by the executor: `enqueue.py` records them in PostgreSQL (`tables.py`) and
leaves their items `running` under no lease. Every worker's main process runs `loop.py`:
it groups queued lines of one job into provider batches within the provider's limits,
uploads each (`clients.py`), polls it, and stores each line's result through the same
store_many/Billing path a direct call takes (`collect.py`, `results.py`); lines the
provider failed or expired, or whose job's window would be missed, go back to the
queue for the route's realtime deployments.
"""

# The lease_owner of items waiting in a provider batch: no lease runs out (their
# lease_expires_at is NULL), so neither the reaper nor a claim takes them.
OWNER = "provider-batch"


