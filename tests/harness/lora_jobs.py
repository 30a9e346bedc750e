"""Jobs on a local deployment with two LoRA adapters, through a real worker: the proof
shared by the transformers and vLLM tests (tests/cluster/test_*_lora.py).

The model is the tiny Llama of vllm_server.py; its two adapters (tiny_lora.py) have
random weights of their own seeds. One job mixes lines of both adapters, of the base
model and of a model the deployment does not serve; two more jobs each hold one
adapter's lines alone. Greedy answers (temperature 0) of an adapter's lines must be
the same in the mixed job as alone, and differ from the other adapter's and the base
model's: each line ran with its own adapter, whatever it was batched with.
"""

import io
import json
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.dispatch.queues import PlacingDispatcher
from quotaflow.ingest import pipeline
from quotaflow.results import output
from tests.harness.cluster import job_status
from tests.harness.factories import jsonl
from tests.harness.procs import Proc
from tests.harness.servers import REDIS_URL
from tests.harness.tiny_lora import save_tiny_lora
from tests.harness.vllm_server import write_model
from workers.dispatch import CeleryDispatcher

BASE = "tiny"
ADAPTERS = ("support", "legal")
UNSERVED = "medical"
PROMPTS = tuple(f"question {i} about the tide" for i in range(4))
MAX_TOKENS = 8


def write_models(workdir: Path) -> tuple[Path, dict[str, Path]]:
    """The tiny Llama and its two adapters, each of its own seed."""
    base = write_model(workdir / "model")
    adapters = {name: save_tiny_lora(base, workdir / f"lora-{name}", seed=seed)
                for seed, name in enumerate(ADAPTERS, start=1)}
    return base, adapters


def deployments_toml(name: str, engine: str, base: Path, adapters: dict[str, Path],
                     extra: str = "") -> str:
    """The deployment, its adapters as an inline table, and a "*" route to it (so a line
    of a model it does not serve reaches it, and fails there)."""
    inline = ", ".join(f'{adapter} = "{path}"' for adapter, path in adapters.items())
    return (f'[deployments.{name}]\nprovider = "local"\nengine = "{engine}"\n'
            f'model = "{BASE}"\nmodel_path = "{base}"\nadapters = {{ {inline} }}\n'
            "rpm = 1000000\ntpm = 100000000\nmax_concurrency = 64\ndefault_temperature = 0\n"
            f'{extra}[routes]\n"*" = "{name}"\n')


@dataclass
class LoraRun:
    worker: Proc
    sessions: sessionmaker[Session]
    settings: Settings

    def submit(self, lines: list[dict]) -> str:
        deployments = self.settings.load_deployments()
        dispatcher = PlacingDispatcher(CeleryDispatcher(REDIS_URL), self.sessions, deployments)
        return pipeline.create_job_in_process(
            self.sessions, io.BytesIO(jsonl(lines)), settings=self.settings,
            deployments=deployments, dispatcher=dispatcher, queue="standard").id

    def wait(self, job_id: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while (status := job_status(self.sessions, job_id)) == "in_progress":
            assert time.monotonic() < deadline, self.worker.log()
            time.sleep(0.3)
        assert status == "completed", (status, self.worker.log())

    def rows(self, job_id: str, errors: bool = False) -> dict[str, dict]:
        with self.sessions() as session:
            return {row["custom_id"]: row for row in (
                json.loads(line) for line in output.iter_output(session, job_id, errors))}


def line(model: str, prompt: int) -> dict:
    return {"custom_id": f"{model}-{prompt}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": MAX_TOKENS,
                     "messages": [{"role": "user", "content": PROMPTS[prompt]}]}}


def texts(rows: dict[str, dict]) -> dict[str, str]:
    return {key: row["response"]["body"]["choices"][0]["message"]["content"]
            for key, row in rows.items()}


def run_mixed_and_alone(run: LoraRun) -> str:
    """The three jobs, and the checks above; returns the mixed job's id."""
    # Given one job mixing both adapters' lines with the base model's and an unserved one
    mixed_lines = [line(model, i) for i in range(len(PROMPTS))
                   for model in (*ADAPTERS, BASE)] + [line(UNSERVED, 0)]
    mixed = run.submit(mixed_lines)
    run.wait(mixed)
    # and each adapter's lines alone, in jobs of their own
    alone = {}
    for adapter in ADAPTERS:
        job = run.submit([line(adapter, i) for i in range(len(PROMPTS))])
        run.wait(job)
        alone[adapter] = texts(run.rows(job))
    answered = run.rows(mixed)
    together = texts(answered)
    # Then each answer names the model its line asked for
    assert all(row["response"]["body"]["model"] == key.rsplit("-", 1)[0]
               for key, row in answered.items()), answered
    for i in range(len(PROMPTS)):
        ours = {model: together[f"{model}-{i}"] for model in (*ADAPTERS, BASE)}
        # each adapter's answer is the one it gives alone: its own adapter ran it
        for adapter in ADAPTERS:
            assert ours[adapter] == alone[adapter][f"{adapter}-{i}"], (i, ours, alone)
        # and the adapters' answers differ from each other's and from the base model's
        assert len(set(ours.values())) == 3, (i, ours)
    # And the line of a model the deployment does not serve failed, naming it
    (failed,) = run.rows(mixed, errors=True).values()
    assert failed["custom_id"] == f"{UNSERVED}-0"
    assert failed["response"]["status_code"] == 400, failed
    assert f"does not serve model '{UNSERVED}'" in failed["error"]["message"], failed
    return mixed
