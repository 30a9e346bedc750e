"""Benchmarks (`python -m bench.NAME`): tables measured on real processes.

They build their clusters, processes and data with the test harness, `tests.harness`
(the modules listed in tests/harness/__init__.py: `servers.recreate_database`,
`procs.Proc`, `limiter_cluster.LimiterCluster`, ...), the same code the tests assert
on, and never import a test module or tests/conftest.py.
"""
