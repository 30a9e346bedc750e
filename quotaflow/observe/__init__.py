"""Observing quotaflow: logging, the workers' Prometheus metrics, the gauges read at scrape time,
and a job's HTML report.
"""
