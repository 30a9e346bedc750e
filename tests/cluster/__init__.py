"""Cluster tests: the shared PostgreSQL or Redis, or processes they start (the `cluster`
marker, given by this folder)."""
