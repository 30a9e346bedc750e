"""Celery workers: thin wrappers that hand each batch message to quotaflow.execution."""
