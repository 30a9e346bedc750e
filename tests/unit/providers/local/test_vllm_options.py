"""A deployment's vLLM settings become vLLM's engine arguments, and what cannot run is
refused before loading; a request's queue becomes the engine's priority. vLLM-free."""

import asyncio
import os
import threading
from pathlib import Path

import pytest

from quotaflow.constants import QUEUE_BULK, QUEUE_REALTIME, QUEUE_STANDARD
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError
from quotaflow.providers.local.vllm_options import (
    check_device,
    check_model_path,
    engine_args,
    lower_children_priority,
)
from quotaflow.providers.priority import current_queue, engine_priority


def vllm(tmp_path: Path, **fields: object) -> Deployment:
    return Deployment(name="v", provider="local", engine="vllm", model="tiny",
                      model_path=str(tmp_path), rpm=10, tpm=1000, **fields)


def test_engine_options_pass_to_vllm(tmp_path: Path) -> None:
    args = engine_args(vllm(tmp_path, max_model_len=1024, gpu_memory_utilization=0.5,
                            tensor_parallel_size=2, dtype="bfloat16",
                            enable_prefix_caching=True, max_num_seqs=8,
                            scheduling_policy="fcfs", runner="pooling"))
    assert args == {"model": str(tmp_path), "served_model_name": "tiny", "dtype": "bfloat16",
                    "gpu_memory_utilization": 0.5, "tensor_parallel_size": 2,
                    "enforce_eager": False, "scheduling_policy": "fcfs", "runner": "pooling",
                    "disable_log_stats": True, "max_model_len": 1024,
                    "enable_prefix_caching": True, "max_num_seqs": 8}


def test_unset_options_are_left_to_vllm(tmp_path: Path) -> None:
    args = engine_args(vllm(tmp_path))
    assert args["scheduling_policy"] == "priority"
    assert not {"max_model_len", "enable_prefix_caching", "max_num_seqs"} & args.keys()


def test_a_directory_without_a_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds no model"):
        check_model_path(vllm(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    check_model_path(vllm(tmp_path))


@pytest.mark.parametrize(("device", "platform", "words"), [
    ("cuda", "cpu", "built for 'cpu'"),
    ("auto", "", "no device it can run on"),
    ("cuda:1", "cuda", "CUDA_VISIBLE_DEVICES"),
])
def test_a_device_the_build_cannot_use_is_refused(tmp_path: Path, device: str, platform: str,
                                                  words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        check_device(vllm(tmp_path, device=device), platform)


def test_devices_the_build_serves_pass(tmp_path: Path) -> None:
    check_device(vllm(tmp_path, device="auto"), "cpu")
    check_device(vllm(tmp_path, device="cuda"), "cuda")


def test_the_queue_is_the_priority_of_the_calls_it_starts() -> None:
    assert [engine_priority(q) for q in (QUEUE_REALTIME, QUEUE_STANDARD, QUEUE_BULK)] == [
        0, 1, 2]

    async def batch(queue: str) -> list[int]:
        current_queue.set(queue)  # what the executor does when a batch starts
        return await asyncio.gather(*(asyncio.to_thread(lambda: 0) for _ in range(1)),
                                    *(_read() for _ in range(3)))

    async def _read() -> int:
        await asyncio.sleep(0)
        return engine_priority()

    async def both() -> tuple[list[int], list[int]]:
        return await asyncio.gather(batch(QUEUE_REALTIME), batch(QUEUE_BULK))

    realtime, bulk = asyncio.run(both())
    assert realtime[1:] == [0, 0, 0] and bulk[1:] == [2, 2, 2]


def test_a_worker_without_vllm_is_told_how_to_get_it(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from quotaflow.providers.local import load_engine
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    monkeypatch.delitem(sys.modules, "quotaflow.providers.local.vllm_engine", raising=False)
    with pytest.raises(ConfigError, match="runs on vLLM, which this interpreter") as caught:
        load_engine(vllm(tmp_path))
    assert "pip install vllm" in str(caught.value) and sys.executable in str(caught.value)


def test_the_engine_processes_run_below_the_worker_and_the_worker_does_not() -> None:
    # Given a child process (as vLLM's engine core) with two threads, and the worker's
    # own priority
    worker_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    ready_r, ready_w = os.pipe()
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    if (pid := os.fork()) == 0:
        try:
            seen: list[int] = []
            thread = threading.Thread(target=lambda: (os.read(go_r, 1), seen.append(
                os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))))
            thread.start()
            os.write(ready_w, b"r")
            thread.join()
            main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            os.write(report_w, f"{main} {seen[0]}".encode())
        finally:
            os._exit(0)
    os.read(ready_r, 1)
    # When the worker lowers its children by 7
    lowered = lower_children_priority(7)
    os.write(go_w, b"g")
    child_main, child_thread = map(int, os.read(report_r, 64).split())
    os.waitpid(pid, 0)
    for fd in (ready_r, ready_w, report_r, report_w, go_r, go_w):
        os.close(fd)
    # Then both of the child's threads run 7 steps lower, and the worker's own do not
    expected = min(19, worker_nice + 7)
    assert lowered >= 2 and (child_main, child_thread) == (expected, expected)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == worker_nice
    assert lower_children_priority(0) == 0
