# A worker for `engine = "vllm"` deployments (compose: worker-vllm, --profile vllm-engine):
# vLLM's own image (CUDA, torch and vLLM as its release pins them), with quotaflow and its
# dependencies installed around those pins, as docs/deployments/local.md does by hand.
ARG VLLM_VERSION=v0.32.0
FROM vllm/vllm-openai:${VLLM_VERSION}
WORKDIR /app
COPY pyproject.toml README.md ./
COPY quotaflow quotaflow
COPY api api
COPY workers workers
COPY cli cli
COPY mock_provider mock_provider
COPY migrations migrations
RUN python3 -m pip freeze | grep -iE '^(torch|transformers|tokenizers|numpy|vllm)==' > /tmp/held.txt \
    && python3 -m pip install --no-cache-dir -c /tmp/held.txt . \
    && useradd --create-home quotaflow
USER quotaflow
# The image's entry point is vLLM's server; this one runs the command given (a worker).
ENTRYPOINT []
CMD ["quotaflow", "--help"]
