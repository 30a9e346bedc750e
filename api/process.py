"""What each process of `quotaflow api` serves: the app, logging in quotaflow's format.

`quotaflow api --workers N` starts every process afresh (cli/api_processes.py), and
uvicorn imports the app there, so
the log set-up the command made in its own process does not reach them: importing this
module makes it in each one. Nothing else is per process: keys, idempotency keys,
uploads and console sessions live in PostgreSQL, counts and budgets in Redis.
"""

import logging

from quotaflow.config import get_settings
from quotaflow.observe import logs

logs.configure(get_settings(), logging.INFO)

from api.app import app  # noqa: E402  (after the log set-up: its import may log)

__all__ = ["app"]
