"""Unit tests: no server, no process of their own; `pytest -m "not cluster"` runs these."""
