FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY quotaflow quotaflow
COPY api api
COPY workers workers
COPY cli cli
COPY migrations migrations
RUN pip install --no-cache-dir . && useradd --create-home quotaflow
USER quotaflow
CMD ["quotaflow", "--help"]
