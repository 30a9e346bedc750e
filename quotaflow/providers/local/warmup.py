"""A local engine's first requests, run at load rather than inside a job.

An engine answers its first requests slower than the rest: kernels are picked and
built for the shapes they meet (oneDNN on CPU, cuBLAS and attention on GPU), and
allocators and caches fill. Paid inside a job, that cost lands on its first lines and
on the progress line's rate and estimate. So each engine runs a few short requests
of several lengths as it loads, and the job begins on a warm engine.
"""

import logging
import time

from quotaflow.providers.local.requests import EMBED, GENERATE, Engine, GenerationRequest

log = logging.getLogger(__name__)

# Prompts of a few lengths, several at once: the shapes a job's first batch meets.
PROMPTS = ("Warm up.", "Warm up the engine before the first job arrives.",
           "Warm up the engine before the first job arrives: " + "a longer prompt " * 12)
COPIES = 3
MAX_NEW_TOKENS = 8


def warm_up(engine: Engine, name: str) -> float:
    """Run the warm-up requests on the engine; the seconds they took. A failure is
    logged and left to the first real request, which reports it as its own."""
    started = time.monotonic()
    try:
        if getattr(engine, "serves_embeddings", False):  # vLLM's pooling runner
            engine.run_batch(EMBED, [engine.text_ids(p) for p in PROMPTS * COPIES])
        else:
            engine.run_batch(GENERATE, [_request(engine, p) for p in PROMPTS * COPIES])
    except Exception as exc:  # a broken engine fails its first request, with its reason
        log.warning("%s: warm-up failed: %s", name, exc)
        return time.monotonic() - started
    took = time.monotonic() - started
    log.info("%s: engine warmed up in %.1f s (%d requests)", name, took,
             len(PROMPTS) * COPIES)
    return took


def _request(engine: Engine, prompt: str) -> GenerationRequest:
    try:
        ids = engine.chat_ids([{"role": "user", "content": prompt}])
    except Exception:  # a model without a chat template: the text as it is
        ids = engine.text_ids(prompt)
    return GenerationRequest(input_ids=ids, max_new_tokens=MAX_NEW_TOKENS, temperature=0.0,
                             top_p=1.0)
