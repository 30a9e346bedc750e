"""Size-aware dispatch: a job's batches in the order that spends RPM and TPM together.

A job can never end sooner than max(requests / RPM, tokens / TPM): its lower bound.
Sent in line order, a file that clusters its short requests and its long ones (sorted
inputs are common) spends one limit while the other idles: the shorts exhaust RPM
with TPM to spare, then the longs exhaust TPM with RPM to spare, and the job takes
about the sum of the two phases instead of the larger.

Ingest knows every batch's requests and admission tokens before it queues them
(quotaflow/ingest/linescan.py), so it queues them in another order: batches are classed as
light or heavy against the job's own tokens per request (the boundary is learned
from the job's distribution, not configured), and the next batch is the next in line
order unless taking it would move the running tokens-per-request of what was queued
so far more than TOLERANCE away from the job's (a wider band while only a few batches
are queued, whose mix is noise); then it is the next of the other
class. Both classes advance together at the job's mix, so every moment of the run
asks both limits in the proportion the whole job does, and a line waits behind later
lines of the other class by at most its share of the job, never behind all of them.
A file already mixed (shuffled) keeps its line order, give or take a neighbour: no
batch drifts the mix for long.

Celery takes a queue's messages in order, so the order of dispatch is the order of
admission, within the few batches the workers run at once.
"""

from collections import deque
from collections.abc import Sequence

from quotaflow.dispatch.queues import BatchRef

# How far the queued mix may drift from the job's before the other class goes next.
TOLERANCE = 0.05


def mixed_order(batches: Sequence[BatchRef], loads: Sequence[tuple[int, int]],
                tolerance: float = TOLERANCE) -> list[BatchRef]:
    """The batches in dispatch order; `loads` are their (requests, admission tokens)."""
    if len(batches) != len(loads) or len(batches) < 3:
        return list(batches)
    requests = sum(r for r, _ in loads)
    tokens = sum(t for _, t in loads)
    if not requests or not tokens:
        return list(batches)
    ratio = tokens / requests
    light = deque(i for i, (r, t) in enumerate(loads) if t < ratio * r)
    heavy = deque(i for i, (r, t) in enumerate(loads) if t >= ratio * r)
    order: list[int] = []
    sent_r = sent_t = 0
    while light or heavy:
        if not light or not heavy:
            nxt = (light or heavy).popleft()
        else:
            first, other = (light, heavy) if light[0] < heavy[0] else (heavy, light)
            r, t = loads[first[0]]
            mix = (sent_t + t) / (sent_r + r) if sent_r + r else ratio
            # A few batches' mix is noise: the band narrows to `tolerance` as they add up.
            band = max(tolerance, 1 / (len(order) + 1))
            drifts = (mix > ratio * (1 + band) if first is heavy
                      else mix < ratio * (1 - band))
            nxt = (other if drifts else first).popleft()
        order.append(nxt)
        sent_r += loads[nxt][0]
        sent_t += loads[nxt][1]
    return [batches[i] for i in order]
