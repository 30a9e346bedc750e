"""Ingest: the one pass that turns a JSONL file into a job (read, check, route, count, hash,
store), and the estimate that runs the same pass and stores nothing.
"""
