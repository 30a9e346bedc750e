FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY quotaflow quotaflow
COPY api api
COPY workers workers
COPY cli cli
COPY mock_provider mock_provider
COPY migrations migrations
# EXTRAS="[local]" adds torch and transformers for `provider = "local"` (compose: worker-gpu0).
ARG EXTRAS=""
RUN pip install --no-cache-dir ".${EXTRAS}" && useradd --create-home quotaflow
USER quotaflow
CMD ["quotaflow", "--help"]
