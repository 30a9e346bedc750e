"""Prometheus's own checker, promtool, on quotaflow's monitoring files.

promtool is a short-lived checker that needs no server, so tests calling it stay unit
tests (`pytest -m "not cluster"`); scripts/test installs it (Debian's `prometheus`).
"""

import shutil
import subprocess

import pytest


def promtool(*args: str) -> str:
    """Run `promtool ARGS`; fail the test with its output when it fails."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool is not installed (scripts/test installs Debian's prometheus)")
    result = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{output}"
    return output
