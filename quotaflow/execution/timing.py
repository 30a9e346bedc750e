"""The waits the parts of a batch run share: how long to back off, to sleep, to give way.

The admission loop (admission.py), the re-admission of retries (attempts.py) and the
fair-share hook (policies/fair_share_hook.py) wait by the same rules; each used to
import them from the other, so a policy depended on the loop it plugs into.
"""

from quotaflow.budget.limiter import sleep_time

# How long to wait before asking an unreachable limiter again.
LIMITER_DOWN_BACKOFF_S = 5.0
# The longest one sleep while no deployment is available or budget is short: circuits
# and blocks can end early (a probe succeeds), and a cancel must be noticed soon.
MAX_ROUTE_WAIT_S = 1.0
# A wait computed from the refill rate ignores refunds that other workers' calls
# will bring back sooner; where usage is reconciled, look again this often.
REFUND_POLL_S = 0.05
# A batch handing its items back so that another tenant's queued batch reaches a worker
# runs again after this long.
YIELD_S = 1.0


def poll_time(refunds_due: bool, wait_s: float) -> float:
    """How long to sleep before asking the limiter again: refunds may end a wait early."""
    pause = sleep_time(wait_s)
    return min(pause, REFUND_POLL_S) if refunds_due else pause
